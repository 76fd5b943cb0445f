"""Cost estimates of heavy passes, from the pass's own first batch (no extra one): :class:`BatchClock` times the first
batch(es) as they run, :func:`estimate` logs the one-line estimate (:func:`announce`) right after them, naming the option
that shrinks the work. ``certify``, ``atlas``, ``reproduce`` and ``saes train`` use it, and ``tlql demo``'s overall
progress (:mod:`tl_query_lens.demo_progress`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

logger = logging.getLogger("tl_query_lens.estimate")


class BatchClock:
    """Times the first ``n_first`` batches of a pass while it runs (no extra batch): the pass calls :meth:`tick` as each
    batch starts; at the tick that ends the ``n_first``-th batch, ``report(seconds per batch, tokens per batch)`` is
    called, once. :meth:`on_forward` makes every forward call of a model tick it."""

    def __init__(self, report: Callable[[float, float], Any], n_first: int = 1) -> None:
        self.report = report
        self.n_first = n_first
        self.fired = False
        self._t0: float | None = None
        self._tokens = 0.0
        self._count = 0

    def tick(self, n_tokens: float = 0.0) -> None:
        """A batch of ``n_tokens`` starts (and the one before it has ended)."""
        if self.fired:
            return
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        elif self._count >= self.n_first:
            self.fired = True
            self.report((now - self._t0) / self._count, self._tokens / self._count)
            return
        self._count += 1
        self._tokens += n_tokens

    @contextmanager
    def on_forward(self, model: torch.nn.Module) -> Iterator[BatchClock]:
        """Inside the block, each forward call of ``model`` that starts from the tokens (``model(...)``,
        ``run_with_cache``, ``run_with_hooks``, ``generate``'s steps; a one-token probe aside) ticks the clock, through a torch pre-hook on its
        ``hook_embed`` (TransformerLens' own hooks, which ``run_with_hooks`` resets, are left alone); removed on exit.
        A batch's time is thus from its forward call to the next one: its whole iteration."""
        entry = getattr(model, "hook_embed", model)

        def pre(module, args) -> None:
            shape = args[0].shape if args and isinstance(args[0], torch.Tensor) else ()
            tokens = shape[0] * shape[1] if len(shape) >= 2 else 0
            if tokens > 1:  # a one-token forward is a probe of the hooks' sizes (hooks.hook_dims), not a batch
                self.tick(float(tokens))

        handle = entry.register_forward_pre_hook(pre)
        try:
            yield self
        finally:
            handle.remove()


def estimate(
    command: str, n_batches: float, option: str, unit: str = "forward batches", n_first: int = 1
) -> BatchClock:
    """A :class:`BatchClock` that logs the one-line estimate of a heavy pass (:func:`announce`) right after the
    pass's first ``n_first`` batches (as the next starts): ``n_batches`` batches at their mean wall time."""
    return BatchClock(lambda seconds, _tokens: announce(command, n_batches, seconds, option, unit), max(1, n_first))


def announce(command: str, n_batches: float, seconds_each: float, option: str, unit: str = "forward batches") -> float:
    """Log the one-line estimate of a heavy pass: ``n_batches`` ``unit`` at ``seconds_each`` (the first one's time,
    from a :class:`BatchClock`). Returns the estimated seconds."""
    total = n_batches * seconds_each
    logger.info(
        "%s: estimated wall time %s (%g %s at %.2g s each, as the first took here); a smaller %s shrinks it",
        command,
        clock(total),
        n_batches,
        unit,
        seconds_each,
        option,
    )
    return total


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}" if minutes >= 60 else f"{minutes}:{sec:02d}"
