"""``tlql ql-channels``: subspace channels of FF-KV value features of source layer(s), logged to W&B (DESIGN §5)."""

from __future__ import annotations

import argparse
import logging
import time

from tl_query_lens.cli import add_common_args, parse_layers

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("ql-channels", help="subspace channels: low-rank fits of module responses")
    add_common_args(parser, out="results/ql_channels")
    parser.add_argument("--sources", default="18", help="source layer(s) of the FF-KV value features, e.g. '18'")
    parser.add_argument(
        "--destination",
        choices=("layer", "module"),
        default="layer",
        help="same destination = same downstream block ('layer') or same module ('module')",
    )
    parser.add_argument("--fits", default="closed_form,adam")
    parser.add_argument("--rank", type=int, default=None, help="default d_model // n_layers")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--n-permutations", type=int, default=10000)
    parser.add_argument("--op-seqs", type=int, default=2, help="operator corpus: sequences (train split)")
    parser.add_argument("--op-seq-len", type=int, default=32)
    parser.add_argument(
        "--operator-layers",
        default=None,
        help="blocks whose module operators are computed (default: min(source)+1 .. L-1); a cached "
        "set is reused only for the same blocks",
    )
    parser.add_argument("--cache-dir", default=None, help="operator cache (default: <out>/operators)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import plotly.graph_objects as go

    from tl_query_lens import FFKV, load_corpus, load_model
    from tl_query_lens.query_lens.channels import SubspaceChannelsConfig, subspace_channels
    from tl_query_lens.tracking import Tracker

    start = time.time()
    model = load_model(args.model, device=args.device)
    L = model.cfg.n_layers
    sources = parse_layers(args.sources, L)
    out = Path(args.out)
    cfg = SubspaceChannelsConfig(
        destination=args.destination,
        fits=tuple(args.fits.split(",")),
        rank=args.rank,
        epochs=args.epochs,
        n_permutations=args.n_permutations,
        operator_layers=tuple(parse_layers(args.operator_layers, L)) if args.operator_layers else None,
        cache_dir=str(args.cache_dir or out / "operators"),
    )
    tokens = load_corpus(
        args.corpus, model, n_seqs=args.op_seqs, seq_len=args.op_seq_len, split="train", seed=args.seed
    )
    dictionaries = {layer: FFKV.from_model(model, layer) for layer in sources}
    result = subspace_channels(model, dictionaries, tokens, cfg=cfg)
    result.save(out / "channels")
    elapsed = time.time() - start
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(out, project=args.wandb_project, name="ql-channels", config=config, use_wandb=args.wandb) as tracker:
        for fit, summary in result.summary.items():
            tracker.log_scalars(f"summary_{fit}", summary)
            figure = go.Figure(
                go.Heatmap(
                    z=result.overlaps[fit], x=result.channels, y=result.channels, colorscale="Viridis", zmin=0, zmax=1
                )
            )
            figure.update_layout(title=f"Channel overlap OL ({fit}, rank {result.rank})")
            tracker.log_plot(f"overlap_{fit}", figure)
        columns = ["channel", "fit", "mse", "rel_l2", "cosine", "explained_energy", "train_mse"]
        rows = [
            [name, fit, *(m[name][c] for c in columns[2:])]
            for fit, m in result.metrics.items()
            for name in result.channels
        ]
        tracker.log_table("channel_metrics", columns, rows)
        tracker.log_scalars("timing", {"total_s": elapsed})
        tracker.log_artifact("ql_channels", [out / "channels"])
    print(f"{len(result.channels)} channels of source layer(s) {sources}, rank {result.rank}, {elapsed:.0f} s")
    for fit, s in result.summary.items():
        means = {c: sum(result.metrics[fit][n][c] for n in result.channels) / len(result.channels) for c in columns[2:]}
        print(
            f"  {fit}: OL same {s['ol_same']:.3f} ({s['n_same']} pairs) vs different {s['ol_different']:.3f} "
            f"({s['n_different']}), AUC {s['auc']:.3f}, p {s['p_value']:.2g}, random {s['ol_random']:.3f}; "
            f"held-out " + ", ".join(f"{c} {v:.4g}" for c, v in means.items())
        )
    return 0
