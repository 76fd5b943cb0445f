"""``tlql ffkv``: FF-KV dictionaries of chosen layers, summarised on the corpus and logged to W&B."""

from __future__ import annotations

import argparse
import logging

from tqdm import tqdm

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
    from tl_query_lens.dictionaries.splice import splice_metrics
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    tokens = load_corpus(args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation",
                         seed=args.seed)
    out = Path(args.out)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    rows = []
    with Tracker(out, project=args.wandb_project, name="ffkv", config=config, use_wandb=args.wandb) as tracker:
        for layer in tqdm(layers, desc="FF-KV layers"):
            vanilla = FFKV.from_model(model, layer, "vanilla")
            topk = FFKV.from_model(model, layer, "topk", k=args.k)
            dense = splice_metrics(model, vanilla, tokens)
            sparse = splice_metrics(model, topk, tokens)
            sparse.save(out / f"layer{layer}")
            if args.save_dictionaries:
                topk.save_model(out / f"layer{layer}" / "sae")
            rows.append([layer, dense.alive_rate, sparse.alive_rate, sparse.mean_l0, dense.explained_variance,
                         sparse.explained_variance, sparse.ce_clean, sparse.ce_delta, sparse.kl])
            logger.info("layer %d: TopK-%d EV %.3f, CE change %+.4f nats", layer, args.k,
                        sparse.explained_variance, sparse.ce_delta)
        columns = ["layer", "alive_rate_vanilla", "alive_rate_topk", "mean_l0_topk", "ev_vanilla", "ev_topk",
                   "ce_clean", "ce_delta_topk", "kl_topk"]
        table = tracker.log_table("ffkv_summary", columns, rows)
    print(f"FF-KV summary: {table}")
    for row in rows:
        print("  " + ", ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(columns, row)))
    return 0
