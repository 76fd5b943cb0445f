"""``tlql ql-evaluate``: the Query Lens paper's Table-1 protocol on features of FF-KV and/or SAELens dictionaries
(one summary per dictionary family, side by side), logged to W&B."""

from __future__ import annotations

import argparse
import logging

from tl_query_lens.cli import add_common_args
from tl_query_lens.cli.dictionaries import add_dictionary_arg

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ql-evaluate", help="Table-1 input/output scores of Query Lens signatures")
    add_common_args(parser, out="results/ql_eval")
    add_dictionary_arg(parser)
    add_evaluate_args(parser)
    parser.set_defaults(func=run)


def add_evaluate_args(parser: argparse.ArgumentParser) -> None:
    """Options of the Table-1 protocol (shared with ``tlql query-lens --evaluate``)."""
    parser.add_argument("--layers", default="6,12,18,24", help="FF-KV layers, e.g. '6,12' or '0-29'")
    parser.add_argument("--features-per-layer", type=int, default=13, help="seeded random sample per dictionary")
    parser.add_argument(
        "--feature-selection",
        choices=("auto", "uniform", "active"),
        default="auto",
        help="what the sample is drawn from: 'uniform' (every feature), 'active' (features firing in ≥ "
        "--n-contexts evaluation sequences), 'auto' (uniform for FF-KV, active for SAEs)",
    )
    parser.add_argument("--features", default=None, help="explicit feature ids per layer, e.g. '0-24' (no sampling)")
    parser.add_argument(
        "--exclude-first-positions",
        type=int,
        default=0,
        help="leading positions left out of the max-activating search (1 for the tlql-saes residual SAEs, "
        "trained without position 0)",
    )
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
    parser.add_argument(
        "--protocol",
        choices=("per-target", "paper"),
        default="per-target",
        help="'per-target' (this project's) or 'paper' (the authors' code: one S over both KL targets, "
        "generated positions, integer α in [1, 1000], TC at 10, ▁/Ġ/Ċ-only normalisation)",
    )
    parser.add_argument(
        "--up-key",
        action="store_true",
        help="also score the authors' SwiGLU key (up-projection column at hook_resid_mid, no ln2 "
        "Jacobian) as LL_KEY_UP / QL_KEY_UP beside the gate-through-norm LL_KEY / QL_KEY",
    )
    parser.add_argument("--cache-dir", default=None, help="operator cache (default: <out>/operators)")


def run(args: argparse.Namespace) -> int:
    return run_table1(
        args,
        layers=args.layers,
        features=args.features,
        k=args.k,
        op_seqs=args.op_seqs,
        op_seq_len=args.op_seq_len,
        features_per_layer=args.features_per_layer,
        feature_selection=args.feature_selection,
        exclude_first_positions=args.exclude_first_positions,
        dictionary=args.dictionary,
        n_seqs=args.n_seqs,
        seq_len=args.seq_len,
        n_contexts=args.n_contexts,
        kl_targets=tuple(float(x) for x in args.kl_targets.split(",")),
        n_generate=args.n_generate,
        n_prompts=args.n_prompts,
        temperature=args.temperature,
        n_steps=args.n_steps,
        protocol=args.protocol,
        up_key=args.up_key,
    )


def run_table1(
    args: argparse.Namespace, *, layers: str, features: str | None, k: int, op_seqs: int, op_seq_len: int, **protocol
) -> int:
    """Build the :class:`Table1Config` from the parsed options, call :func:`evaluate_table1`, save and log.

    ``tlql query-lens --evaluate`` passes its own layers / features / k / corpus options and keeps the protocol's
    defaults (``protocol`` holds the ``ql-evaluate``-only options when given: ``dictionary``, ``n_seqs``, ...).
    """
    from pathlib import Path

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.cli.dictionaries import load_dictionaries, parse_dictionaries
    from tl_query_lens.cli.validate import parse_features
    from tl_query_lens.query_lens.steering import NEUTRAL_PROMPTS
    from tl_query_lens.query_lens.table1 import PAPER_GPT2, Table1Config, evaluate_table1
    from tl_query_lens.tracking import Tracker

    defaults = {"features_per_layer": 13, "n_seqs": 512, "seq_len": 32, "n_prompts": 4, "dictionary": None}
    protocol = {**defaults, **protocol}
    model = load_model(args.model, device=args.device)
    loaded = load_dictionaries(parse_dictionaries(protocol["dictionary"]), model, layers)
    out = Path(args.out)
    saes = {d.label: d.sae for d in loaded}
    ids = None
    if features:  # validated against every dictionary before any operator is computed
        d_sae = min(int(sae.cfg.d_sae) for sae in saes.values())
        ids = parse_features(features, d_sae)
        ids = tuple(range(d_sae)) if ids is None else tuple(ids)
    options = {
        key: protocol[key]
        for key in (
            "n_contexts",
            "kl_targets",
            "n_generate",
            "temperature",
            "n_steps",
            "protocol",
            "feature_selection",
            "exclude_first_positions",
        )
        if key in protocol
    }
    cfg = Table1Config(
        k=k,
        features_per_layer=protocol["features_per_layer"],
        features=ids,
        seed=args.seed,
        prompts=NEUTRAL_PROMPTS[: protocol["n_prompts"]],
        cache_dir=str(args.cache_dir or out / "operators"),
        up_key=protocol.get("up_key", False),
        **options,
    )
    op_tokens = load_corpus(args.corpus, model, n_seqs=op_seqs, seq_len=op_seq_len, split="train", seed=args.seed)
    ev_tokens = load_corpus(
        args.corpus, model, n_seqs=protocol["n_seqs"], seq_len=protocol["seq_len"], split="evaluation", seed=args.seed
    )
    result = evaluate_table1(model, saes, op_tokens, ev_tokens, cfg=cfg)
    result.save(out / "all")
    groups = {d.group: [e.label for e in loaded if e.group == d.group] for d in loaded}
    summaries = {group: result.select(labels).summary(seed=args.seed) for group, labels in groups.items()}
    seconds = result.config["seconds"]
    config = {key: v for key, v in vars(args).items() if key != "func"}
    with Tracker(out, project=args.wandb_project, name="ql-evaluate", config=config, use_wandb=args.wandb) as tracker:
        first = next(iter(summaries.values()))
        columns = ["dictionary", *first[0], "paper_input", "paper_output"]
        table = [
            [group, *r.values(), *PAPER_GPT2.get(r["method"], (None, None))]
            for group, rows in summaries.items()
            for r in rows
        ]
        path = tracker.log_table("table1", columns, table)
        tracker.log_table("per_feature", *result.per_feature_table())
        tracker.log_scalars("timing", seconds)
        tracker.log_scalars(
            "steering",
            {"mean_alpha@" + f"{t:g}": result.alphas[i].mean().item() for i, t in enumerate(result.kl_targets)}
            | {
                "mean_achieved_kl@" + f"{t:g}": result.achieved_kl[i].mean().item()
                for i, t in enumerate(result.kl_targets)
            },
        )
        tracker.log_artifact("ql_eval", [out / "all"])
    print(f"Table 1 ({result.features.numel()} features of {list(saes)}): {path}")
    for group, rows in summaries.items():
        labels = groups[group]
        print(f"\n{group} ({rows[0]['n_features']} features of {len(labels)} dictionaries: {', '.join(labels)})")
        print(result.format_summary(rows, PAPER_GPT2))
    print(f"total {seconds['total_s']:.0f} s (operators {seconds['operators_s']:.0f} s)")
    return 0
