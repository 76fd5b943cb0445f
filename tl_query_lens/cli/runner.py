"""The one runner of every ``tlql`` command (:class:`~tl_query_lens.command.Command`): options → config → checks →
model → ``run`` → result saved, logged, printed and rendered. No command presents a result by hand."""

from __future__ import annotations

import argparse
import functools
import inspect
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tl_query_lens.cli.configs import build_config
from tl_query_lens.cli.options import NOT_GIVEN, add_config_options
from tl_query_lens.command import Command, resolve

PRINTED_ROWS = 20  # rows of each table printed (all of them are in the CSV and in W&B)


def configure(parser: argparse.ArgumentParser, command: Command) -> None:
    """The options of ``command``'s config (and ``--quick`` where the config has a ``quick()`` preset; the help shows
    the defaults of each of its ``presets()``, chosen by its field ``preset``), less its ``NOT_OPTIONS``."""
    cls: Any = command.config_class()
    presets = {"": cls()}
    if hasattr(cls, "quick"):
        presets["--quick"] = cls.quick()
        parser.add_argument("--quick", action="store_true", help=(inspect.getdoc(cls.quick) or "").split("\n\n")[0])
    if hasattr(cls, "presets"):
        presets |= {f"--preset {name}": cfg for name, cfg in cls.presets().items() if cfg != presets[""]}
    add_config_options(parser, presets, shown=getattr(cls, "SHOWN", None), skip=getattr(cls, "NOT_OPTIONS", ()))
    parser.set_defaults(func=functools.partial(run_command, command))


def config_of(command: Command, args: argparse.Namespace) -> Any:
    """The config of a parsed command line: the preset (``--quick``, ``--preset NAME`` or the default) with the given
    options on top."""
    cls: Any = command.config_class()
    if getattr(args, "quick", False):
        base = cls.quick()
    elif hasattr(cls, "presets") and getattr(args, "preset", NOT_GIVEN) is not NOT_GIVEN:
        base = cls.presets()[args.preset]
    else:
        base = cls()
    return build_config(base, args, fixed=getattr(cls, "NOT_OPTIONS", ()))


def run_command(command: Command, args: argparse.Namespace) -> int:
    """Build, check, run and present ``command``; user errors raise :class:`~tl_query_lens.errors.InputError`
    before the model loads where the checks allow (``tlql`` prints them as one line, exit status 2)."""
    cfg = config_of(command, args)  # torch-free: a bad option is refused before anything heavy is imported
    from tl_query_lens.checks import check_run
    from tl_query_lens.models import load_model
    from tl_query_lens.paths import output_folder
    from tl_query_lens.wandb_env import check_wandb_mode

    dims = check_run(cfg.run)
    if command.check:
        resolve(command.check)(cfg, dims)
    if cfg.run.wandb:
        check_wandb_mode()
    with output_folder(cfg.run.out):
        model = load_model(cfg.run.model, device=cfg.run.device) if command.needs_model else None
        result = resolve(command.run)(model, cfg)
        present(command, cfg, result)
    return int(getattr(result, "exit_status", 0))  # e.g. 1: a reproduced figure left its documented interval


def present(command: Command, cfg: Any, result: Any) -> None:
    """Save ``result`` under ``--out``, log it (files beside it and W&B), print its tables and write its report."""
    from tl_query_lens.report.html import write_page
    from tl_query_lens.tracking import Tracker

    if getattr(result, "rank", 0) != 0:  # torchrun: rank 0 presents the merged result
        return
    out = Path(cfg.run.out) / command.result_folder
    result.save(out)
    with Tracker(
        out, project=cfg.run.wandb_project, name=command.slug, config=asdict(cfg), use_wandb=cfg.run.wandb
    ) as track:
        track.log_result(result, command.slug)
    report = write_page(out / "report.html", [result.report_section()], title=f"tlql {command.name}")
    for name, table in result.tables().items():
        lines = table.to_markdown().splitlines()
        more = len(lines) - 2 - PRINTED_ROWS
        print(f"{name}:\n" + "\n".join(lines[: 2 + PRINTED_ROWS]) + (f"\n… {more} more rows" if more > 0 else ""))
    line = result.summary_line() if hasattr(result, "summary_line") else ""
    if line:
        print(line)
    print(f"results: {out}  (report: {report})")
