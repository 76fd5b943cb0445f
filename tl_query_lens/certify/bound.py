"""The certificate's risk bound from per-sequence losses (docs/design.md §7, arXiv 2606.18383).

U = R̂(h_G) + ε̂ + Δη̂ + Δ√(ln(3/δ)/2N) + Δ√(ln(3/δ)/2N) + Δ√(ln(6/δ)/2N)
Occam: the first Hoeffding term becomes Δ√((ln C(m,P) + ln(3/δ))/2N).
Non-trivial when U < log₂|V|. Everything here is plain arithmetic on tensors, independent of any model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float


def loss_range_bits(d_vocab: int, alpha: float) -> float:
    """Δ = log₂(1 + (1−α)|V|/α), the range of the smoothed per-sequence loss (docs/design.md §7)."""
    return math.log2(1.0 + (1.0 - alpha) * d_vocab / alpha)


def log_binomial(m: int, p: int) -> float:
    """ln C(m, p) via lgamma (exact to float precision for any m)."""
    if not 0 <= p <= m:
        raise ValueError(f"ln C(m, P) needs 0 <= P <= m, got m={m}, P={p}.")
    return math.lgamma(m + 1) - math.lgamma(p + 1) - math.lgamma(m - p + 1)


def hoeffding_coefficient(delta_bits: float, delta: float, *, log_choose: float | None = None) -> float:
    """A such that the three Hoeffding terms sum to A/√N.

    A = Δ(√(ln(3/δ)/2) + √(ln(3/δ)/2) + √(ln(6/δ)/2)); with ``log_choose`` = ln C(m,P) (Occam) the first term is
    Δ√((ln C(m,P) + ln(3/δ))/2).
    """
    first = math.log(3 / delta) + (log_choose or 0.0)
    return delta_bits * (math.sqrt(first / 2) + math.sqrt(math.log(3 / delta) / 2) + math.sqrt(math.log(6 / delta) / 2))


def min_sequences(baseline_bits: float, coefficient: float) -> int:
    """Smallest N whose Hoeffding terms alone (A/√N) fall below the baseline: ⌊(A/log₂|V|)²⌋ + 1."""
    return math.floor((coefficient / baseline_bits) ** 2) + 1


@dataclass
class BoundTerms:
    """The bound's terms at one N.

    Attributes:
        N: evaluation sequences used (a prefix of the evaluation split).
        R_hat: mean loss of the restricted proxy h_G (bits).
        eps_hat: mean |ℓ(M) − ℓ(S∘M)| (bits).
        eta_hat: share of sequences whose support leaves the pool G*.
        hoeffding: the three concentration terms, summed (A/√N).
        hoeffding_occam: the same with the Occam first term.
        bound: U.
        bound_occam: U with the Occam term.
    """

    N: int
    R_hat: float
    eps_hat: float
    eta_hat: float
    hoeffding: float
    hoeffding_occam: float
    bound: float
    bound_occam: float


def bound_terms(
    loss_clean: Float[torch.Tensor, " n_seqs"],
    loss_proxy: Float[torch.Tensor, " n_seqs"],
    loss_restricted: Float[torch.Tensor, " n_seqs"],
    leaves_pool: Bool[torch.Tensor, " n_seqs"],
    *,
    P: int,
    m: int,
    d_vocab: int,
    alpha: float = 0.5,
    delta: float = 0.05,
) -> BoundTerms:
    """Every term of the bound (docs/design.md §7) on the given sequences (N = their number).

    Args:
        loss_clean: ℓ(M) per sequence, bits.
        loss_proxy: ℓ(S∘M) per sequence, bits.
        loss_restricted: ℓ(h_G) per sequence, bits.
        leaves_pool: True where the sequence's TopK support is not inside G*.
        P: |G*|. m: dictionary size F.
        d_vocab: |V|. alpha: smoothing weight. delta: failure probability.
    """
    n = int(loss_clean.shape[0])
    if n == 0:
        raise ValueError("No evaluation sequences: the bound needs N >= 1.")
    delta_bits = loss_range_bits(d_vocab, alpha)
    r_hat = loss_restricted.double().mean().item()
    eps_hat = (loss_clean.double() - loss_proxy.double()).abs().mean().item()
    eta_hat = leaves_pool.double().mean().item()
    a = hoeffding_coefficient(delta_bits, delta)
    a_occam = hoeffding_coefficient(delta_bits, delta, log_choose=log_binomial(m, P))
    c = r_hat + eps_hat + delta_bits * eta_hat
    return BoundTerms(
        N=n,
        R_hat=r_hat,
        eps_hat=eps_hat,
        eta_hat=eta_hat,
        hoeffding=a / math.sqrt(n),
        hoeffding_occam=a_occam / math.sqrt(n),
        bound=c + a / math.sqrt(n),
        bound_occam=c + a_occam / math.sqrt(n),
    )


def crossing_n(
    curve_n: list[int], curve_bound: list[float], *, constant: float, coefficient: float, baseline_bits: float
) -> tuple[float, bool]:
    """N*: the first scheduled N with U < log₂|V| (observed), else (A/(log₂|V| − C))² (extrapolated; inf if C ≥ it).

    Returns:
        ``(N_star, observed)``.
    """
    for n, u in zip(curve_n, curve_bound):
        if u < baseline_bits:
            return float(n), True
    if constant >= baseline_bits:
        return math.inf, False
    return (coefficient / (baseline_bits - constant)) ** 2, False


def default_schedule(n_total: int, *, start: int = 25, points: int = 12) -> list[int]:
    """Geometric schedule of prefix sizes from ``start`` to ``n_total`` (always ends at ``n_total``)."""
    if n_total <= start:
        return [n_total]
    ratio = (n_total / start) ** (1 / (points - 1))
    sched = sorted({min(n_total, round(start * ratio**i)) for i in range(points)} | {n_total})
    return sched
