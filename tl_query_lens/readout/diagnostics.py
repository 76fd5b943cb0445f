"""Fidelity diagnostics of a readout reconstruction Ŵ (docs/design.md §6): rowEV, top-1, KL, ρ_δ, coverage, ablation.

Every method (the readout SAE and each row-geometry baseline) is scored through the same function from its
reconstructed rows ŵ_t = μ + a_t x̂_t, so all share one accounting. A bank of selected scores is built once per
held-out state (the dense head's top-1 t₁, runner-up t₂, its top-20 list):
token logit (e_t₁), top-1 vs competitor (e_t₁ − e_t₂), margin (e_a − e_b, a ≠ b drawn from the top 20),
group mean (mean of the top 5), vocabulary-mean contrast (e_t₁ − 1/|V|). For ŵ the reconstructed score is
h·Σ α_t ŵ_t = bias + Σ_i c_i, and the residual ε = s_exact − s_recon.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float

from tl_query_lens.primitives import LOG2, cluster_bootstrap, kl_divergence
from tl_query_lens.readout.decompose import decompose_rows
from tl_query_lens.readout.states import StateBank
from tl_query_lens.results import SavableResult

FAMILIES = ("token_logit", "top1_vs_competitor", "margin", "group_mean", "vocab_mean_contrast")
CONTRASTS = ("top1_vs_competitor", "margin", "vocab_mean_contrast")


@dataclass
class ScoreBank:
    """Selected scores over held-out states: which tokens enter each family, per state."""

    top1: torch.Tensor
    runner_up: torch.Tensor
    margin_pair: torch.Tensor  # [n, 2]
    group: torch.Tensor  # [n, 5]
    sequence: torch.Tensor


@dataclass
class ReadoutEval(SavableResult):
    """Fidelity of one reconstruction on held-out states.

    Attributes:
        method: "srp" or a baseline name.
        row_ev: 1 − Σ‖w_t − ŵ_t‖² / Σ‖w_t − μ‖².
        top1: share of states whose argmax under ŵ equals the dense head's.
        kl_mean_bits, kl_median_bits: KL(p_W ‖ p_Ŵ) in bits.
        coverage: share of contrast scores with matching sign and ρ_0 < 0.5, with a cluster-bootstrap CI.
        coverage_by_family: coverage per score family (all five).
        rho_median: median ρ_δ (δ = 0.5) over contrast scores.
        sign_agreement: share of contrast scores whose sign is kept.
        n_states, n_clusters: held-out states and sequences (the bootstrap clusters).
    """

    method: str
    row_ev: float
    top1: float
    top1_ci: list[float]
    kl_mean_bits: float
    kl_median_bits: float
    coverage: float
    coverage_ci: list[float]
    coverage_by_family: dict[str, float]
    rho_median: float
    sign_agreement: float
    n_states: int
    n_clusters: int
    extra: dict = field(default_factory=dict)


def rho(eps: torch.Tensor, exact: torch.Tensor, delta: float = 0.5) -> torch.Tensor:
    """ρ_δ = |ε| / (|s_exact| + δ) (docs/design.md §6)."""
    return eps.abs() / (exact.abs() + delta)


def covered(recon: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Matching sign and ρ_0 < 0.5."""
    return (torch.sign(recon) == torch.sign(exact)) & (rho(exact - recon, exact, 0.0) < 0.5)


@torch.no_grad()
def build_score_bank(bank: StateBank, rows: torch.Tensor, b_U: torch.Tensor, *, seed: int = 0) -> ScoreBank:
    """Pick the tokens of each score family for every held-out state (from the dense head's ranking)."""
    gen = torch.Generator().manual_seed(seed)
    tops = []
    for chunk in bank.states.split(512):
        tops.append((chunk.to(rows) @ rows.T + b_U).topk(20, dim=-1).indices.cpu())
    top = torch.cat(tops)
    n = top.shape[0]
    a = torch.randint(20, (n,), generator=gen)
    b = (a + torch.randint(1, 20, (n,), generator=gen)) % 20
    pair = torch.stack([top.gather(1, a[:, None])[:, 0], top.gather(1, b[:, None])[:, 0]], 1)
    return ScoreBank(top[:, 0], top[:, 1], pair, top[:, :5], bank.sequence.clone())


@torch.no_grad()
def _family_scores(logits: torch.Tensor, mean_logit: torch.Tensor, sb: ScoreBank, sl: slice) -> dict[str, torch.Tensor]:
    g = lambda t: logits.gather(1, t.to(logits.device)[:, None] if t.ndim == 1 else t.to(logits.device))
    top1, ru, pair, grp = sb.top1[sl], sb.runner_up[sl], sb.margin_pair[sl], sb.group[sl]
    s1 = g(top1)[:, 0]
    return {
        "token_logit": s1,
        "top1_vs_competitor": s1 - g(ru)[:, 0],
        "margin": g(pair)[:, 0] - g(pair)[:, 1],
        "group_mean": g(grp).mean(1),
        "vocab_mean_contrast": s1 - mean_logit,
    }


