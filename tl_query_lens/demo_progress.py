"""``tlql demo``'s and ``tlql reproduce``'s overall progress: step i of n, elapsed time, an estimated total from the run's first forward batch
(:class:`~tl_query_lens.estimates.BatchClock`, no extra batch), rescaled by the steps finished, and a warning naming the
option that shrinks a step estimated over a minute."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tl_query_lens.estimates import BatchClock, clock
from tl_query_lens.readout.registry import READOUT_RELEASES

# Cost of each step in units of one timed forward token (seconds_per_token), as "fixed + per token". Set from the
# measured quick demo in docs/benchmarks/demo_quick.json (step seconds / seconds per token of that run); the split
# into a fixed and a proportional part from the idle quick- and full-demo step times of docs/benchmarks.md
# (2026-12-05): FF-KV, readout and the Query Lens operators barely grow from the quick to the full sizes, the atlas
# pass and the certificate grow with their tokens. The total is then rescaled by the measured / estimated time of
# the steps already finished (Progress.scale), so a faster or slower machine corrects it after the first step.
# The rate is now the seconds per token of the run's own first forward batch (inside the first step): the same
# unit as the plain 4 x 32 forward the factors were set with, within the noise of a loaded machine (median ratio
# 0.91 over 3 runs, docs/benchmarks/estimate_unit.json).
_FIXED = {"ffkv": 500.0, "operators": 900.0, "readout": 400.0}
_PER_TOKEN = {"splice": 0.1, "operators": 0.3, "atlas": 0.4, "calibration": 0.15, "evaluation": 0.75}


def step_estimates(cfg, seconds_per_token: float) -> dict[str, tuple[float, str]]:
    """Step → (estimated seconds, the option that shrinks it), from one timed forward pass of this machine."""
    ffkv = _FIXED["ffkv"] + cfg.splice_seqs * 32 * len(cfg.ffkv_layers) * _PER_TOKEN["splice"]
    operators = _FIXED["operators"] + cfg.operator_seqs * cfg.seq_len * cfg.n_features * _PER_TOKEN["operators"]
    lens = operators + cfg.atlas_tokens * _PER_TOKEN["atlas"]
    cert = (cfg.n_cal * _PER_TOKEN["calibration"] + cfg.n_eval * _PER_TOKEN["evaluation"]) * 32
    readout = _FIXED["readout"] * seconds_per_token
    if cfg.readout_sae_id not in READOUT_RELEASES.available_ids(cfg.model):
        readout += float(cfg.readout_overrides.get("max_seconds", 480.0))  # a first fit, capped at max_seconds
    return {
        "ffkv": (ffkv * seconds_per_token, "--splice-seqs"),
        "query_lens": (lens * seconds_per_token, "--atlas-tokens"),
        "readout": (readout, "--readout-sae-id small"),
        "certify": (cert * seconds_per_token, "--n-eval"),
    }


@dataclass
class Progress:
    """One overall progress line per step: step i of n, elapsed, and the total ETA. The step estimates come from
    ``estimator(seconds per token)`` once the first forward batch of the run is timed (:meth:`on_forward`: the run's
    own batch, no extra one); each remaining step's estimate is then scaled by the measured / estimated time of the
    steps finished so far (1 before the first one finishes). ``command`` names the lines and their logger
    (``tl_query_lens.<command>``)."""

    steps: list[str]
    estimator: Callable[[float], dict[str, tuple[float, str]]]
    start: float
    command: str = "demo"
    estimates: dict[str, tuple[float, str]] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    current: str | None = None

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(f"tl_query_lens.{self.command}")

    def scale(self) -> float:
        guessed = sum(self.estimates[name][0] for name in self.done)
        return sum(self.done.values()) / guessed if guessed > 0 else 1.0

    def total(self) -> float:
        """Elapsed + the scaled estimates of the steps not finished."""
        left = sum(self.estimates[n][0] for n in self.steps if n not in self.done) * self.scale()
        return time.perf_counter() - self.start + left

    def on_forward(self, model: torch.nn.Module):
        """Context manager: the first forward batch of the run inside it sets the estimates (:meth:`timed`)."""
        return BatchClock(lambda seconds, tokens: self.timed(seconds / max(tokens, 1.0))).on_forward(model)

    def timed(self, seconds_per_token: float) -> None:
        """Set the estimates from the first forward batch's seconds per token; log the total and, when the running
        step is estimated over a minute, its warning."""
        self.estimates = self.estimator(seconds_per_token)
        self.logger.info(
            "%s: first forward batch timed (%.2g s per token); estimated total %s",
            self.command,
            seconds_per_token,
            clock(self.total()),
        )
        self._warn()

    def begin(self, index: int, name: str) -> None:
        self.current = name
        elapsed = clock(time.perf_counter() - self.start)
        total = clock(self.total()) if self.estimates else "after the first forward batch"
        n = len(self.steps)
        self.logger.info(
            "%s: step %d of %d (%s); elapsed %s, estimated total %s", self.command, index, n, name, elapsed, total
        )
        self._warn()

    def _warn(self) -> None:
        if self.current is None or not self.estimates:
            return
        estimate, option = self.estimates[self.current]
        if estimate * self.scale() > 60:
            self.logger.info(
                "%s: %s will take about %s; a smaller %s shrinks it",
                self.command,
                self.current,
                clock(estimate * self.scale()),
                option,
            )

    def end(self, name: str, seconds: float) -> None:
        self.done[name] = seconds
