"""Readout diagnostics under the Sparse Readout Prism authors' protocol (hematteo/sparse-readout-prism).

Where ``protocol="paper"`` departs from this project's ``"tlql"`` diagnostics (formerly ``"mixed-layers"``;
``protocols/tlql.py``, which runs :func:`~tl_query_lens.readout.evaluate.evaluate_readout`):
  * states: the final layer's LM-head inputs only, LN_f(h_L) (this project mixes the logit-lens states of 4 layers);
  * coverage pool: top-1 vs top-2 and top-1 vs the vocabulary mean (this project adds a random top-20 margin; the
    authors add curated A/B pairs, which this package does not ship); the vocabulary-mean side is h·μ for every
    method, exact and reconstructed alike, as the authors' pseudo-target (this project: the mean of Ŵ's rows);
  * ρ₀ = |ε|/|s| reported (this project reports ρ_δ with δ = 0.5);
  * ablation: R² of the through-origin fit (1 − Σ(m − b p)²/Σ m²) over the top-10 features of COVERED contrasts; the
    control keeps each predicted −c_i and ablates a random dictionary feature outside the top set instead (this
    project: squared Pearson r, top-3, every top-1-vs-competitor contrast, random unit directions);
  * random-support baseline: k random features per row carrying the SAE's own code magnitudes, no refit;
  * row-geometry baselines scored on the same pool, each contrast's rows rebuilt per contrast: nearest-row ridge and
    kNN whose neighbours exclude the contrast's other token (w_t₂ may not rebuild w_t₁), spherical k-means that
    reseeds dead centroids, runs 12 iterations and codes a row on its top-k centroids by |cos| with λ = 1e-4
    (widths: the SAE's and a quarter of it, k: the SAE's), its hard-assignment reading, and PCA-256. This project's
    variants (``nearest_row_ridge``, ``knn_basis``, ``kmeans_ridge_small/full``: self-only exclusion, signed
    cosine, λ = 1e-3, 10 iterations) can be scored beside them by name; the margin over the best baseline is taken
    over the authors' variants only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from tl_query_lens.config import resolve_config
from tl_query_lens.presentation import Table
from tl_query_lens.primitives import normalise_rows
from tl_query_lens.readout import baselines as bl
from tl_query_lens.readout.config import PAPER_BASELINES, PaperReadoutConfig
from tl_query_lens.readout.decompose import decompose_rows
from tl_query_lens.readout.diagnostics import cluster_bootstrap, covered
from tl_query_lens.readout.sae import ReadoutSAE, check_compatible, decode_sparse, unembedding_rows
from tl_query_lens.readout.states import StateBank
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


def through_origin_r2(pred: torch.Tensor, meas: torch.Tensor) -> tuple[float, float]:
    """(R², slope) of the least-squares fit meas ≈ b·pred through the origin: R² = 1 − Σ(m − b p)² / Σ m²."""
    pred, meas = pred.double(), meas.double()
    slope = (pred @ meas / (pred @ pred)).item()
    return 1.0 - ((meas - slope * pred) ** 2).sum().item() / (meas @ meas).item(), slope


@torch.no_grad()
def random_support_own_magnitudes(sae: ReadoutSAE, *, seed: int = 0) -> torch.Tensor:
    """Rows rebuilt from k random features each, keeping the row's own code values (no refit): μ + Σ z_t d_random."""
    gen = torch.Generator().manual_seed(seed)
    idx, val = sae.code_indices, sae.code_values
    rand = torch.stack([torch.randperm(sae.cfg.d_sae, generator=gen)[: idx.shape[1]] for _ in range(idx.shape[0])])
    W_dec = sae.W_dec.detach()
    out = torch.cat([decode_sparse(i, v, W_dec) for i, v in zip(rand.split(4096), val.split(4096))])
    return out + sae.b_dec.detach()


