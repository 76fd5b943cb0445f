"""How a subcommand plugs into ``tlql``: :func:`command` registers it with a deferred ``configure(parser)``, and
:func:`configure` runs that once, only for the subcommand being used (or when the whole parser is built), so
``tlql --help`` and mistyped commands answer without importing the configs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["command", "configure"]


def command(subparsers, name: str, *, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register subcommand ``name``; ``configure(parser)`` adds its options (importing its configs) only when the
    subcommand is used or the whole parser is built (:func:`configure`)."""
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.tlql_configure = configure  # type: ignore[attr-defined]
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the deferred options of ``parser`` (once)."""
    pending = parser.__dict__.pop("tlql_configure", None)
    if pending is not None:
        pending(parser)
