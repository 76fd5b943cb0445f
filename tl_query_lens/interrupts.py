"""Ctrl-C and ``kill``: keep what is finished, say how to resume, exit 130 (SIGINT) or 143 (SIGTERM).

:func:`catch_signals` turns SIGTERM (and SIGINT) into :class:`Interrupted`, a ``KeyboardInterrupt``, so every
``except KeyboardInterrupt`` / ``finally`` on the way up runs: atomic writes remove their temporary file, the operator
engine has already saved its last finished minibatch, SAE training saves a checkpoint. A command that computes parts
one by one (layers, dictionaries) saves the finished ones and raises :func:`with_resume` with the rerun that
finishes the job; ``tlql`` prints that as one line (no traceback) and exits ``128 + signal``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

GENERIC_RESUME = (
    "rerun the same command to resume: cached operators, activation caches and checkpoints are reused, and "
    "finished results in the output folder are kept"
)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM received while a command ran.

    Attributes:
        signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
        resume: one line on how to finish the job (what was saved, what to rerun); empty: :data:`GENERIC_RESUME`.
    """

    def __init__(self, signum: int = signal.SIGINT, resume: str = "") -> None:
        super().__init__(signum, resume)
        self.signum = signum
        self.resume = resume


def _raise(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def catch_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block (the previous handlers come back after)."""
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave the handlers alone
            previous[signum] = signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)


def with_resume(err: BaseException, resume: str) -> Interrupted:
    """``err`` (an interrupt) as an :class:`Interrupted` that carries the line on how to resume."""
    return Interrupted(getattr(err, "signum", signal.SIGINT), resume)


def is_interrupt(err: BaseException) -> bool:
    """Ctrl-C / ``kill``: a ``KeyboardInterrupt`` or SAELens' ``InterruptedException`` (its training loop's)."""
    if isinstance(err, KeyboardInterrupt):
        return True
    training = sys.modules.get("sae_lens.training._interruption")
    return training is not None and isinstance(err, getattr(training, "InterruptedException", ()))


def report(err: BaseException, command: str) -> int:
    """Print the one line of an interrupted ``tlql <command>`` on stderr; return its exit status (128 + signal)."""
    signum = getattr(err, "signum", signal.SIGINT)
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
    resume = getattr(err, "resume", "") or GENERIC_RESUME
    print(f"tlql {command}: interrupted ({name}); {resume}.", file=sys.stderr)
    return 128 + int(signum)
