"""Cost estimates before heavy work, from one timed forward batch: ``tlql demo``'s overall progress (step i of n,
elapsed time, an estimated total, a warning before a step estimated over a minute) and the one-line estimate that
``certify``, ``atlas``, ``reproduce`` and ``saes train`` print first (:func:`announce`), each naming the option that
shrinks it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from tl_query_lens.corpus import load_corpus
from tl_query_lens.readout.registry import READOUT_RELEASES

logger = logging.getLogger("tl_query_lens.demo")
estimate_logger = logging.getLogger("tl_query_lens.estimate")


# Cost of each step in units of one timed forward token (seconds_per_token), as "fixed + per token". Set from the
# measured quick demo in docs/benchmarks/demo_quick.json (step seconds / seconds per token of that run); the split
# into a fixed and a proportional part from the idle quick- and full-demo step times of docs/benchmarks.md
# (2026-12-05): FF-KV, readout and the Query Lens operators barely grow from the quick to the full sizes, the atlas
# pass and the certificate grow with their tokens. The total is then rescaled by the measured / estimated time of
# the steps already finished (Progress.scale), so a faster or slower machine corrects it after the first step.
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


@torch.no_grad()
def seconds_per_token(model, cfg) -> float:
    """Wall seconds per token of one plain forward pass of 4 x 32 corpus tokens (after one warm-up pass)."""
    tokens = load_corpus(cfg.corpus, model, n_seqs=4, seq_len=32, split="train", seed=cfg.seed)
    model(tokens[:1])
    t0 = time.perf_counter()
    model(tokens)
    return (time.perf_counter() - t0) / tokens.numel()


@torch.no_grad()
def seconds_per_batch(model, batch: torch.Tensor) -> float:
    """Wall seconds of one plain forward pass of ``batch`` (token ids; after one warm-up pass of its first row)."""
    batch = batch.to(model.cfg.device)
    model(batch[:1])
    t0 = time.perf_counter()
    model(batch)
    return time.perf_counter() - t0


def announce(command: str, n_batches: float, seconds_each: float, option: str) -> float:
    """Log the one-line estimate of a heavy pass, before it starts: ``n_batches`` forward-batch equivalents at
    ``seconds_each`` (from :func:`seconds_per_batch`). Returns the estimated seconds."""
    total = n_batches * seconds_each
    estimate_logger.info(
        "%s: estimated wall time %s (%g forward batches at %.2g s each, timed here); a smaller %s shrinks it",
        command,
        clock(total),
        n_batches,
        seconds_each,
        option,
    )
    return total


def clock(seconds: float) -> str:
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}" if minutes >= 60 else f"{minutes}:{sec:02d}"


@dataclass
class Progress:
    """One overall progress line per step: step i of n, elapsed, and the total ETA. Each remaining step's estimate is
    scaled by the measured / estimated time of the steps finished so far (1 before the first one finishes)."""

    estimates: dict[str, tuple[float, str]]
    start: float
    done: dict[str, float] = field(default_factory=dict)

    def scale(self) -> float:
        guessed = sum(self.estimates[name][0] for name in self.done)
        return sum(self.done.values()) / guessed if guessed > 0 else 1.0

    def begin(self, index: int, name: str) -> None:
        elapsed = time.perf_counter() - self.start
        scale = self.scale()
        left = sum(self.estimates[n][0] for n in self.estimates if n not in self.done) * scale
        estimate, option = self.estimates[name]
        logger.info(
            "demo: step %d of %d (%s); elapsed %s, estimated total %s",
            index,
            len(self.estimates),
            name,
            clock(elapsed),
            clock(elapsed + left),
        )
        if estimate * scale > 60:
            logger.info("demo: %s will take about %s; a smaller %s shrinks it", name, clock(estimate * scale), option)

    def end(self, name: str, seconds: float) -> None:
        self.done[name] = seconds
