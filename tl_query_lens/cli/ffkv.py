"""``tlql ffkv``: FF-KV dictionaries of chosen layers, summarised on the corpus and logged to W&B."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN = {"out": "results/ffkv", "layers": "0,6,12,18,24,29", "n_seqs": 32, "seq_len": 64}


@dataclass
class FFKVOptions:
    """What ``tlql ffkv`` writes besides the summary.

    Attributes:
        save_dictionaries: also save each layer's TopK FF-KV dictionary in SAELens format (<out>/layer<L>/sae).
    """

    save_dictionaries: bool = False


def add_parser(subparsers) -> None:
    command(
        subparsers, "ffkv", help="summarise FF-KV dictionaries (alive rate, L0, EV, CE change)", configure=configure
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.dictionaries.config import FFKVSummaryConfig

    taken = add_options(parser, RunConfig, skip=("features", "dictionary"), defaults=RUN)
    add_options(parser, FFKVSummaryConfig, taken=add_options(parser, FFKVOptions, taken=taken))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.cli.checks import check_limits, check_run, dims_of
    from tl_query_lens.cli.common import load_model, load_tokens, print_rows, tracker
    from tl_query_lens.dictionaries.config import FFKVSummaryConfig
    from tl_query_lens.dictionaries.ffkv import FFKV
    from tl_query_lens.dictionaries.splice import FFKVSummary, ffkv_summary
    from tl_query_lens.interrupts import with_resume
    from tl_query_lens.ranges import parse_layers

    run_cfg, cfg, options = build(RunConfig, args), build(FFKVSummaryConfig, args), build(FFKVOptions, args)
    dims = check_run(run_cfg)
    parse_layers(run_cfg.layers, dims.n_layers if dims else None)
    check_limits(dims, {"--k": (cfg.k, "d_mlp")}, run_cfg.model)
    model = load_model(run_cfg)
    layers = parse_layers(run_cfg.layers, model.cfg.n_layers)
    check_limits(dims_of(model), {"--k": (cfg.k, "d_mlp")}, run_cfg.model)
    tokens = load_tokens(run_cfg, model, "evaluation")
    out = Path(run_cfg.out)
    summary = FFKVSummary(k=cfg.k, sparse={}, dense={})
    try:
        for layer in layers:  # one layer at a time: an interrupt keeps the finished ones
            part = ffkv_summary(model, [layer], tokens, cfg=cfg)
            summary.sparse.update(part.sparse)
            summary.dense.update(part.dense)
    except KeyboardInterrupt as err:
        left = ",".join(str(layer) for layer in layers if layer not in summary.sparse)
        if not summary.sparse:
            raise with_resume(err, "no layer had finished; rerun the same command") from None
        summary.save(out)
        raise with_resume(
            err,
            f"layers {sorted(summary.sparse)} are saved in {out}; run the rest with --layers {left} and another --out",
        ) from None
    summary.save(out)
    if options.save_dictionaries:
        for layer in layers:
            FFKV.from_model(model, layer, "topk", k=cfg.k).save_model(out / f"layer{layer}" / "sae")
    with tracker(run_cfg, "ffkv", args, summary=cfg) as track:
        table = track.log_table("ffkv_summary", list(FFKVSummary.COLUMNS), summary.rows())
    print(f"FF-KV summary: {table}")
    print_rows(FFKVSummary.COLUMNS, summary.rows())
    return 0
