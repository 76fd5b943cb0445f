"""One call for the full readout evaluation: the SAE and the row-geometry baselines on the same held-out states."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from tl_query_lens.readout import baselines as bl
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


def _baselines(sae: ReadoutSAE, rows: torch.Tensor, cache: dict) -> dict[str, Callable[[], torch.Tensor]]:
    def neighbours():
        if "nb" not in cache:
            cache["nb"] = bl.nearest_rows(bl.normalise_rows(rows)[2], 128)
        return cache["nb"]

    def centroids(width):
        if width not in cache:
            cache[width] = bl.spherical_kmeans(bl.normalise_rows(rows)[2], width)
        return cache[width]

    width, k = sae.cfg.d_sae, sae.cfg.k
    return {
        "shuffled_codes": lambda: bl.shuffled_codes(sae, rows),
        "random_support": lambda: bl.random_support(sae, rows),
        "pca256": lambda: bl.pca(rows, rank=256),
        "hard_assignment": lambda: bl.hard_assignment(rows, centroids(width)),
        "kmeans_ridge_small": lambda: bl.kmeans_ridge(rows, centroids(max(k, width // 4)), k=k),
        "kmeans_ridge_full": lambda: bl.kmeans_ridge(rows, centroids(width), k=k),
        "knn_basis": lambda: bl.knn_basis(rows, neighbours=neighbours()),
        "nearest_row_ridge": lambda: bl.nearest_row_ridge(rows, neighbours=neighbours()),
    }


@dataclass
class ReadoutReport(SavableResult):
    """The SAE's diagnostics, each baseline's under the same accounting, and the ablation regression."""

    srp: dict
    baselines: dict[str, dict] = field(default_factory=dict)
    ablation: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def table(self) -> tuple[list[str], list[list]]:
        cols = ["method", "row_ev", "top1", "top1_ci", "kl_mean_bits", "kl_median_bits", "coverage", "coverage_ci",
                "rho_median", "sign_agreement", "seconds"]
        rows = [[r[c] if c != "seconds" else self.seconds.get(r["method"], float("nan")) for c in cols]
                for r in [self.srp, *self.baselines.values()]]
        return cols, rows


@torch.no_grad()
def evaluate_readout(
    sae: ReadoutSAE,
    model,
    states: StateBank,
    *,
    baselines: Sequence[str] = bl.BASELINE_ORDER,
    ablation_states: int = 256,
    n_boot: int = 1000,
    tracker=None,
) -> ReadoutReport:
    """Diagnostics of ``sae`` and of each named baseline on held-out ``states`` (DESIGN §6).

    Baselines run in the order given (cheapest first by default); results are logged to ``tracker`` as they come.
    """
    check_compatible(sae, model)
    rows = unembedding_rows(model)
    b_U = model.b_U.detach().float()
    sb = build_score_bank(states, rows, b_U)
    seconds: dict[str, float] = {}
    dense: dict = {}
    start = time.perf_counter()
    srp = evaluate_reconstruction("srp", rows, sae.reconstructed_rows().detach(), states, b_U=b_U, score_bank=sb,
                                  n_boot=n_boot, dense_cache=dense)
    seconds["srp"] = time.perf_counter() - start
    report = ReadoutReport(srp=asdict(srp), seconds=seconds)
    if tracker is not None:
        tracker.log_scalars("srp", _scalars(srp))
    cache: dict = {}
    makers = _baselines(sae, rows, cache)
    unknown = [b for b in baselines if b not in makers]
    if unknown:
        raise ValueError(f"Unknown baselines {unknown}; choose from {list(makers)}.")
    for name in baselines:
        start = time.perf_counter()
        res: ReadoutEval = evaluate_reconstruction(name, rows, makers[name](), states, b_U=b_U, score_bank=sb,
                                                   n_boot=n_boot, dense_cache=dense)
        seconds[name] = time.perf_counter() - start
        report.baselines[name] = asdict(res)
        logger.info("%s: top-1 %.3f, coverage %.3f (%.0f s)", name, res.top1, res.coverage, seconds[name])
        if tracker is not None:
            tracker.log_scalars(f"baseline_{name}", _scalars(res))
    if ablation_states:
        abl: AblationRegression = ablation_regression(sae, rows, states, max_states=ablation_states)
        report.ablation = asdict(abl)
        if tracker is not None:
            tracker.log_scalars("ablation", report.ablation)
    if tracker is not None:
        tracker.log_table("readout_vs_baselines", *report.table())
    return report


def _scalars(res: ReadoutEval) -> dict[str, float]:
    return {k: v for k, v in asdict(res).items() if isinstance(v, float)}
