"""The one shape of every ``tlql`` command: a config dataclass and a ``run`` that returns a result.

A :class:`Command` names three things by their import path, so the command line imports nothing heavy until a
command runs:

- ``config``: a dataclass in a torch-free ``<package>/config.py``. Its field ``run`` nests the
  :class:`~tl_query_lens.config.RunConfig` (model, corpus, sizes, ``--out``, W&B) with the command's own defaults;
  its other fields are the method's options, nested method configs included (``Table1Config.engine``). A
  ``quick()`` classmethod, where there is one, is the ``--quick`` preset: options given on the command line apply
  on top of it.
- ``run``: ``run(model, cfg) -> SavableResult`` (``model`` is None for a command that needs none). It does the
  work and returns one result object that saves, loads and presents itself; it never logs or prints.
- ``check`` (optional): ``check(cfg, dims)`` refuses what no config can check alone (sizes against the model's
  dimensions ``dims``, known before the model loads for the embedded model, else None) with an
  :class:`~tl_query_lens.errors.InputError` before any heavy work.

:func:`tl_query_lens.cli.runner.run_command` is the one runner: it builds the config from the options, checks,
loads the model, calls ``run``, saves the result under ``--out``, logs it through
:meth:`~tl_query_lens.tracking.Tracker.log_result`, prints its tables and writes its report section. Every ``tlql``
command is an entry of :data:`tl_query_lens.commands.COMMANDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Command", "resolve"]


def resolve(path: str) -> Any:
    """``"package.module:name"`` → the object (the module is imported now)."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r}: write an import path as 'package.module:name'")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Command:
    """One ``tlql`` command (module docstring).

    Attributes:
        name: the words that call it: ``"ffkv"``, or ``"readout fit"`` for an action of a command group.
        help: one line for ``tlql --help``.
        config: import path of the config dataclass (``"tl_query_lens.dictionaries.config:FFKVCommandConfig"``).
        run: import path of ``run(model, cfg) -> SavableResult``.
        check: import path of ``check(cfg, dims)`` (checks before the model loads), or None.
        needs_model: whether the runner loads ``cfg.run.model`` before ``run``.
        result_name: name of the result in W&B and of its files beside the result (default: ``name`` with ``_``).
        result_folder: folder under ``--out`` where the runner saves, logs and reports the result ("": ``--out``
            itself; the atlas keeps its site in ``--out`` and its result in ``<out>/result``).
    """

    name: str
    help: str
    config: str
    run: str
    check: str | None = None
    needs_model: bool = True
    result_name: str | None = None
    result_folder: str = ""

    @property
    def words(self) -> list[str]:
        return self.name.split()

    @property
    def slug(self) -> str:
        return self.result_name or "_".join(self.words).replace("-", "_")

    def config_class(self) -> type:
        return resolve(self.config)
