"""The W&B environment this package reads (``WANDB_MODE``, ``WANDB_INIT_TIMEOUT``, ``WANDB_DIR``), checked before any
work; torch-free, so the command line checks it before loading anything and the ``Tracker`` names the same problem."""

from __future__ import annotations

import math
import os

from tl_query_lens.errors import InputError
from tl_query_lens.paths import check_folder

WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def wandb_env_problem() -> str | None:
    """What is wrong with the W&B environment variables this package reads (``WANDB_MODE``, ``WANDB_INIT_TIMEOUT``,
    ``WANDB_DIR``: a file, a dangling link, read-only, under /proc), naming the variable and the fix; None if
    nothing. W&B itself would fail only at the end, and with advice that does not name the variable."""
    skip = "or pass --no-wandb"
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        return (
            f"WANDB_MODE={mode!r} is not a W&B mode; set it to one of {', '.join(WANDB_MODES)} (or unset it), {skip}."
        )
    timeout = os.environ.get("WANDB_INIT_TIMEOUT")
    if timeout:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            return f"WANDB_INIT_TIMEOUT={timeout!r} is not a positive number of seconds; set e.g. 90 (or unset it), {skip}."
    wandb_dir = os.environ.get("WANDB_DIR")
    if wandb_dir:
        try:
            folder = check_folder(wandb_dir, "WANDB_DIR")
        except InputError as err:
            return f"{err} (W&B writes its run files there: unset WANDB_DIR to use --out, {skip})."
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            return f"WANDB_DIR {folder} is read-only for this user; point WANDB_DIR at a writable folder, {skip}."
    return None


def check_wandb_mode() -> None:
    """Refuse a W&B environment (:func:`wandb_env_problem`) before any work."""
    problem = wandb_env_problem()
    if problem:
        raise InputError(problem)
