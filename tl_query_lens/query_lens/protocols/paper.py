"""The Query Lens authors' Table-1 protocol pieces (HYU-NLP/query-lens, checked; docs/design.md §5), beside this project's.

Where ``EvaluationConfig(protocol="paper")`` departs from this project's ``"tlql"`` protocol (``protocols/tlql.py``):
  * input score: token strings normalised by replacing ▁ / Ġ with a space and Ċ with a newline only (no strip, no
    lower-casing: " Paris", "Paris" and " paris" are three strings) — :func:`normalise_token_paper`;
  * α: the smallest integer in [1, 1000] whose KL(clean ‖ steered), measured on the neutral prompts themselves
    (teacher-forced), reaches the target, by integer bisection — :func:`integer_alphas`;
  * S: ONE token set per feature, the top-|T| tokens of the rank-percentile rise averaged over both KL targets, ranks
    taken over the generated positions only — :func:`steering_rise` (``positions="generated"``);
  * TC at α = 10 only.
For SwiGLU neurons the authors' key is the up-projection column ``W_in[:, f]`` read at ``blocks.l.hook_resid_mid``
without the ln2 Jacobian (:func:`up_projection_key_view`); this project's FF-KV key is the gate column read through
the norm (``ln2.hook_normalized``, "gate-through-norm"). Both are kept; the evaluation reports which one it scored.
Not reproduced here: ZO over the authors' corpus sample (ZO stays over the max-activating contexts), pad masking
(prompts are run one at a time without padding, so there is nothing to mask), Neuronpedia activations.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.key_value import KeyValueView
from tl_query_lens.hooks import hook_layer
from tl_query_lens.query_lens.max_activating import view_start_layer
from tl_query_lens.query_lens.steering import (
    MAX_BATCH_ROWS,
    TeacherForced,
    clamp_hooks,
    kl_per_row,
    prompt_batches,
    rank_percentiles,
    sample_continuations,
)

logger = logging.getLogger(__name__)

KeyVariant = Literal["gate-through-norm", "up-projection"]


def normalise_token_paper(text: str) -> str:
    """The authors' normalisation: ▁ and Ġ become a space, Ċ a newline; nothing else changes."""
    return text.replace("\u2581", " ").replace("\u0120", " ").replace("\u010a", "\n")


def input_scores_paper(
    tokenizer, top_tokens: Int[torch.Tensor, "n n_ctx"], signature_ids: Int[torch.Tensor, "n k"]
) -> Float[torch.Tensor, " n"]:
    """I(T) with the authors' normalisation: share of max-activating top tokens whose string is in T."""
    if top_tokens.shape[0] != signature_ids.shape[0]:
        raise ValueError("top_tokens and signature_ids must have one row per feature, in the same order.")
    decode = lambda i: normalise_token_paper(tokenizer.decode([int(i)]))
    scores = []
    for top, sig in zip(top_tokens.tolist(), signature_ids.tolist()):
        wanted = {decode(t) for t in sig}
        scores.append(sum(decode(t) in wanted for t in top) / len(top))
    return torch.tensor(scores)


