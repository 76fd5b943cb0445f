"""The ``tlql`` command line: a thin layer over the Python API, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from tl_query_lens.cli.validate import parse_layers, parse_ranges, validate_args
from tl_query_lens.errors import InputError

__all__ = ["add_common_args", "build_parser", "main", "parse_layers", "parse_ranges"]

# Each module defines ``add_parser(subparsers)`` that registers its subcommand and sets ``func(args) -> int``.
SUBCOMMANDS = ("ffkv", "query_lens", "ql-evaluate", "ql-channels", "readout", "certify", "saes", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tlql",
        description="Query Lens, FF-KV dictionaries, readout SAEs and SAE certification for TransformerLens/SAELens.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (accepted anywhere on the command line)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"tl_query_lens.cli.{name.replace('-', '_')}").add_parser(subparsers)
    return parser


def add_common_args(parser: argparse.ArgumentParser, *, out: str) -> None:
    """Options every analysis shares: model, corpus, output folder, W&B."""
    parser.add_argument("--model", default="smollm2-135m", help="embedded model or a TransformerLens model name")
    parser.add_argument("--corpus", default="embedded", help="'embedded', a .txt/.jsonl path, or an HF dataset")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out, help="results folder (written before anything is logged)")
    parser.add_argument("--no-wandb", dest="wandb", action="store_false", help="keep results on disk only")
    parser.add_argument("--wandb-project", default="tl_query_lens")


def main(argv: list[str] | None = None) -> int:
    """Run ``tlql``. User errors (bad arguments, paths, files, inputs) print one or two lines naming the fix and
    return 2, before any model is loaded where the check allows; ``--debug`` (anywhere) re-raises with the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose or debug else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        validate_args(args)
        return int(args.func(args) or 0)
    except InputError as err:
        if debug:
            raise
        command = " ".join(c for c in (args.command, getattr(args, "readout_command", None)) if c)
        print(f"tlql {command}: error: {err}", file=sys.stderr)
        print("(add --debug to see the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
