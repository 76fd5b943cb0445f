"""``tlql query-lens``: key / value signatures of FF-KV features of chosen layers, on disk and in a W&B table.

The signatures come from :meth:`QueryLens.value_signatures` / :meth:`QueryLens.key_signatures` per layer, as in the
API: the engine pushes the requested features through (the feature basis) when they are fewer than the model width,
and computes the full operators otherwise.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Literal

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

logger = logging.getLogger(__name__)
RUN = {"out": "results/query_lens", "layers": "18", "features": "0-24", "n_seqs": 8, "seq_len": 32}


@dataclass
class QueryLensOptions:
    """Which signatures ``tlql query-lens`` computes (k, skip-positions, chunk and cache-dir: the engine's options).

    Attributes:
        side: 'value' (what a feature promotes), 'key' (what activates it) or 'both'.
        method: 'full' (the corpus-mean Jacobian), 'first_order' (value side only; the key side then uses 'full') or
            'logit_lens' (no Jacobian).
        evaluate: run the Table-1 evaluation protocol on these layers / features instead (as `tlql ql-evaluate`,
            with --n-seqs / --seq-len as its operator corpus).
    """

    side: Literal["value", "key", "both"] = "both"
    method: Literal["full", "first_order", "logit_lens"] = "full"
    evaluate: bool = False


def add_parser(subparsers) -> None:
    command(subparsers, "query-lens", help="Query Lens key/value signatures of FF-KV features", configure=configure)


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.query_lens.config import Table1Config

    taken = add_options(parser, RunConfig, skip=("dictionary",), defaults=RUN)
    shown = {  # --evaluate runs ql-evaluate's Table 1, which keeps both under --out
        "cache_dir": "none: operators are not cached; with --evaluate <--out>/operators",
        "checkpoint_dir": "only with --evaluate: <--out>/parts",
    }
    taken = add_options(parser, QueryLensOptions, taken=taken)
    # basis: signatures here take QueryLens' own rule per request; Table 1's choice is ql-evaluate's --basis
    add_options(parser, Table1Config, taken=taken, skip=("prompts", "basis"), shown=shown)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli import ql_evaluate
    from tl_query_lens.cli.common import load_model, load_tokens, tracker
    from tl_query_lens.cli.table1 import run_table1
    from tl_query_lens.dictionaries.ffkv import FFKV
    from tl_query_lens.errors import InputError
    from tl_query_lens.limits import check_limits, dims_of
    from tl_query_lens.query_lens.config import Table1Config
    from tl_query_lens.query_lens.lens import QueryLens
    from tl_query_lens.ranges import parse_features, parse_layers

    run_cfg, options = build(RunConfig, args), build(QueryLensOptions, args)
    if options.evaluate:
        ev = ql_evaluate.RUN
        return run_table1(
            args,
            run_cfg,
            op_seqs=run_cfg.n_seqs,
            op_seq_len=run_cfg.seq_len,
            n_prompts=4,
            ev_seqs=ev["n_seqs"],
            ev_seq_len=ev["seq_len"],
        )
    table1 = build(Table1Config, args, features=None)  # k and the engine's options
    engine = table1.engine
    dims = check_run(run_cfg, folders={"--cache-dir": engine.cache_dir})
    if engine.skip_positions >= run_cfg.seq_len:
        raise InputError(
            f"--skip-positions {engine.skip_positions} leaves no position of --seq-len {run_cfg.seq_len}; lower it."
        )
    parse_layers(run_cfg.layers, dims.n_layers if dims else None)
    parse_features(run_cfg.features or "all", dims.d_mlp if dims else None)
    check_limits(dims, {"--k": (table1.k, "d_vocab")}, run_cfg.model)
    model = load_model(run_cfg)
    layers = parse_layers(run_cfg.layers, model.cfg.n_layers)
    features = parse_features(run_cfg.features or "all", model.cfg.d_mlp)  # checked before any operator
    check_limits(dims_of(model), {"--k": (table1.k, "d_vocab")}, run_cfg.model)
    tokens = load_tokens(run_cfg, model, "train")
    lens = QueryLens(model, tokens, engine=engine)
    sides = ["value", "key"] if options.side == "both" else [options.side]
    # first_order is value-side only
    key_method: Literal["full", "logit_lens"] = "full" if options.method == "first_order" else options.method
    out = Path(run_cfg.out)
    with tracker(run_cfg, "query_lens", args) as track:
        for layer in layers:
            sae = FFKV.from_model(model, layer)
            for side in sides:
                if side == "value":
                    sig = lens.value_signatures(sae, features, k=table1.k, method=options.method)
                else:
                    sig = lens.key_signatures(sae, features, k=table1.k, method=key_method)
                folder = sig.save(out / f"layer{layer}_{side}")
                columns, rows = sig.to_table()
                track.log_table(f"signatures_layer{layer}_{side}", columns, rows)
                logger.info("layer %d %s (%s): %d features → %s", layer, side, sig.method, len(sig), folder)
                for row in rows[:3]:
                    print(f"  L{layer} {side} feature {row[0]}: top {row[4]}")
    print(f"Query Lens signatures written to {out}")
    return 0