@torch.no_grad()
def evaluate_reconstruction(
    method: str,
    rows: Float[torch.Tensor, "d_vocab d_model"],
    rows_hat: Float[torch.Tensor, "d_vocab d_model"],
    bank: StateBank,
    *,
    b_U: torch.Tensor | None = None,
    score_bank: ScoreBank | None = None,
    n_boot: int = 1000,
    chunk: int = 256,
    dense_cache: dict | None = None,
) -> ReadoutEval:
    """All diagnostics of ``rows_hat`` against the dense rows on held-out decoded states.

    ``dense_cache`` (a dict, filled on first use) keeps the dense head's per-chunk results for the next method.
    """
    rows, rows_hat = rows.float(), rows_hat.to(rows).float()
    b_U = torch.zeros(rows.shape[0], device=rows.device) if b_U is None else b_U.to(rows).float()
    sb = score_bank or build_score_bank(bank, rows, b_U)
    mu = rows.mean(0)
    row_ev = 1.0 - ((rows - rows_hat) ** 2).sum().item() / ((rows - mu) ** 2).sum().item()
    mean_row, mean_row_hat = rows.mean(0), rows_hat.mean(0)
    agree: list[torch.Tensor] = []
    kls: list[torch.Tensor] = []
    exact: dict[str, list[torch.Tensor]] = {f: [] for f in FAMILIES}
    recon: dict[str, list[torch.Tensor]] = {f: [] for f in FAMILIES}
    for start in range(0, len(bank), chunk):
        sl = slice(start, start + chunk)
        h = bank.states[sl].to(rows)
        if dense_cache is not None and start in dense_cache:
            arg_w, logp, fam_w = dense_cache[start]
        else:
            lw = h @ rows.T
            zw = lw + b_U
            arg_w, logp, fam_w = zw.argmax(-1), zw.log_softmax(-1), _family_scores(lw, h @ mean_row, sb, sl)
            if dense_cache is not None:
                dense_cache[start] = (arg_w, logp, fam_w)
        lh = h @ rows_hat.T
        zh = lh + b_U
        agree.append((arg_w == zh.argmax(-1)).float().cpu())
        logq = zh.log_softmax(-1)
        kls.append((kl_divergence(logp, logq) / LOG2).cpu())
        for fam, val in fam_w.items():
            exact[fam].append(val.cpu())
        for fam, val in _family_scores(lh, h @ mean_row_hat, sb, sl).items():
            recon[fam].append(val.cpu())
    agree_t, kl_t = torch.cat(agree), torch.cat(kls)
    ex = {f: torch.cat(v).double() for f, v in exact.items()}
    rc = {f: torch.cat(v).double() for f, v in recon.items()}
    cov_by = {f: covered(rc[f], ex[f]).float().mean().item() for f in FAMILIES}
    ex_c = torch.cat([ex[f] for f in CONTRASTS])
    rc_c = torch.cat([rc[f] for f in CONTRASTS])
    clusters = sb.sequence.repeat(len(CONTRASTS))
    cov_c = covered(rc_c, ex_c).float()
    return ReadoutEval(
        method=method,
        row_ev=row_ev,
        top1=agree_t.mean().item(),
        top1_ci=cluster_bootstrap(agree_t, sb.sequence, n_boot=n_boot),
        kl_mean_bits=kl_t.mean().item(),
        kl_median_bits=kl_t.median().item(),
        coverage=cov_c.mean().item(),
        coverage_ci=cluster_bootstrap(cov_c, clusters, n_boot=n_boot),
        coverage_by_family=cov_by,
        rho_median=rho(ex_c - rc_c, ex_c).median().item(),
        sign_agreement=(torch.sign(rc_c) == torch.sign(ex_c)).float().mean().item(),
        n_states=len(bank),
        n_clusters=int(sb.sequence.unique().numel()),
    )


@dataclass
class AblationRegression(SavableResult):
    """Measured Δs of h' = h − (h·d_i)d_i under the dense head vs the predicted −c_i (docs/design.md §6).

    r² is the squared Pearson correlation; the slope is the least-squares fit through the origin.
    The control replaces d_i by a random unit direction and keeps the predicted −c_i.
    """

    r2: float
    slope: float
    r2_random: float
    slope_random: float
    n_points: int


def _fit(pred: torch.Tensor, meas: torch.Tensor) -> tuple[float, float]:
    r = torch.corrcoef(torch.stack([pred, meas]))[0, 1].item()
    return r * r, ((pred * meas).sum() / (pred * pred).sum()).item()


@torch.no_grad()
def ablation_regression(
    sae, rows: torch.Tensor, bank: StateBank, *, n_features: int = 3, max_states: int = 512, seed: int = 0
) -> AblationRegression:
    """Ablate each of the top-``n_features`` |c_i| of the top-1-vs-competitor score of held-out states."""
    gen = torch.Generator().manual_seed(seed)
    rows = rows.float()
    b_U = torch.zeros(rows.shape[0])
    sb = build_score_bank(bank, rows, b_U)
    D = sae.W_dec.detach().double()
    preds, meas, meas_rand = [], [], []
    n = min(len(bank), max_states)
    for j in range(n):
        alpha = torch.zeros(rows.shape[0])
        alpha[sb.top1[j]] += 1.0
        alpha[sb.runner_up[j]] -= 1.0
        h = bank.states[j]
        dec = decompose_rows(sae, h, alpha, rows, n_top=0)
        q = alpha.double() @ rows.double()  # dense head direction q_α
        hd = h.double()
        s0 = hd @ q
        for i, c in dec.top(n_features):
            d = D[i]
            preds.append(-c)
            meas.append((hd - (hd @ d) * d) @ q - s0)  # h' = h − (h·d_i)d_i, scored by the dense head
            u = torch.randn(d.shape[0], generator=gen, dtype=torch.float64)
            u = u / u.norm()
            meas_rand.append((hd - (hd @ u) * u) @ q - s0)
    p, m, mr = (torch.tensor([float(v) for v in x], dtype=torch.float64) for x in (preds, meas, meas_rand))
    r2, slope = _fit(p, m)
    r2r, slope_r = _fit(p, mr)
    return AblationRegression(r2=r2, slope=slope, r2_random=r2r, slope_random=slope_r, n_points=len(preds))
