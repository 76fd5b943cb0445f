"""``tlql reproduce``: re-measure every reproduction row from the shipped dictionaries (``--quick``: minutes)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig


@dataclass
class ReproduceOptions:
    """How big the run is.

    Attributes:
        quick: a reduced version of every experiment (12 min 48 s on a shared 2-core CPU, docs/reproduction.md),
            compared with the documented quick run.
    """

    quick: bool = False


def add_parser(subparsers) -> None:
    command(
        subparsers,
        "reproduce",
        help="re-measure every reproduction row: paper | documented | this run, CSV + markdown + W&B",
        configure=configure,
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.reproduce.config import ReproduceConfig

    run = ("model", "device", "wandb", "wandb_project")
    taken = add_options(parser, RunConfig, skip=[f.name for f in fields(RunConfig) if f.name not in run])
    taken = add_options(parser, ReproduceOptions, taken=taken)
    add_options(parser, ReproduceConfig, taken=taken, skip=("size",))
    parser.set_defaults(func=run_reproduce)


def run_reproduce(args: argparse.Namespace) -> int:
    from tl_query_lens.cli.common import load_model, tracker
    from tl_query_lens.reproduce.config import ReproduceConfig
    from tl_query_lens.reproduce.run import reproduce

    options = build(ReproduceOptions, args)
    cfg = build(ReproduceConfig, args, size="quick" if options.quick else "full")
    run_cfg = build(RunConfig, args, out=cfg.out)
    model = load_model(run_cfg)
    result = reproduce(model, cfg)
    with tracker(run_cfg, "reproduce", args, reproduce=cfg) as track:
        track.log_result(result, "reproduce")
    print(f"\n{result.markdown()}")
    print(f"table: {cfg.out}/reproduction.md, {cfg.out}/reproduction.csv; peak RSS {result.peak_rss_gb:.1f} GB")
    for name, why in result.skipped.items():
        print(f"not measured: {name} ({why})")
    if result.outside:
        print(f"{len(result.outside)} figure(s) outside their documented interval: {', '.join(result.outside)}")
        return 1
    return 0
