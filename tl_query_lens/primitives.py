"""Shared primitives: every method reads these, none re-writes them.

Splicing at a hook (:func:`splice_hooks`), keeping the first positions of every window clean
(:func:`write_from`; the check of how many is :func:`tl_query_lens.config.check_first_positions`), re-running from a cached clean residual (:func:`clean_run`,
:func:`run_from_residual`), TopK (:func:`topk_mask`, :func:`topk_relu`, :func:`topk_relu_codes`), KL
(:func:`kl_divergence`), top-k id-set overlap (:func:`row_jaccard`), where a truncated forward pass may stop (:func:`stop_layer`), percentile bootstraps
(:func:`bootstrap_indices`, :func:`mean_ci`, :func:`cluster_bootstrap`) and the readout SAE's μ / a_t row
normalisation (:func:`normalise_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from tl_query_lens.hooks import (
    hook_layer,
    stop_layer,  # noqa: F401  (re-exported: it lives beside hook_layer now)
)

LOG2 = math.log(2.0)

Edit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def splice_hooks(read_hook: str, write_hook: str, edit: Edit) -> list[tuple[str, Callable]]:
    """Forward hooks that replace the activation at ``write_hook`` by ``edit(x, act)``, where ``x`` is the activation
    at ``read_hook`` of the same pass (the same tensor when the hooks coincide). The write hook must run after the read
    hook (a transcoder reads the MLP input and writes ``hook_mlp_out``)."""
    if read_hook == write_hook:
        return [(write_hook, lambda act, hook: edit(act, act))]
    captured: dict[str, torch.Tensor] = {}

    def read(act: torch.Tensor, hook) -> None:
        captured["x"] = act

    def write(act: torch.Tensor, hook) -> torch.Tensor:
        return edit(captured.pop("x"), act)

    return [(read_hook, read), (write_hook, write)]


def write_from(first: int, written: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    """``act`` with positions ``first:`` (axis 1) replaced by ``written`` (shaped like ``act[:, first:]``); the
    positions before ``first`` keep ``act`` (a splice that keeps the first positions clean; ``first=0`` returns
    ``written`` itself, reshaped and cast to ``act``'s dtype)."""
    written = written.reshape(act[:, first:].shape).to(act.dtype)
    if first == 0:
        return written
    out = act.clone()
    out[:, first:] = written
    return out


def resid_pre(layer: int) -> str:
    """``blocks.{layer}.hook_resid_pre``: where a pass resumed at ``layer`` starts."""
    return f"blocks.{layer}.hook_resid_pre"


@torch.no_grad()
def clean_run(
    model: HookedTransformer, tokens: Int[torch.Tensor, "batch pos"], start_layers: Iterable[int | None]
) -> tuple[Float[torch.Tensor, "batch pos d_vocab"], dict[int, Float[torch.Tensor, "batch pos d_model"]]]:
    """One clean forward pass: its logits and the residual entering each block in ``start_layers`` (None skipped),
    so edits that cannot change anything before a block re-run only from there (:func:`run_from_residual`)."""
    names = [resid_pre(layer) for layer in sorted({x for x in start_layers if x is not None})]
    logits, cache = model.run_with_cache(tokens, names_filter=names)
    return logits, {hook_layer(name): cache[name] for name in names}  # type: ignore[misc, return-value]


def run_from_residual(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    resid: dict[int, torch.Tensor],
    start_layer: int | None,
    hooks: Sequence[tuple[str, Callable]],
    rows: torch.Tensor | None = None,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits of the pass with ``hooks``, resumed from the clean residual at ``start_layer`` (from the tokens when it
    is None); ``rows`` selects batch rows of the cached residual / tokens."""
    if start_layer is None:
        start = tokens if rows is None else tokens[rows]
        return model.run_with_hooks(start, fwd_hooks=list(hooks))
    start = resid[start_layer] if rows is None else resid[start_layer][rows]
    return model.run_with_hooks(start, start_at_layer=start_layer, fwd_hooks=list(hooks))


# ----- TopK ----------------------------------------------------------------------------------------------------------
def topk_mask(acts: torch.Tensor, k: int, *, by: Literal["magnitude", "value"] = "magnitude") -> torch.Tensor:
    """Keep the k largest entries of the last axis (by |a| or by a) with their values, zero the rest."""
    if k >= acts.shape[-1]:
        return acts
    score = acts.abs() if by == "magnitude" else acts
    idx = score.topk(k, dim=-1).indices
    return torch.zeros_like(acts).scatter(-1, idx, acts.gather(-1, idx))


def topk_relu_codes(pre: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse TopK_k(ReLU(pre)) over the last axis as ``(indices, values)`` ``[..., k]`` (ties broken by topk)."""
    top = pre.topk(k, dim=-1)
    return top.indices, torch.relu(top.values)


def topk_relu(pre: torch.Tensor, k: int) -> torch.Tensor:
    """Dense TopK_k(ReLU(pre)) over the last axis."""
    idx, val = topk_relu_codes(pre, k)
    return torch.zeros_like(pre).scatter(-1, idx, val)


def row_jaccard(
    a: Int[torch.Tensor, "n k"], b: Int[torch.Tensor, "n k2"], *, pad: int = -1
) -> Float[torch.Tensor, " n"]:
    """Per-row Jaccard overlap |A ∩ B| / |A ∪ B| of two id tables (e.g. top-k signatures of two runs); entries equal
    to ``pad`` are left out (rows padded to a common k), and two empty rows count as 1."""
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"row_jaccard needs the same number of rows, got {a.shape[0]} and {b.shape[0]}.")
    scores = []
    for x, y in zip(a.tolist(), b.tolist()):
        sx, sy = set(x) - {pad}, set(y) - {pad}
        union = len(sx | sy)
        scores.append(len(sx & sy) / union if union else 1.0)
    return torch.tensor(scores, dtype=torch.float64)


# ----- divergences ---------------------------------------------------------------------------------------------------
def kl_divergence(
    logp: Float[torch.Tensor, "... d_vocab"], logq: Float[torch.Tensor, "... d_vocab"]
) -> Float[torch.Tensor, ...]:
    """KL(p ‖ q) in nats over the last axis, from log-probabilities (divide by :data:`LOG2` for bits)."""
    return (logp.exp() * (logp - logq)).sum(-1)


# ----- bootstrap -----------------------------------------------------------------------------------------------------
def bootstrap_indices(n: int, *, n_boot: int = 2000, seed: int = 0) -> torch.Tensor:
    """``[n_boot, n]`` resampling indices (shared by methods, so their CIs are paired)."""
    return torch.randint(0, n, (n_boot, n), generator=torch.Generator().manual_seed(seed))


def mean_ci(name: str, scores: torch.Tensor, idx: torch.Tensor) -> dict[str, float]:
    """Mean of ``scores`` in percent and its percentile-bootstrap 95% CI over the resamples ``idx``."""
    boot = scores.double()[idx].mean(1)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.double)).tolist()
    return {f"{name}": 100 * scores.double().mean().item(), f"{name}_lo": 100 * lo, f"{name}_hi": 100 * hi}


def cluster_bootstrap(
    values: torch.Tensor, clusters: torch.Tensor, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> list[float]:
    """Percentile CI of a mean, resampling clusters (e.g. sequences) with replacement."""
    ids, inv = clusters.unique(return_inverse=True)
    sums = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inv, values.double())
    ones = torch.ones_like(values, dtype=torch.float64)
    counts = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inv, ones)
    draws = torch.randint(len(ids), (n_boot, len(ids)), generator=torch.Generator().manual_seed(seed))
    stats = sums[draws].sum(1) / counts[draws].sum(1).clamp_min(1)
    probs = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(stats, probs).tolist()
    return [lo, hi]


# ----- readout rows --------------------------------------------------------------------------------------------------
def normalise_rows(
    rows: Float[torch.Tensor, "d_vocab d_model"], mu: Float[torch.Tensor, " d_model"] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(μ, a, x)``: μ the mean row (or the given one), a_t = ‖w_t − μ‖, x_t = (w_t − μ)/a_t (docs/design.md §6)."""
    mu = rows.mean(0) if mu is None else mu
    centred = rows - mu
    a = centred.norm(dim=-1)
    return mu, a, centred / a.clamp_min(torch.finfo(centred.dtype).tiny)[:, None]
