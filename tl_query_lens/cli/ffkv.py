"""``tlql ffkv``: FF-KV dictionaries of chosen layers, summarised on the corpus and logged to W&B."""

from __future__ import annotations

import argparse
import logging

from tl_query_lens.cli import add_common_args, parse_layers

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ffkv", help="summarise FF-KV dictionaries (alive rate, L0, EV, CE change)")
    add_common_args(parser, out="results/ffkv")
    parser.add_argument("--layers", default="0,6,12,18,24,29", help="e.g. '3,5' or '0-29' or 'all'")
    parser.add_argument("--k", type=int, default=64, help="TopK size for the sparse splice")
    parser.add_argument("--n-seqs", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--save-dictionaries", action="store_true", help="save each FF-KV SAE in SAELens format")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens import FFKV, load_corpus, load_model
    from tl_query_lens.dictionaries.splice import FFKVSummary, FFKVSummaryConfig, ffkv_summary
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    tokens = load_corpus(
        args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation", seed=args.seed
    )
    out = Path(args.out)
    summary = ffkv_summary(model, layers, tokens, cfg=FFKVSummaryConfig(k=args.k))
    summary.save(out)
    if args.save_dictionaries:
        for layer in layers:
            FFKV.from_model(model, layer, "topk", k=args.k).save_model(out / f"layer{layer}" / "sae")
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(out, project=args.wandb_project, name="ffkv", config=config, use_wandb=args.wandb) as tracker:
        table = tracker.log_table("ffkv_summary", list(FFKVSummary.COLUMNS), summary.rows())
    print(f"FF-KV summary: {table}")
    for row in summary.rows():
        print(
            "  "
            + ", ".join(
                f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(FFKVSummary.COLUMNS, row)
            )
        )
    return 0
