"""The ``tlql`` command line: a thin layer over the Python API, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each module defines ``add_parser(subparsers)`` that registers its subcommand and sets ``func(args) -> int``.
SUBCOMMANDS = ("ffkv", "query_lens", "ql-evaluate", "ql-channels", "readout", "certify", "saes", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tlql",
        description="Query Lens, FF-KV dictionaries, readout SAEs and SAE certification for TransformerLens/SAELens.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
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


def parse_ranges(text: str, upper: int, what: str) -> list[int]:
    """'3,5,7' or '0-9,15' → sorted ids, each checked to lie in 0..upper-1 (else a SystemExit naming the range)."""
    ids: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ids.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            ids.add(int(part))
    bad = sorted(i for i in ids if not 0 <= i < upper)
    if bad:
        raise SystemExit(f"tlql: {what} {bad[:10]} are out of range; valid: 0..{upper - 1}.")
    return sorted(ids)


def parse_layers(text: str, n_layers: int) -> list[int]:
    """'3,5,7' or '0-29' or 'all' → sorted layer list, checked against the model."""
    return list(range(n_layers)) if text == "all" else parse_ranges(text, n_layers, "layers")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
