"""``tlql ql-evaluate``: the Query Lens paper's Table-1 protocol on FF-KV features of chosen layers, logged to W&B."""

from __future__ import annotations

import argparse
import logging
import time

from tl_query_lens.cli import add_common_args, parse_layers

logger = logging.getLogger(__name__)

# Input% / Output% of the paper (GPT-2 small), for the side-by-side table.
PAPER_GPT2 = {"LL_KEY": (7.84, 4.32), "LL_VALUE": (11.74, 12.57), "QL_KEY": (39.32, 1.97), "QL_VALUE": (26.43, 15.24)}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ql-evaluate", help="Table-1 input/output scores of Query Lens signatures")
    add_common_args(parser, out="results/ql_eval")
    add_evaluate_args(parser)
    parser.set_defaults(func=run)


def add_evaluate_args(parser: argparse.ArgumentParser) -> None:
    """Options of the Table-1 protocol (shared with ``tlql query-lens --evaluate``)."""
    parser.add_argument("--layers", default="6,12,18,24", help="FF-KV layers, e.g. '6,12' or '0-29'")
    parser.add_argument("--features-per-layer", type=int, default=13, help="seeded random sample per layer")
    parser.add_argument("--features", default=None, help="explicit feature ids per layer, e.g. '0-24' (no sampling)")
    parser.add_argument("--k", type=int, default=25, help="signature size")
    parser.add_argument("--op-seqs", type=int, default=2, help="operator corpus: sequences (train split)")
    parser.add_argument("--op-seq-len", type=int, default=32)
    parser.add_argument("--n-seqs", type=int, default=512, help="max-activating corpus: sequences (evaluation split)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--n-contexts", type=int, default=20)
    parser.add_argument("--kl-targets", default="0.25,0.5")
    parser.add_argument("--n-generate", type=int, default=20)
    parser.add_argument("--n-prompts", type=int, default=4, help="neutral prompts used (of a fixed list)")
    parser.add_argument("--temperature", type=float, default=0.75)
    parser.add_argument("--n-steps", type=int, default=8, help="α bisection steps")
    parser.add_argument("--protocol", choices=("per-target", "paper"), default="per-target",
                        help="'per-target' (this project's) or 'paper' (the authors' code: one S over both KL targets, "
                             "generated positions, integer α in [1, 1000], TC at 10, ▁/Ġ/Ċ-only normalisation)")
    parser.add_argument("--up-key", action="store_true",
                        help="also score the authors' SwiGLU key (up-projection column at hook_resid_mid, no ln2 "
                             "Jacobian) as LL_KEY_UP / QL_KEY_UP beside the gate-through-norm LL_KEY / QL_KEY")
    parser.add_argument("--cache-dir", default=None, help="operator cache (default: <out>/operators)")


