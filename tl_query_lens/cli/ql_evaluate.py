"""``tlql ql-evaluate``: the Query Lens paper's Table-1 protocol on features of FF-KV and/or SAELens dictionaries
(one summary per dictionary family, side by side), logged to W&B."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig, check_ranges

RUN: dict[str, Any] = {"out": "results/ql_eval", "layers": "6,12,18,24", "n_seqs": 512, "seq_len": 32}


@dataclass
class Table1Options:
    """The Table-1 run's corpora and prompts (--n-seqs / --seq-len: the max-activating corpus, evaluation split).

    Attributes:
        op_seqs: operator corpus: sequences (train split).
        op_seq_len: operator corpus: tokens per sequence.
        n_prompts: neutral prompts used for steering (the first n of a fixed list).
    """

    op_seqs: int = 2
    op_seq_len: int = 32
    n_prompts: int = 4

    RANGES: ClassVar[dict[str, str]] = {"op_seqs": "[1, inf)", "op_seq_len": "[2, inf)", "n_prompts": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)


def add_parser(subparsers) -> None:
    command(subparsers, "ql-evaluate", help="Table-1 input/output scores of Query Lens signatures", configure=configure)


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.query_lens.config import Table1Config

    taken = add_options(parser, Table1Options, taken=add_options(parser, RunConfig, defaults=RUN))
    shown = {"cache_dir": "<--out>/operators", "checkpoint_dir": "<--out>/parts"}
    add_options(parser, Table1Config, taken=taken, skip=("prompts",), shown=shown)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = build(Table1Options, args)
    from tl_query_lens.cli.table1 import run_table1

    return run_table1(
        args,
        build(RunConfig, args),
        op_seqs=options.op_seqs,
        op_seq_len=options.op_seq_len,
        n_prompts=options.n_prompts,
        ev_seqs=None,
        ev_seq_len=None,
    )
