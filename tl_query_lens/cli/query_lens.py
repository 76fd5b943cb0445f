"""``tlql query-lens``: key / value signatures of FF-KV features of chosen layers, on disk and in a W&B table."""

from __future__ import annotations

import argparse
import logging

from tqdm import tqdm

from tl_query_lens.cli import add_common_args, parse_layers
from tl_query_lens.cli.validate import parse_features

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "query-lens",
        help="Query Lens key/value signatures of FF-KV features (DESIGN §5)",
        description="Signatures of FF-KV features of the chosen layers: top/bottom-k tokens per feature, written as "
        "JSON + safetensors per layer and side, and logged as W&B tables.",
    )
    add_common_args(parser, out="results/query_lens")
    parser.add_argument("--layers", default="18", help="e.g. '3,5' or '0-29' or 'all'")
    parser.add_argument("--features", default="0-24", help="feature ids per layer, e.g. '0-99,512' or 'all'")
    parser.add_argument("--side", choices=["value", "key", "both"], default="both")
    parser.add_argument(
        "--method",
        choices=["full", "first_order", "logit_lens"],
        default="full",
        help="first_order applies to the value side; the key side then uses full",
    )
    parser.add_argument("--k", type=int, default=25)
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--skip-positions", type=int, default=0, help="leading positions left out of the corpus mean")
    parser.add_argument("--chunk", type=int, default=64, help="tangents per batched engine pass (memory)")
    parser.add_argument("--cache-dir", default=None, help="reuse / resume operators here")
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="run the Table-1 evaluation protocol on these layers/features instead "
        "(same as `tlql ql-evaluate`, which has all protocol options)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.evaluate:
        from tl_query_lens.cli.ql_evaluate import run_table1

        return run_table1(
            args, layers=args.layers, features=args.features, k=args.k, op_seqs=args.n_seqs, op_seq_len=args.seq_len
        )

    from pathlib import Path

    from tl_query_lens import FFKV, QueryLens, load_corpus, load_model
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    features = parse_features(args.features, model.cfg.d_mlp)  # FF-KV width; checked before any operator
    tokens = load_corpus(args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="train", seed=args.seed)
    lens = QueryLens(model, tokens, skip_positions=args.skip_positions, chunk=args.chunk, cache_dir=args.cache_dir)
    sides = ["value", "key"] if args.side == "both" else [args.side]
    key_method = "full" if args.method == "first_order" else args.method  # first_order is a value-side method
    saes = {layer: FFKV.from_model(model, layer) for layer in layers}
    lens.precompute(
        list(saes.values()),
        value_methods={args.method} if "value" in sides else set(),
        key_methods={key_method} if "key" in sides else set(),
    )  # one engine sweep per kind
    out = Path(args.out)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(out, project=args.wandb_project, name="query_lens", config=config, use_wandb=args.wandb) as tracker:
        for layer, sae in tqdm(saes.items(), desc="layers"):
            for side in sides:
                if side == "value":
                    sig = lens.value_signatures(sae, features, k=args.k, method=args.method)
                else:
                    sig = lens.key_signatures(sae, features, k=args.k, method=key_method)
                folder = sig.save(out / f"layer{layer}_{side}")
                columns, rows = sig.to_table()
                tracker.log_table(f"signatures_layer{layer}_{side}", columns, rows)
                logger.info("layer %d %s (%s): %d features → %s", layer, side, sig.method, len(sig), folder)
                for row in rows[:3]:
                    print(f"  L{layer} {side} feature {row[0]}: top {row[4]}")
    print(f"Query Lens signatures written to {out}")
    return 0
