"""The ``tlql`` command line: a thin layer over the Python API, one module per subcommand.

A subcommand is a module ``tl_query_lens/cli/<name>.py`` with ``add_parser(subparsers)``, which registers it through
:func:`tl_query_lens.cli.subcommand.command` (its name, one line of help, and a ``configure(parser)`` that adds the
options made from its configs and sets ``func``); listing the module in :data:`SUBCOMMANDS` plugs it in. Only the
subcommand being run is configured, and heavy libraries (torch, TransformerLens, SAELens) are imported by
``configure`` and ``func``, so ``tlql --help`` and mistyped commands answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from tl_query_lens.cli import runner
from tl_query_lens.cli.options import check_ranges
from tl_query_lens.cli.subcommand import configure
from tl_query_lens.command import Command
from tl_query_lens.commands import COMMANDS, GROUPS

__all__ = ["SUBCOMMANDS", "build_parser", "main", "subcommands"]

SUBCOMMANDS = ("demo",)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Name → parser of the subcommands of ``parser`` (empty when it has none)."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def build_parser(command: str | None = None, commands: tuple[Command, ...] = COMMANDS) -> argparse.ArgumentParser:
    """The ``tlql`` parser: every subcommand configured, or only ``command`` (the others keep their one-line help)."""
    parser = argparse.ArgumentParser(
        prog="tlql",
        description="Query Lens, FF-KV dictionaries, readout SAEs and SAE certification for TransformerLens/SAELens.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (accepted anywhere on the command line)"
    )
    parser.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="memory budget, e.g. 8G: sizes set by options that would exceed it are refused before any work "
        "(default: the memory available; accepted anywhere on the command line; also TLQL_MAX_MEMORY)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_commands(subparsers, commands)
    for name in SUBCOMMANDS:
        importlib.import_module(f"tl_query_lens.cli.{name}").add_parser(subparsers)
    for name, subparser in subparsers.choices.items():
        if command is None or name == command:
            configure(subparser)
    return parser


def add_commands(subparsers, commands: tuple[Command, ...]) -> None:
    """A parser per command (an action parser under its group's for ``"readout fit"``), configured on first use."""
    groups: dict[str, Any] = {}
    for cmd in commands:
        *group, name = cmd.words
        where = subparsers
        if group:
            if group[0] not in groups:
                head = subparsers.add_parser(group[0], help=GROUPS[group[0]], description=GROUPS[group[0]])
                groups[group[0]] = head.add_subparsers(dest="action", metavar="ACTION", required=True)
                head.tlql_configure = _configure_group  # type: ignore[attr-defined]
            where = groups[group[0]]
        parser = where.add_parser(name, help=cmd.help, description=cmd.help)
        parser.tlql_configure = functools.partial(runner.configure, command=cmd)  # type: ignore[attr-defined]


def _configure_group(parser: argparse.ArgumentParser) -> None:
    for action in subcommands(parser).values():
        configure(action)


def main(argv: list[str] | None = None, commands: tuple[Command, ...] = COMMANDS) -> int:
    """Run ``tlql``. User errors (bad arguments, paths, files, inputs) print one or two lines naming the fix and
    return 2, before any model is loaded where the check allows; ``--debug`` (anywhere) re-raises with the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    argv, max_memory = _pop_max_memory(argv)
    parser = build_parser(command="", commands=commands)
    choices = subcommands(parser)
    name = next((word for word in argv if word in choices), None)  # the subcommand named: configure it alone
    if name is not None:
        configure(choices[name])  # its configs import no torch
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose or debug else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from tl_query_lens import interrupts
    from tl_query_lens.errors import InputError, boundary_error  # light: torch is imported by the command itself

    command = " ".join(c for c in (args.command, getattr(args, "action", None)) if c)
    if max_memory is not None:
        from tl_query_lens import budget

        try:
            os.environ[budget.ENV] = str(budget.parse_size(max_memory, "--max-memory"))
        except InputError as err:
            print(f"tlql {command}: error: {err}", file=sys.stderr)
            return 2
    out_of_range = check_ranges(parser, args)  # before any config is built
    if out_of_range:
        print(f"tlql {command}: error: {out_of_range}", file=sys.stderr)
        print("(add --debug to see the traceback)", file=sys.stderr)
        return 2
    try:
        runs_itself = isinstance(args.func, functools.partial)  # the runner checks and locks --out itself
        with interrupts.catch_signals(), contextlib.nullcontext() if runs_itself else _output_folder(args):
            return int(args.func(args) or 0)
    except InputError as err:
        if debug:
            raise
        print(f"tlql {command}: error: {err}", file=sys.stderr)
        print("(add --debug to see the traceback)", file=sys.stderr)
        return 2
    except BaseException as err:
        if debug:
            raise
        if interrupts.is_interrupt(err):
            return interrupts.report(err, command)
        mapped = boundary_error(err)  # a library's error that a file, option or the machine caused: one line
        if mapped is None:
            raise
        print(f"tlql {command}: error: {mapped}", file=sys.stderr)
        print("(add --debug to see the traceback)", file=sys.stderr)
        return 2


def _pop_max_memory(argv: list[str]) -> tuple[list[str], str | None]:
    """``--max-memory SIZE`` / ``--max-memory=SIZE`` taken out of ``argv`` wherever it stands."""
    rest, value = [], None
    words = iter(argv)
    for word in words:
        if word == "--max-memory":
            value = next(words, "")
        elif word.startswith("--max-memory="):
            value = word.split("=", 1)[1]
        else:
            rest.append(word)
    return rest, value


@contextlib.contextmanager
def _output_folder(args: argparse.Namespace) -> Iterator[None]:
    """``--out`` checked and locked while the command runs (:func:`~tl_query_lens.paths.output_folder`)."""
    from tl_query_lens.paths import output_folder
    from tl_query_lens.wandb_env import check_wandb_mode

    if getattr(args, "wandb", False) is True:
        check_wandb_mode()
    out = getattr(args, "out", None)
    if not isinstance(out, str) or not out:
        yield
        return
    with output_folder(out):
        yield


if __name__ == "__main__":
    sys.exit(main())
