"""The bound of docs/design.md §7 against numbers worked out by hand (arithmetic in the comments)."""

import math

import pytest
import torch

from tl_query_lens.certify.bound import (
    bound_terms,
    crossing_n,
    hoeffding_coefficient,
    log_binomial,
    loss_range_bits,
    min_sequences,
)
from tl_query_lens.certify.certify import Certificate, build_certificate
from tl_query_lens.certify.config import CertifyConfig
from tl_query_lens.certify.losses import ProxyLosses

# Hand example: |V| = 3, α = 1/2  →  Δ = log₂(1 + (1/2)·3/(1/2)) = log₂ 4 = 2.
# δ = 3/e²  →  ln(3/δ) = 2 exactly, ln(6/δ) = 2 + ln 2 = 2.693147.
V, ALPHA, DELTA = 3, 0.5, 3 * math.exp(-2)
CLEAN = torch.tensor([1.0, 1.5, 1.0, 2.0])
PROXY = torch.tensor([1.5, 1.5, 0.5, 2.0])  # |ℓ(M) − ℓ(S∘M)| = 0.5, 0, 0.5, 0  →  ε̂ = 1/4
RESTRICTED = torch.tensor([1.5, 2.0, 0.5, 2.0])  # R̂ = 6/4 = 1.5
LEAVES = torch.tensor([False, True, False, False])  # η̂ = 1/4, Δη̂ = 0.5
# N = 4: Δ√(ln(3/δ)/2N) = 2·√(2/8) = 1 (twice); Δ√(ln(6/δ)/2N) = 2·√(2.693147/8) = 2·0.580210 = 1.160420.
# U = 1.5 + 0.25 + 0.5 + 1 + 1 + 1.160420 = 5.410420.
# Occam, m = 4, P = 2: ln C(4,2) = ln 6 = 1.791759; 2·√((1.791759 + 2)/8) = 2·0.688455 = 1.376910.
# U_occam = 2.25 + 1.376910 + 1 + 1.160420 = 5.787330.
U_HAND, U_OCCAM_HAND = 5.410420, 5.787330


def test_loss_range_and_log_binomial_by_hand():
    assert loss_range_bits(3, 0.5) == pytest.approx(2.0)
    # |V| = 49152: Δ = log₂(49153) = log₂ 49152 + log₂(1 + 1/49152) ≈ 15.5849625 + 1/(49152·ln 2) = 15.5849625
    # + 0.0000294 = 15.5849919.
    assert loss_range_bits(49152, 0.5) == pytest.approx(15.5849919, abs=1e-6)
    assert log_binomial(4, 2) == pytest.approx(math.log(6))
    assert log_binomial(10, 0) == pytest.approx(0.0, abs=1e-12)
    assert log_binomial(52, 5) == pytest.approx(math.log(2598960))  # poker hands
    with pytest.raises(ValueError, match="0 <= P <= m"):
        log_binomial(3, 4)


def test_bound_terms_match_the_hand_example():
    t = bound_terms(CLEAN, PROXY, RESTRICTED, LEAVES, P=2, m=4, d_vocab=V, alpha=ALPHA, delta=DELTA)
    assert (t.N, t.R_hat, t.eps_hat, t.eta_hat) == (4, 1.5, 0.25, 0.25)
    assert t.hoeffding == pytest.approx(1 + 1 + 1.160420, abs=1e-6)
    assert t.hoeffding_occam == pytest.approx(1.376910 + 1 + 1.160420, abs=1e-6)
    assert t.bound == pytest.approx(U_HAND, abs=1e-6)
    assert t.bound_occam == pytest.approx(U_OCCAM_HAND, abs=1e-6)


def test_min_sequences_and_crossing_by_hand():
    # A for |V| = 49152, α = ½, δ = 0.05: Δ·(2·√(ln 60/2) + √(ln 120/2)) = 15.584993·(2·1.430794 + 1.547174)
    # = 15.584992·4.408762 = 68.7105; (A/log₂|V|)² ≈ 4.40877² = 19.437 → the minimum N is 20.
    a = hoeffding_coefficient(loss_range_bits(49152, 0.5), 0.05)
    assert a == pytest.approx(68.7105, abs=1e-3)
    assert min_sequences(math.log2(49152), a) == 20
    # Curve U = 5 + 100/√N at N = 25, 64: 25, 17.5; baseline 15 → never crossed; N* = (100/(15 − 5))² = 100.
    assert crossing_n([25, 64], [25.0, 17.5], constant=5.0, coefficient=100.0, baseline_bits=15.0) == (100.0, False)
    # Adding N = 400: U = 10 < 15 → observed N* = 400.
    assert crossing_n([25, 64, 400], [25.0, 17.5, 10.0], constant=5.0, coefficient=100.0, baseline_bits=15.0) == (
        400.0,
        True,
    )
    # C ≥ baseline → never: inf.
    assert crossing_n([25], [30.0], constant=15.0, coefficient=100.0, baseline_bits=15.0) == (math.inf, False)


def test_certificate_from_hand_losses_and_save_load(tmp_path):
    losses = ProxyLosses(
        loss_proxy=PROXY,
        loss_restricted=RESTRICTED,
        leaves_pool=LEAVES,
        kl_bits=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        top1=torch.tensor([1.0, 0.5, 0.5, 1.0]),
    )
    pool = torch.tensor([True, False, True, False])  # P = 2, m = 4
    cert = build_certificate(
        CLEAN, losses, pool, d_vocab=V, cfg=CertifyConfig(delta=DELTA, alpha=ALPHA, n_schedule=[2, 4])
    )
    assert (cert.P, cert.m, cert.N, cert.Delta) == (2, 4, 4, 2.0)
    assert cert.bound == pytest.approx(U_HAND, abs=1e-6)
    assert cert.bound_occam == pytest.approx(U_OCCAM_HAND, abs=1e-6)
    assert cert.baseline_bits == pytest.approx(math.log2(3))
    # C = 2.25 ≥ log₂3 = 1.585 → trivial, N* = inf (extrapolated).
    assert not cert.nontrivial and cert.N_star == math.inf and not cert.N_star_observed
    assert cert.kl_bits == pytest.approx(0.25) and cert.top1_agreement == pytest.approx(0.75)
    # Prefix N = 2: R̂ = (1.5 + 2)/2 = 1.75, ε̂ = 0.25, η̂ = 0.5 (Δη̂ = 1); Hoeffding: 2·√(2/4)·2 + 2·√(2.693147/4)
    # = 2.828427 + 1.641081 = 4.469508 → U(2) = 1.75 + 0.25 + 1 + 4.469508 = 7.469508.
    assert cert.curve_N == [2, 4]
    assert cert.curve_bound[0] == pytest.approx(7.469508, abs=1e-6)
    cert.save(tmp_path / "c")
    back = Certificate.load(tmp_path / "c")
    assert back.N_star == math.inf and back.bound == cert.bound
    assert torch.equal(back.leaves_pool, LEAVES) and torch.equal(back.pool, pool)