@dataclass
class PaperReadoutDiagnostics(SavableResult):
    """Coverage, ρ₀ and the through-origin ablation fit of a readout SAE on final-layer states.

    Attributes:
        coverage / coverage_ci: share of the pool's contrasts with matching sign and ρ₀ < 0.5 (cluster bootstrap).
        coverage_by_family: top1_vs_competitor and vocab_mean_contrast separately.
        rho0_median: median ρ₀ over the pool. top1: argmax agreement of h·Ŵ with h·W.
        coverage_random_support: the same coverage for the random-support rows (own magnitudes, no refit).
        ablation_r2 / ablation_slope: through-origin fit of measured Δs vs predicted −c_i (top features of covered
            contrasts). ablation_r2_control / ablation_slope_control: random dictionary features outside the top set.
        n_states / n_points / n_points_control: sizes.
        coverage_baselines / coverage_baselines_ci / coverage_baselines_by_family / rho0_median_baselines: the same
            pool scored by each row-geometry baseline (``config["baselines"]``).
        best_baseline / margin_over_best_baseline: the authors' baseline with the highest coverage, and the SAE's
            coverage minus it (a share, not points); None / NaN when none of the authors' baselines ran.
    """

    coverage: float
    coverage_ci: list[float]
    coverage_by_family: dict[str, float]
    rho0_median: float
    top1: float
    coverage_random_support: float
    ablation_r2: float
    ablation_slope: float
    ablation_r2_control: float
    ablation_slope_control: float
    n_states: int
    n_points: int
    n_points_control: int
    config: dict[str, Any] = field(default_factory=dict)
    coverage_baselines: dict[str, float] = field(default_factory=dict)
    coverage_baselines_ci: dict[str, list[float]] = field(default_factory=dict)
    coverage_baselines_by_family: dict[str, dict[str, float]] = field(default_factory=dict)
    rho0_median_baselines: dict[str, float] = field(default_factory=dict)
    best_baseline: str | None = None
    margin_over_best_baseline: float = float("nan")

    title: ClassVar[str] = "Readout diagnostics, paper protocol"

    def tables(self) -> dict[str, Table]:
        """``baselines``: the SAE and each row-geometry baseline on the same pool."""
        columns = {"method": str, "coverage": float, "coverage_lo": float, "coverage_hi": float, "rho0_median": float}
        rows = [["srp", self.coverage, *self.coverage_ci, self.rho0_median]]
        for name, coverage in self.coverage_baselines.items():
            lo, hi = self.coverage_baselines_ci.get(name, [float("nan"), float("nan")])
            rows.append([name, coverage, lo, hi, self.rho0_median_baselines.get(name, float("nan"))])
        return {"baselines": Table.build(columns, rows)}


def _pool(h: torch.Tensor, rows_hat: torch.Tensor, rows: torch.Tensor, b_U: torch.Tensor) -> dict[str, torch.Tensor]:
    """Exact and reconstructed scores of the two contrasts of every state ([n] each), and the dense ranking.

    The vocabulary-mean side is h·μ for both (the authors' pseudo-target row μ, reconstructed as itself).
    """
    logits = h @ rows.T
    top2 = (logits + b_U).topk(2, dim=-1).indices
    t1, t2 = top2[:, 0], top2[:, 1]
    hat = h @ rows_hat.T
    g = lambda x, t: x.gather(1, t[:, None])[:, 0]
    base = h @ rows.mean(0)
    return {
        "t1": t1,
        "t2": t2,
        "exact_comp": g(logits, t1) - g(logits, t2),
        "recon_comp": g(hat, t1) - g(hat, t2),
        "exact_mean": g(logits, t1) - base,
        "recon_mean": g(hat, t1) - base,
        "top1": ((hat + b_U).argmax(-1) == (logits + b_U).argmax(-1)).float(),
    }


