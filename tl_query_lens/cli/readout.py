"""``tlql readout fit | decompose | eval``: readout SAEs (Sparse Readout Prism, DESIGN §6) from the command line."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from tl_query_lens.cli import add_common_args
from tl_query_lens.errors import InputError

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("readout", help="readout SAEs: fit, decompose a score, evaluate against baselines")
    actions = parser.add_subparsers(dest="readout_command", metavar="ACTION", required=True)

    fit = actions.add_parser("fit", help="fit a readout SAE to the model's LM head and cache it")
    add_common_args(fit, out="results/readout/fit")
    fit.add_argument(
        "--preset", choices=["small", "paper"], default="small", help="'paper': 32×d, k=256, 20k steps (GPU)"
    )
    fit.add_argument("--sae-id", default=None, help="name in the release (default: the preset)")
    fit.add_argument("--width", type=int, default=None)
    fit.add_argument("--k", type=int, default=None)
    fit.add_argument("--steps", type=int, default=None)
    fit.add_argument("--max-seconds", type=float, default=None, help="stop early after this wall time")
    fit.add_argument("--n-seqs", type=int, default=None, help="corpus sequences (train split) for the state bank")
    fit.add_argument("--seq-len", type=int, default=None)
    fit.add_argument(
        "--save", default=None, help="folder to save to (default: the user cache, used by from_pretrained)"
    )
    fit.set_defaults(func=run_fit)

    dec = actions.add_parser("decompose", help="decompose one score of one prompt into readout features")
    add_common_args(dec, out="results/readout/decompose")
    dec.add_argument("prompt", help="text; the state is read at --position")
    dec.add_argument("--sae-id", default="small")
    dec.add_argument("--sae-path", default=None, help="a saved readout SAE folder instead of the release")
    dec.add_argument("--hook", default=None, help="residual hook (default: the last block's hook_resid_post)")
    dec.add_argument("--position", type=int, default=-1)
    family = dec.add_mutually_exclusive_group()
    family.add_argument("--token", help="token logit of this token (string)")
    family.add_argument("--margin", nargs=2, metavar=("POS", "NEG"), help="logit difference POS − NEG")
    family.add_argument("--group", nargs="+", help="group-mean logit of these tokens")
    family.add_argument("--vocab-contrast", help="this token's logit minus the vocabulary mean")
    dec.add_argument("--top", type=int, default=10)
    dec.set_defaults(func=run_decompose)

    ev = actions.add_parser("eval", help="diagnostics and row-geometry baselines on held-out states")
    add_common_args(ev, out="results/readout/eval")
    ev.add_argument("--sae-id", default="small")
    ev.add_argument("--sae-path", default=None)
    ev.add_argument("--n-seqs", type=int, default=32)
    ev.add_argument("--seq-len", type=int, default=17)
    ev.add_argument(
        "--baselines",
        default=None,
        help="comma list (default: the protocol's own set, cheapest first); '' for none. 'paper' also takes "
        "this project's variants by name (nearest_row_ridge, knn_basis, kmeans_ridge_small, kmeans_ridge_full)",
    )
    ev.add_argument(
        "--protocol",
        choices=("mixed-layers", "paper"),
        default="mixed-layers",
        help="'mixed-layers' (this project's: logit-lens states of 4 layers, 3 contrast families, "
        "baselines) or 'paper' (the authors': final-layer states, top-1 vs top-2 / vocabulary mean, "
        "ρ₀, through-origin ablation R² over top-10 of covered contrasts, the authors' baselines: neighbours "
        "without the contrast tokens, k-means by |cos|)",
    )
    ev.set_defaults(func=run_eval)


def _load_sae(args):
    from sae_lens import SAE

    from tl_query_lens.dictionaries.saved import load_sae
    from tl_query_lens.readout.registry import release_name

    if args.sae_path:
        return load_sae(args.sae_path)
    return SAE.from_pretrained(release_name(args.model), args.sae_id)


def _token_id(model, text: str) -> int:
    ids = model.to_tokens(text, prepend_bos=False)[0].tolist()
    if len(ids) != 1:
        raise InputError(f"{text!r} is {len(ids)} tokens ({ids}); give a single token (mind the leading space).")
    return ids[0]


def run_fit(args: argparse.Namespace) -> int:
    from tl_query_lens import load_model
    from tl_query_lens.readout.fit import ReadoutFitConfig, fit_readout
    from tl_query_lens.readout.registry import cached_sae_path
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    options = ("width", "k", "steps", "max_seconds", "n_seqs", "seq_len")
    overrides = {k: getattr(args, k) for k in options if getattr(args, k) is not None}
    cfg = ReadoutFitConfig.preset(args.preset, corpus=args.corpus, seed=args.seed, **overrides)
    fit = fit_readout(model, cfg=cfg)
    fit.save(args.out)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(
        args.out, project=args.wandb_project, name="readout-fit", config=config, use_wandb=args.wandb
    ) as tracker:
        for record in fit.history:
            tracker.log_scalars("train", record, step=int(record["step"]))
        tracker.log_scalars("final", fit.final)
        if fit.history:
            tracker.log_table("train_history", list(fit.history[0]), [list(r.values()) for r in fit.history])
    target = Path(args.save) if args.save else cached_sae_path(args.model, fit.cache_id(args.sae_id or args.preset))
    fit.sae.save_model(target)
    print(f"Readout SAE saved to {target} ({fit.seconds:.0f} s): " + json.dumps(fit.final))
    return 0


def run_decompose(args: argparse.Namespace) -> int:
    import torch

    from tl_query_lens import load_model
    from tl_query_lens.hooks import check_hook
    from tl_query_lens.readout import (
        decompose,
        group_mean,
        margin,
        token_logit,
        top1_vs_competitor,
        vocab_mean_contrast,
    )
    from tl_query_lens.readout.states import logit_lens

    model = load_model(args.model, device=args.device)
    sae = _load_sae(args)
    hook = check_hook(model, args.hook or f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    n_tokens = model.to_tokens(args.prompt).shape[1]
    if not -n_tokens <= args.position < n_tokens:
        raise InputError(
            f"--position {args.position} is outside the prompt's {n_tokens} tokens; "
            f"use 0..{n_tokens - 1} or -1 for the last."
        )
    with torch.no_grad():
        _, cache = model.run_with_cache(args.prompt, names_filter=[hook])
        h = logit_lens(model)(cache[hook][0, args.position]).float()
    V = model.cfg.d_vocab
    if args.token:
        alpha, what = token_logit(_token_id(model, args.token), V), f"logit {args.token!r}"
    elif args.margin:
        alpha, what = (
            margin(_token_id(model, args.margin[0]), _token_id(model, args.margin[1]), V),
            f"margin {args.margin[0]!r} − {args.margin[1]!r}",
        )
    elif args.group:
        alpha, what = group_mean([_token_id(model, t) for t in args.group], V), f"group mean {args.group}"
    elif args.vocab_contrast:
        alpha, what = (
            vocab_mean_contrast(_token_id(model, args.vocab_contrast), V),
            f"{args.vocab_contrast!r} − vocabulary mean",
        )
    else:
        alpha, top1, comp = top1_vs_competitor(h, model)
        what = f"top-1 {model.to_string([top1])!r} − runner-up {model.to_string([comp])!r}"
    dec = decompose(sae, h, alpha, model=model, n_top=args.top)
    dec.save(args.out)
    print(
        f"{what} at {hook}[{args.position}]: exact {dec.exact.item():.4f} = bias {dec.bias.item():.4f} "
        f"+ Σc {dec.contributions.sum().item():.4f} + residual {dec.residual.item():.4f}"
    )
    for row in dec.top_features:
        print(
            f"  feature {row['feature']:>6}  c = {row['contribution']:+.4f}  (β {row['beta']:+.3f}, "
            f"p {row['projection']:+.3f})  {row['label']}"
        )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.readout import collect_states
    from tl_query_lens.readout.evaluate import ReadoutEvalConfig, evaluate_readout
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    sae = _load_sae(args)
    tokens = load_corpus(
        args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation", seed=args.seed
    )
    if args.protocol == "paper":
        return _run_eval_paper(args, model, sae, tokens)
    cfg = (
        ReadoutEvalConfig()
        if args.baselines is None
        else ReadoutEvalConfig(baselines=tuple(b for b in args.baselines.split(",") if b))
    )
    report = evaluate_readout(model, sae, collect_states(model, tokens), cfg=cfg)
    report.save(args.out)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(
        args.out, project=args.wandb_project, name="readout-eval", config=config, use_wandb=args.wandb
    ) as tracker:
        for res in [report.srp, *report.baselines.values()]:
            scalars = {k: v for k, v in asdict(res).items() if isinstance(v, float)}
            tracker.log_scalars("srp" if res.method == "srp" else f"baseline_{res.method}", scalars)
        if report.ablation is not None:
            tracker.log_scalars("ablation", asdict(report.ablation))
        tracker.log_table("readout_vs_baselines", *report.table())
    cols, rows = report.table()
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    if report.ablation is not None:
        print("ablation: " + json.dumps(asdict(report.ablation)))
    return 0


def _run_eval_paper(args: argparse.Namespace, model, sae, tokens) -> int:
    """``readout eval --protocol paper``: final-layer LM-head inputs, the authors' pool and ablation fit."""
    from tl_query_lens.readout import collect_states
    from tl_query_lens.readout.diagnostics_paper import readout_diagnostics_paper
    from tl_query_lens.tracking import Tracker

    states = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    options = {"seed": args.seed}
    if args.baselines is not None:
        options["baselines"] = tuple(b for b in args.baselines.split(",") if b)
    result = readout_diagnostics_paper(model, sae, states, **options)
    result.save(Path(args.out) / "protocol_paper")
    scalars = {k: v for k, v in vars(result).items() if isinstance(v, (int, float))}
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(
        args.out, project=args.wandb_project, name="readout-eval-paper", config=config, use_wandb=args.wandb
    ) as tracker:
        tracker.log_scalars("readout_paper_protocol", scalars)
        tracker.log_scalars("readout_paper_protocol_baselines", result.coverage_baselines)
    print(
        json.dumps(
            {
                **scalars,
                "coverage_ci": result.coverage_ci,
                "by_family": result.coverage_by_family,
                "best_baseline": result.best_baseline,
                "coverage_baselines": result.coverage_baselines,
                "coverage_baselines_ci": result.coverage_baselines_ci,
                "coverage_baselines_by_family": result.coverage_baselines_by_family,
            }
        )
    )
    return 0