def run_from_query_lens_args(args: argparse.Namespace) -> int:
    """``tlql query-lens --evaluate``: its layers, features, k, corpus and cache options, protocol defaults otherwise."""
    from tl_query_lens.cli import build_parser

    argv = ["ql-evaluate", "--model", args.model, "--corpus", args.corpus, "--seed", str(args.seed),
            "--layers", args.layers, "--features", args.features, "--k", str(args.k), "--op-seqs", str(args.n_seqs),
            "--op-seq-len", str(args.seq_len), "--out", str(args.out), "--wandb-project", args.wandb_project]
    argv += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    argv += ["--device", args.device] if args.device else []
    argv += [] if args.wandb else ["--no-wandb"]
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from tl_query_lens import FFKV, load_corpus, load_model
    from tl_query_lens.cli.validate import parse_features
    from tl_query_lens.query_lens import QueryLens
    from tl_query_lens.query_lens.evaluation import SignatureEvaluation, evaluate_signatures
    from tl_query_lens.query_lens.max_activating import max_activating_contexts
    from tl_query_lens.query_lens.steering import NEUTRAL_PROMPTS
    from tl_query_lens.tracking import Tracker

    start = time.time()
    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    feature_ids = parse_features(args.features, model.cfg.d_mlp) if args.features else None  # before operators
    out = Path(args.out)
    op_tokens = load_corpus(args.corpus, model, n_seqs=args.op_seqs, seq_len=args.op_seq_len, split="train",
                            seed=args.seed)
    ev_tokens = load_corpus(args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation",
                            seed=args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    lens = QueryLens(model, op_tokens, cache_dir=args.cache_dir or out / "operators")
    lens.precompute(value_hooks=[f"blocks.{layer}.hook_resid_post" for layer in layers],
                    key_hooks=[f"blocks.{layer}.ln2.hook_normalized" for layer in layers]
                    + ([f"blocks.{layer}.hook_resid_mid" for layer in layers] if args.up_key else []),
                    module_layers=range(min(layers) + 1, model.cfg.n_layers))
    timings = {"operators_s": time.time() - start}
    options = dict(n_contexts=args.n_contexts, kl_targets=tuple(float(x) for x in args.kl_targets.split(",")),
                   n_generate=args.n_generate, temperature=args.temperature, seed=args.seed,
                   prompts=NEUTRAL_PROMPTS[: args.n_prompts], n_steps=args.n_steps, protocol=args.protocol)
    parts = []
    for layer in layers:
        sae = FFKV.from_model(model, layer)
        if args.features:
            features = torch.arange(sae.cfg.d_sae) if feature_ids is None else torch.tensor(feature_ids)
        else:
            features = torch.randperm(sae.cfg.d_sae, generator=gen)[: args.features_per_layer].sort().values
        methods = {
            "LL_KEY": lens.key_signatures(sae, features, k=args.k, method="logit_lens").top_ids,
            "LL_VALUE": lens.value_signatures(sae, features, k=args.k, method="logit_lens").top_ids,
            "QL_KEY": lens.key_signatures(sae, features, k=args.k, method="full").top_ids,
            "QL_VALUE": lens.value_signatures(sae, features, k=args.k, method="full").top_ids,
            "QL_VALUE_1st": lens.value_signatures(sae, features, k=args.k, method="first_order").top_ids,
        }
        if args.up_key:
            from tl_query_lens.dictionaries.key_value import as_key_value
            from tl_query_lens.query_lens.paper_protocol import up_projection_key_view

            up = up_projection_key_view(as_key_value(sae, model), model)
            methods["LL_KEY_UP"] = lens.key_signatures(up, features, k=args.k, method="logit_lens").top_ids
            methods["QL_KEY_UP"] = lens.key_signatures(up, features, k=args.k, method="full").top_ids
        contexts = max_activating_contexts(model, sae, ev_tokens, n_contexts=args.n_contexts)
        part = evaluate_signatures(model, sae, ev_tokens, methods, features, contexts=contexts, **options)
        part.save(out / f"layer{layer}")
        parts.append(part)
        logger.info("layer %d done after %.0f s", layer, time.time() - start)
    result = SignatureEvaluation.concat(parts)
    result.save(out / "all")
    timings["total_s"] = time.time() - start
    rows = result.summary(seed=args.seed)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(out, project=args.wandb_project, name="ql-evaluate", config=config, use_wandb=args.wandb) as tracker:
        columns = list(rows[0]) + ["paper_input", "paper_output"]
        table = [[*r.values(), *PAPER_GPT2.get(r["method"], (None, None))] for r in rows]
        path = tracker.log_table("table1", columns, table)
        tracker.log_table("per_feature", *_per_feature(result))
        tracker.log_scalars("timing", timings)
        tracker.log_scalars("steering", {"mean_alpha@" + f"{t:g}": result.alphas[i].mean().item()
                                         for i, t in enumerate(result.kl_targets)}
                            | {"mean_achieved_kl@" + f"{t:g}": result.achieved_kl[i].mean().item()
                               for i, t in enumerate(result.kl_targets)})
        tracker.log_artifact("ql_eval", [out / "all"])
    print(f"Table 1 ({result.features.numel()} features, layers {layers}): {path}")
    print(format_table(rows))
    print(f"total {timings['total_s']:.0f} s (operators {timings['operators_s']:.0f} s)")
    return 0


def _per_feature(result) -> tuple[list[str], list[list]]:
    columns = ["layer", "feature"] + [f"alpha@{t:g}" for t in result.kl_targets] + \
        [f"kl@{t:g}" for t in result.kl_targets]
    for m in result.methods:
        columns += [f"{m}_input"] + [f"{m}_output@{t:g}" for t in result.kl_targets]
    rows = []
    for j in range(result.features.numel()):
        row = [int(result.layers[j]), int(result.features[j])]
        row += [float(result.alphas[t, j]) for t in range(len(result.kl_targets))]
        row += [float(result.achieved_kl[t, j]) for t in range(len(result.kl_targets))]
        for m in range(len(result.methods)):
            row += [float(result.input_scores[m, j])]
            row += [float(result.output_scores[m, t, j]) for t in range(len(result.kl_targets))]
        rows.append(row)
    return columns, rows


def format_table(rows: list[dict]) -> str:
    """Markdown table: mean [95% CI] in percent per method, with the paper's GPT-2 numbers beside."""
    outs = [k for k in rows[0] if k.startswith("output@") and not k.endswith(("_lo", "_hi"))]
    head = "| method | Input % | " + " | ".join(f"Output % (KL {k[7:]})" for k in outs) + " | paper Input/Output |"
    lines = [head, "|" + "---|" * (3 + len(outs))]
    for r in rows:
        cell = lambda key: f"{r[key]:.2f} [{r[key + '_lo']:.2f}, {r[key + '_hi']:.2f}]"
        paper = PAPER_GPT2.get(r["method"])
        lines.append(f"| {r['method']} | {cell('input')} | " + " | ".join(cell(k) for k in outs)
                     + f" | {f'{paper[0]} / {paper[1]}' if paper else '—'} |")
    return "\n".join(lines)