@torch.no_grad()
def integer_alphas(
    model: HookedTransformer,
    view: KeyValueView,
    features: Int[torch.Tensor, " n"],
    prompts: Sequence[Int[torch.Tensor, " pos"]],
    kl_targets: Sequence[float],
    *,
    low: int = 1,
    high: int = 1000,
    max_rows: int = MAX_BATCH_ROWS,
) -> tuple[Int[torch.Tensor, "n_targets n"], Float[torch.Tensor, "n_targets n"]]:
    """Smallest integer α in [low, high] with mean KL(clean ‖ steered) ≥ target on the teacher-forced prompts.

    Integer bisection on the invariant KL(lo) < target ≤ KL(hi) (all features and targets batched, and
    equal-length prompts too, ``max_rows`` rows a pass); α = high when even high stays below the target (logged). Returns ``(alphas, kl_at_alpha)``, both ``[n_targets, n]``.
    """
    start = view_start_layer(view)
    n, n_t = len(features), len(kl_targets)
    feats = features.repeat(n_t)
    target = torch.tensor(list(kl_targets), dtype=torch.float32).repeat_interleave(n)
    # equal-length prompts share one teacher-forced batch: row j·len(feats) + r is (prompt j, feature row r)
    runs = [
        TeacherForced(model, torch.stack([prompts[j] for j in idx]), start)
        for idx in prompt_batches(prompts, len(feats), max_rows)
    ]

    def kl_at(alpha: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(len(feats))
        for run in runs:
            g = len(run.tokens)
            rows = torch.arange(g).repeat_interleave(len(feats))
            steered = run.steered_logprobs(view, feats.repeat(g), alpha.float().repeat(g), rows)
            kl = kl_per_row(run.logprobs[:, None], steered.reshape(g, len(feats), *steered.shape[1:]))
            total += kl.sum(0).cpu()
        return total / len(prompts)

    lo = torch.full((n * n_t,), low, dtype=torch.long)
    hi = torch.full((n * n_t,), high, dtype=torch.long)
    kl_lo, kl_hi = kl_at(lo), kl_at(hi)
    done_low = kl_lo >= target  # already there at the lowest α
    short = kl_hi < target
    if short.any():
        logger.warning("%d (feature, target) pairs stay below their KL target at α = %d.", int(short.sum()), high)
    while True:
        open_ = (hi - lo > 1) & ~done_low & ~short
        if not open_.any():
            break
        mid = torch.where(open_, (lo + hi) // 2, hi)
        kl_mid = kl_at(mid)
        up = open_ & (kl_mid < target)
        down = open_ & ~up
        lo, hi = torch.where(up, mid, lo), torch.where(down, mid, hi)
        kl_hi = torch.where(down, kl_mid, kl_hi)
    alpha = torch.where(done_low, lo, hi)
    kl = torch.where(done_low, kl_lo, kl_hi)
    return alpha.reshape(n_t, n), kl.reshape(n_t, n)


@torch.no_grad()
def steering_rise(
    model: HookedTransformer,
    view: KeyValueView,
    features: Int[torch.Tensor, " n"],
    alphas: Float[torch.Tensor, " n"],
    prompts: Sequence[Int[torch.Tensor, " pos"]],
    *,
    n_generate: int = 20,
    temperature: float = 0.75,
    seed: int = 0,
    positions: Literal["generated", "all"] = "generated",
    max_rows: int = MAX_BATCH_ROWS,
) -> tuple[Float[torch.Tensor, "n d_vocab"], Float[torch.Tensor, " n"]]:
    """Mean rank-percentile rise of every token when feature i is clamped to α_i, and the KL on the steered text.

    Each prompt is continued by sampling with the clamp on every position; the clean and steered distributions are
    then read teacher-forced on that text, at the ``n_generate`` positions that predicted a generated token
    (``"generated"``, the authors') or at every position (``"all"``, this project's). Equal-length prompts are
    continued in one batch of at most ``max_rows`` rows (:func:`~tl_query_lens.query_lens.steering.prompt_batches`):
    the same computation per row, but the sampling draws of prompts that share a batch come in another order than
    one prompt at a time (prompts of distinct lengths, like the default four, are drawn exactly as before).
    """
    start = view_start_layer(view)
    n = len(features)
    rise = torch.zeros(n, model.cfg.d_vocab)
    kl = torch.zeros(n)
    gen = torch.Generator().manual_seed(seed)
    for idx in prompt_batches(prompts, n, max_rows):
        # equal-length prompts generate in one batch: row j·n + i is feature i continuing prompt idx[j]
        g, length = len(idx), len(prompts[idx[0]])
        feats, alpha = features.repeat(g), alphas.repeat(g)
        text = sample_continuations(
            model,
            torch.stack([prompts[j] for j in idx]),
            n,
            n_generate=n_generate,
            temperature=temperature,
            generator=gen,
            hooks=clamp_hooks(view, feats, alpha),
        )
        run = TeacherForced(model, text, start)
        steered = run.steered_logprobs(view, feats, alpha, torch.arange(g * n))
        keep = slice(length - 1, length - 1 + n_generate) if positions == "generated" else slice(None)
        kl += kl_per_row(run.logprobs[:, keep], steered[:, keep]).reshape(g, n).sum(0).cpu()
        for r in range(g * n):
            rise[r % n] += (rank_percentiles(steered[r, keep]) - rank_percentiles(run.logprobs[r, keep])).mean(0).cpu()
    return rise / len(prompts), kl / len(prompts)


def up_projection_key_view(view: KeyValueView, model: HookedTransformer) -> KeyValueView:
    """The authors' SwiGLU neuron key: column f of the up projection ``W_in`` read at ``blocks.l.hook_resid_mid``
    (no ln2 Jacobian; TransformerLens folds the ln2 weight into ``W_in``). Only for FF-KV views of gated MLPs."""
    layer = hook_layer(view.read_hook)
    if layer is None or not view.activation.startswith("ffkv") or not model.cfg.gated_mlp:
        raise ValueError(
            f"The up-projection key exists for FF-KV dictionaries of gated (SwiGLU) MLPs; this view "
            f"reads {view.read_hook} with activation {view.activation!r}. Use the dictionary's own keys."
        )
    W_in = model.blocks[layer].mlp.W_in.detach().float()  # [d_model, d_mlp]
    read = "hook_resid_pre" if model.cfg.parallel_attn_mlp else "hook_resid_mid"  # the residual the MLP reads
    return dataclasses.replace(view, keys=W_in.T.contiguous(), read_hook=f"blocks.{layer}.{read}")


input_scores = input_scores_paper


def steering(model, view, features, prompts, clean_text, contexts, cfg, k: int):
    """The authors' output side: integer α per target (KL on the prompts), one S = top-k of the rise averaged over
    the targets, ranks over generated positions; the same S fills every target's row."""
    alphas, search_kl = integer_alphas(model, view, features, prompts, cfg.kl_targets)
    rises, achieved = [], []
    for t in range(len(cfg.kl_targets)):
        rise, kl = steering_rise(
            model,
            view,
            features,
            alphas[t].float(),
            prompts,
            n_generate=cfg.n_generate,
            temperature=cfg.temperature,
            seed=cfg.seed + 1 + t,
            positions="generated",
        )
        rises.append(rise)
        achieved.append(kl)
    shared = torch.stack(rises).mean(0).topk(k, dim=-1).indices  # |S| = |T|, as in the authors' code
    return [shared] * len(cfg.kl_targets), achieved, alphas.float(), search_kl
