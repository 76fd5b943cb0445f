"""One call for the full readout evaluation: the SAE and the row-geometry baselines on the same held-out states."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from tl_query_lens.config import resolve_config
from tl_query_lens.presentation import Table
from tl_query_lens.primitives import normalise_rows
from tl_query_lens.readout import baselines as bl
from tl_query_lens.readout.config import ReadoutEvalConfig
from tl_query_lens.readout.diagnostics import (
    AblationRegression,
    ReadoutEval,
    ablation_regression,
    build_score_bank,
    evaluate_reconstruction,
)
from tl_query_lens.readout.sae import ReadoutSAE, check_compatible, unembedding_rows
from tl_query_lens.readout.states import StateBank
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


def _baselines(
    sae: ReadoutSAE,
    rows: torch.Tensor,
    cache: dict,
    *,
    kmeans_widths: tuple[int, int] | None,
    kmeans_iters: int,
    ridge_k: int | None,
) -> dict[str, Callable[[], torch.Tensor]]:
    def neighbours():
        if "nb" not in cache:
            cache["nb"] = bl.nearest_rows(normalise_rows(rows)[2], 128)
        return cache["nb"]

    def centroids(width):
        if width not in cache:
            cache[width] = bl.spherical_kmeans(normalise_rows(rows)[2], width, iters=kmeans_iters)
        return cache[width]

    width, k = sae.cfg.d_sae, sae.cfg.k
    small, full = kmeans_widths or (max(k, width // 4), width)
    ridge_k = ridge_k or k
    return {
        "shuffled_codes": lambda: bl.shuffled_codes(sae, rows),
        "random_support": lambda: bl.random_support(sae, rows),
        "pca256": lambda: bl.pca(rows, rank=256),
        "hard_assignment": lambda: bl.hard_assignment(rows, centroids(full)),
        "kmeans_ridge_small": lambda: bl.kmeans_ridge(rows, centroids(small), k=ridge_k),
        "kmeans_ridge_full": lambda: bl.kmeans_ridge(rows, centroids(full), k=ridge_k),
        "knn_basis": lambda: bl.knn_basis(rows, neighbours=neighbours()),
        "nearest_row_ridge": lambda: bl.nearest_row_ridge(rows, neighbours=neighbours()),
    }


@dataclass
class ReadoutReport(SavableResult):
    """The SAE's diagnostics, each baseline's under the same accounting, and the ablation regression."""

    srp: ReadoutEval
    baselines: dict[str, ReadoutEval] = field(default_factory=dict)
    ablation: AblationRegression | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    COLUMNS = (
        "method",
        "row_ev",
        "top1",
        "top1_ci",
        "kl_mean_bits",
        "kl_median_bits",
        "coverage",
        "coverage_ci",
        "rho_median",
        "sign_agreement",
        "seconds",
    )

    def table(self) -> tuple[list[str], list[list]]:
        """``(columns, rows)``: the SAE first, then every baseline."""
        cols = list(self.COLUMNS)
        rows = [
            [getattr(r, c) if c != "seconds" else self.seconds.get(r.method, float("nan")) for c in cols]
            for r in [self.srp, *self.baselines.values()]
        ]
        return cols, rows

    COLUMN_TYPES: ClassVar[dict[str, type]] = {
        "method": str,
        "row_ev": float,
        "top1": float,
        "top1_lo": float,
        "top1_hi": float,
        "kl_mean_bits": float,
        "kl_median_bits": float,
        "coverage": float,
        "coverage_lo": float,
        "coverage_hi": float,
        "rho_median": float,
        "sign_agreement": float,
        "seconds": float,
    }
    title: ClassVar[str] = "Readout SAE vs baselines"

    def scalars(self) -> dict[str, float]:
        """The SAE's scalars (``srp/…``), each baseline's (``baseline_{name}/…``), ``ablation/…`` and ``seconds/…``."""
        out: dict[str, float] = {}
        for r in [self.srp, *self.baselines.values()]:
            prefix = "srp" if r.method == "srp" else f"baseline_{r.method}"
            out.update({f"{prefix}/{k}": v for k, v in r.scalars().items()})
        if self.ablation is not None:
            out.update({f"ablation/{k}": v for k, v in self.ablation.scalars().items()})
        return out | {f"seconds/{k}": float(v) for k, v in self.seconds.items()}

    def tables(self) -> dict[str, Table]:
        """``readout_vs_baselines``: the SAE first, then every baseline (CIs as ``_lo`` / ``_hi`` columns)."""
        rows = [
            [
                r.method,
                r.row_ev,
                r.top1,
                *r.top1_ci,
                r.kl_mean_bits,
                r.kl_median_bits,
                r.coverage,
                *r.coverage_ci,
                r.rho_median,
                r.sign_agreement,
                self.seconds.get(r.method, float("nan")),
            ]
            for r in [self.srp, *self.baselines.values()]
        ]
        return {"readout_vs_baselines": Table.build(self.COLUMN_TYPES, rows)}


@torch.no_grad()
def evaluate_readout(
    model,
    sae: ReadoutSAE,
    states: StateBank,
    *,
    cfg: ReadoutEvalConfig | None = None,
    **overrides: Any,
) -> ReadoutReport:
    """Diagnostics of ``sae`` and of each baseline on held-out ``states`` (docs/design.md §6).

    ``cfg`` / keyword ``overrides``: :class:`ReadoutEvalConfig` (baselines, ablation_states, n_boot, k-means sizes).
    """
    cfg = resolve_config(ReadoutEvalConfig, cfg, overrides)
    check_compatible(sae, model)
    rows = unembedding_rows(model)
    b_U = model.b_U.detach().float()
    sb = build_score_bank(states, rows, b_U)
    seconds: dict[str, float] = {}
    dense: dict = {}
    start = time.perf_counter()
    srp = evaluate_reconstruction(
        "srp",
        rows,
        sae.reconstructed_rows().detach(),
        states,
        b_U=b_U,
        score_bank=sb,
        n_boot=cfg.n_boot,
        dense_cache=dense,
    )
    seconds["srp"] = time.perf_counter() - start
    report = ReadoutReport(srp=srp, seconds=seconds)
    if cfg.ablation_states:
        report.ablation = ablation_regression(sae, rows, states, max_states=cfg.ablation_states)
    cache: dict = {}
    makers = _baselines(
        sae, rows, cache, kmeans_widths=cfg.kmeans_widths, kmeans_iters=cfg.kmeans_iters, ridge_k=cfg.ridge_k
    )
    for name in cfg.baselines:
        start = time.perf_counter()
        res = evaluate_reconstruction(
            name, rows, makers[name](), states, b_U=b_U, score_bank=sb, n_boot=cfg.n_boot, dense_cache=dense
        )
        seconds[name] = time.perf_counter() - start
        report.baselines[name] = res
        logger.info("%s: top-1 %.3f, coverage %.3f (%.0f s)", name, res.top1, res.coverage, seconds[name])
    return report
