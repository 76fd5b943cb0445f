"""The ``tlql`` command line: a thin layer over the Python API, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each module defines ``add_parser(subparsers)`` that registers its subcommand and sets ``func(args) -> int``.
SUBCOMMANDS = ("ffkv", "query_lens", "ql-evaluate", "ql-channels", "readout", "certify", "demo")


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


def parse_layers(text: str, n_layers: int) -> list[int]:
    """'3,5,7' or '0-29' or 'all' → sorted layer list, checked against the model."""
    if text == "all":
        return list(range(n_layers))
    layers: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            layers.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            layers.add(int(part))
    bad = sorted(layer for layer in layers if not 0 <= layer < n_layers)
    if bad:
        raise SystemExit(f"tlql: layers {bad} are out of range; this model has layers 0..{n_layers - 1}.")
    return sorted(layers)


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
