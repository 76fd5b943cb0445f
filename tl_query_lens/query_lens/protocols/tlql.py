"""This project's Table-1 protocol (``protocol="tlql"``, the default; formerly ``"per-target"``).

Where it departs from the authors' (``protocols/paper.py``):
  * α: geometric bracketing then bisection per KL target (:func:`kl_matched_alphas`), KL measured teacher-forced on
    clean continuations sampled from the neutral prompts, the feature's top activation as the first guess;
  * S: one token set per KL target (:func:`steering_top_tokens`), the top-|S| of the rank-percentile rise with ranks
    taken over prompt and generated positions;
  * input score: token strings normalised by stripping and lower-casing
    (:func:`~tl_query_lens.query_lens.max_activating.input_scores`);
  * TC at the config's ``tc_values`` (1, 5 and 10 by default).
The FF-KV key of SwiGLU neurons is the gate column read through the norm (the authors' is the up-projection).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from tqdm import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.query_lens.max_activating import input_scores, view_start_layer
from tl_query_lens.query_lens.protocols.paper import steering_rise  # shared: positions='all' here
from tl_query_lens.query_lens.steering import TeacherForced, kl_per_row

logger = logging.getLogger(__name__)

__all__ = ["input_scores", "kl_matched_alphas", "steering", "steering_top_tokens"]


def steering(model, view, features, prompts, clean_text, contexts, cfg, k: int):
    """``(S per target, achieved KL per target, α [targets, n], search KL [targets, n])`` of this protocol."""
    alphas, search_kl = kl_matched_alphas(
        model,
        view,
        features,
        clean_text,
        cfg.kl_targets,
        init=contexts.activation[features, 0],
        n_steps=cfg.n_steps,
    )
    steered, achieved = [], []
    for t in range(len(cfg.kl_targets)):
        top, kl = steering_top_tokens(
            model,
            view,
            features,
            alphas[t],
            prompts,
            n_generate=cfg.n_generate,
            temperature=cfg.temperature,
            seed=cfg.seed + 1 + t,
            n_steered=cfg.n_steered,
        )
        steered.append(top)
        achieved.append(kl)
    return steered, achieved, alphas, search_kl


@torch.no_grad()
def kl_matched_alphas(
    model: HookedTransformer,
    dictionary,
    features: Int[torch.Tensor, " n"],
    sequences: Sequence[Int[torch.Tensor, " pos"]],
    kl_targets: Sequence[float],
    *,
    init: Float[torch.Tensor, " n"] | None = None,
    n_steps: int = 8,
    growth: float = 4.0,
    max_growth_steps: int = 8,
) -> tuple[Float[torch.Tensor, "n_targets n"], Float[torch.Tensor, "n_targets n"]]:
    """Clamp values α ≥ 0 with KL(clean ‖ steered) ≈ target, all features and targets in one batch (docs/design.md §5).

    KL is averaged over positions of the teacher-forced ``sequences`` and then over sequences. The bracket [0, hi]
    grows hi by ``growth`` (from ``init``, e.g. the max corpus activation) until KL(hi) ≥ target, then ``n_steps``
    bisection steps follow; the α whose KL is closest to the target (in log ratio) among all evaluated is returned.

    Returns:
        (alphas, kls), both ``[n_targets, n]``.
    """
    view = as_key_value(dictionary, model)
    start = view_start_layer(view)
    runs = [TeacherForced(model, s[None], start) for s in sequences]
    n, n_t = len(features), len(kl_targets)
    feats = features.repeat(n_t)
    target = torch.tensor(list(kl_targets), dtype=torch.float32).repeat_interleave(n)

    def kl_at(rows: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(len(rows))
        for run in runs:
            steered = run.steered_logprobs(view, feats[rows], alpha, torch.zeros(len(rows), dtype=torch.long))
            total += kl_per_row(run.logprobs, steered).cpu()
        return total / len(runs)

    best_alpha, best_err = torch.zeros(n * n_t), torch.full((n * n_t,), float("inf"))
    best_kl = torch.full((n * n_t,), float("nan"))

    def record(rows: torch.Tensor, alpha: torch.Tensor, kl: torch.Tensor) -> None:
        err = (kl.clamp_min(1e-12) / target[rows]).log().abs()
        better = err < best_err[rows]
        best_err[rows[better]], best_alpha[rows[better]], best_kl[rows[better]] = err[better], alpha[better], kl[better]

    init = torch.ones(n) if init is None else init.float().abs().clamp_min(1e-3)
    lo, hi = torch.zeros(n * n_t), init.repeat(n_t).clone()
    todo = torch.arange(n * n_t)
    for _ in range(max_growth_steps):
        kl = kl_at(todo, hi[todo])
        record(todo, hi[todo], kl)
        low = kl < target[todo]
        lo[todo[low]] = hi[todo[low]]
        todo = todo[low]
        if not len(todo):
            break
        hi[todo] *= growth
    if len(todo):
        logger.warning(
            "%d (feature, target) pairs never reached their KL target; α capped at %s", len(todo), hi[todo].tolist()[:5]
        )
    rows = torch.arange(n * n_t)
    for _ in tqdm(range(n_steps), desc="α bisection", leave=False):
        mid = (lo + hi) / 2
        kl = kl_at(rows, mid)
        record(rows, mid, kl)
        below = kl < target
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return best_alpha.reshape(n_t, n), best_kl.reshape(n_t, n)


@torch.no_grad()
def steering_top_tokens(
    model: HookedTransformer,
    dictionary,
    features: Int[torch.Tensor, " n"],
    alphas: Float[torch.Tensor, " n"],
    prompts: Sequence[Int[torch.Tensor, " pos"]],
    *,
    n_generate: int = 20,
    temperature: float = 0.75,
    seed: int = 0,
    n_steered: int = 25,
) -> tuple[Int[torch.Tensor, "n n_steered"], Float[torch.Tensor, " n"]]:
    """S: the tokens whose rank percentile rises most under steering, and the KL reached on the steered text.

    Each prompt is continued by sampling with feature i clamped to α_i on prompt and generated positions; the rise is
    pct_steered − pct_clean, both teacher-forced on those same tokens, averaged over positions and prompts.
    """
    rise, kl = steering_rise(
        model,
        as_key_value(dictionary, model),
        features,
        alphas,
        prompts,
        n_generate=n_generate,
        temperature=temperature,
        seed=seed,
        positions="all",
    )
    return rise.topk(n_steered, dim=-1).indices, kl