RowMaker = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(targets [m], exclude [m, e]) → the reconstructed rows ŵ of ``targets`` [m, d_model]."""


def _paper_makers(sae: ReadoutSAE, rows: torch.Tensor, cfg: PaperReadoutConfig) -> dict[str, RowMaker]:
    """Each baseline as a function of the rows it must rebuild and the tokens their neighbours may not use."""
    x = normalise_rows(rows)[2]
    small, full = cfg.kmeans_widths or (max(sae.cfg.k, sae.cfg.d_sae // 4), sae.cfg.d_sae)
    k = cfg.kmeans_k or sae.cfg.k
    cache: dict[Any, torch.Tensor] = {}

    def centroids(width: int, dead: Literal["keep", "reseed"], iters: int) -> torch.Tensor:
        key = (width, dead, iters)
        if key not in cache:
            cache[key] = bl.spherical_kmeans(x, width, iters=iters, seed=cfg.seed, dead=dead)
        return cache[key]

    def paper_kmeans(width: int) -> RowMaker:
        return lambda t, e: bl.kmeans_ridge(
            rows,
            centroids(width, "reseed", cfg.kmeans_iters),
            k=k,
            ridge=cfg.kmeans_ridge,
            rank_by="abs_cos",
            targets=t,
        )

    def own_kmeans(width: int) -> RowMaker:
        return lambda t, e: bl.kmeans_ridge(rows, centroids(width, "keep", cfg.own_kmeans_iters), k=k, targets=t)

    def full_rows(name: str, build: Callable[[], torch.Tensor]) -> RowMaker:
        def make(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
            if name not in cache:
                cache[name] = build()
            return cache[name][t]

        return make

    nn: dict[str, Any] = {"n_neighbours": cfg.n_neighbours}
    return {
        "pca256": full_rows("pca256", lambda: bl.pca(rows, rank=256)),
        "hard_assignment": full_rows(
            "hard_assignment", lambda: bl.hard_assignment(rows, centroids(full, "reseed", cfg.kmeans_iters))
        ),
        "kmeans_abs_cos_small": paper_kmeans(small),
        "kmeans_abs_cos_full": paper_kmeans(full),
        "knn_basis_excl_contrast": lambda t, e: bl.knn_basis(rows, targets=t, exclude=e, **nn),
        "nearest_row_ridge_excl_contrast": lambda t, e: bl.nearest_row_ridge(
            rows, ridge=cfg.neighbour_ridge, targets=t, exclude=e, **nn
        ),
        "kmeans_ridge_small": own_kmeans(small),
        "kmeans_ridge_full": own_kmeans(full),
        "knn_basis": lambda t, e: bl.knn_basis(rows, targets=t, **nn),
        "nearest_row_ridge": lambda t, e: bl.nearest_row_ridge(rows, ridge=cfg.neighbour_ridge, targets=t, **nn),
    }


def contrast_scores(make: RowMaker, h: torch.Tensor, rows: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor):
    """Reconstructed (top-1 vs top-2, top-1 vs vocabulary mean) scores of every state under one baseline.

    ŵ_t₁ of the first contrast is rebuilt without t₂ and ŵ_t₂ without t₁; ŵ_t₁ of the vocabulary-mean contrast
    without itself only (its other side is μ), as in the authors' per-contrast accounting.
    """
    n = t1.shape[0]
    targets = torch.cat([t1, t2, t1])
    exclude = torch.cat([t2, t1, torch.full_like(t1, -1)])[:, None]
    w = make(targets, exclude).to(h)
    w1, w2, w1m = w[:n], w[n : 2 * n], w[2 * n :]
    return (h * (w1 - w2)).sum(-1), (h * w1m).sum(-1) - h @ rows.mean(0)


@torch.no_grad()
def readout_diagnostics_paper(
    model, sae: ReadoutSAE, bank: StateBank, *, cfg: PaperReadoutConfig | None = None, **overrides: Any
) -> PaperReadoutDiagnostics:
    """The authors' diagnostics on decoded final-layer states ``bank`` (collect them with
    ``collect_states(model, tokens, [f"blocks.{L-1}.hook_resid_post"])``)."""

    cfg = resolve_config(PaperReadoutConfig, cfg, overrides)
    check_compatible(sae, model)
    rows = unembedding_rows(model)
    b_U = model.b_U.detach().float()
    h = bank.states.to(rows)
    pool = _pool(h, sae.reconstructed_rows().to(rows), rows, b_U)
    cov = {
        "top1_vs_competitor": covered(pool["recon_comp"].double(), pool["exact_comp"].double()),
        "vocab_mean_contrast": covered(pool["recon_mean"].double(), pool["exact_mean"].double()),
    }
    cov_all = torch.cat(list(cov.values())).float()
    exact = torch.cat([pool["exact_comp"], pool["exact_mean"]]).double()
    recon = torch.cat([pool["recon_comp"], pool["recon_mean"]]).double()
    rand_pool = _pool(h, random_support_own_magnitudes(sae, seed=cfg.seed).to(rows), rows, b_U)
    cov_rand = torch.cat(
        [
            covered(rand_pool["recon_comp"].double(), rand_pool["exact_comp"].double()),
            covered(rand_pool["recon_mean"].double(), rand_pool["exact_mean"].double()),
        ]
    ).float()
    gen = torch.Generator().manual_seed(cfg.seed)
    D = sae.W_dec.detach().double()
    V = rows.shape[0]
    preds, meas, preds_c, meas_c = [], [], [], []
    for j in range(min(len(bank), cfg.max_states)):
        hd = h[j].double()
        for family in ("top1_vs_competitor", "vocab_mean_contrast"):
            if not bool(cov[family][j]):
                continue  # only covered contrasts, as the authors
            alpha = torch.zeros(V, dtype=torch.float64)
            if family == "top1_vs_competitor":
                alpha[pool["t1"][j]] += 1.0
                alpha[pool["t2"][j]] -= 1.0
            else:
                alpha -= 1.0 / V
                alpha[pool["t1"][j]] += 1.0
            dec = decompose_rows(sae, h[j], alpha, rows, n_top=0)
            c = dec.contributions
            q = alpha @ rows.double()
            s0 = hd @ q
            top = [i for i, _ in dec.top(cfg.n_features) if c[i] != 0]
            for i in top:
                preds.append(-c[i].item())
                meas.append(((hd - (hd @ D[i]) * D[i]) @ q - s0).item())
            for i in top:  # control: the same predicted −c_i, a random dictionary feature outside the top set ablated
                for _ in range(cfg.n_control):
                    r = int(torch.randint(sae.cfg.d_sae, (1,), generator=gen))
                    while r in top:
                        r = int(torch.randint(sae.cfg.d_sae, (1,), generator=gen))
                    preds_c.append(-c[i].item())
                    meas_c.append(((hd - (hd @ D[r]) * D[r]) @ q - s0).item())
    r2, slope = through_origin_r2(torch.tensor(preds), torch.tensor(meas)) if preds else (float("nan"),) * 2
    r2c, slope_c = (
        through_origin_r2(torch.tensor(preds_c), torch.tensor(meas_c)) if preds_c else (float("nan"), float("nan"))
    )
    clusters = bank.sequence.repeat(2)
    makers = _paper_makers(sae, rows, cfg)
    cov_b, ci_b, fam_b, rho_b = {}, {}, {}, {}
    for name in cfg.baselines:
        start = time.perf_counter()
        comp, mean = contrast_scores(makers[name], h, rows, pool["t1"], pool["t2"])
        by = {
            "top1_vs_competitor": covered(comp.double(), pool["exact_comp"].double()),
            "vocab_mean_contrast": covered(mean.double(), pool["exact_mean"].double()),
        }
        cov_n = torch.cat(list(by.values())).float()
        rec_n = torch.cat([comp, mean]).double()
        cov_b[name], ci_b[name] = cov_n.mean().item(), cluster_bootstrap(cov_n, clusters)
        fam_b[name] = {f: v.float().mean().item() for f, v in by.items()}
        rho_b[name] = ((exact - rec_n).abs() / exact.abs()).median().item()
        logger.info("%s: coverage %.3f (%.0f s)", name, cov_b[name], time.perf_counter() - start)
    paper_ran = {b: cov_b[b] for b in PAPER_BASELINES if b in cov_b}
    best = max(paper_ran, key=lambda name: paper_ran[name]) if paper_ran else None
    coverage = cov_all.mean().item()
    return PaperReadoutDiagnostics(
        coverage=coverage,
        coverage_ci=cluster_bootstrap(cov_all, clusters),
        coverage_by_family={k: v.float().mean().item() for k, v in cov.items()},
        rho0_median=((exact - recon).abs() / exact.abs()).median().item(),
        top1=pool["top1"].mean().item(),
        coverage_random_support=cov_rand.mean().item(),
        ablation_r2=r2,
        ablation_slope=slope,
        ablation_r2_control=r2c,
        ablation_slope_control=slope_c,
        n_states=len(bank),
        n_points=len(preds),
        n_points_control=len(preds_c),
        config=dict(vars(cfg)),
        coverage_baselines=cov_b,
        coverage_baselines_ci=ci_b,
        coverage_baselines_by_family=fam_b,
        rho0_median_baselines=rho_b,
        best_baseline=best,
        margin_over_best_baseline=coverage - paper_ran[best] if best else float("nan"),
    )


diagnostics = readout_diagnostics_paper  # the protocol's entry (readout.protocols.readout_diagnostics)
