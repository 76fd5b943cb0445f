"""Row-geometry baselines under the readout SAE's μ / a_t accounting (docs/design.md §6).

Each baseline reconstructs the normalised rows x_t = (w_t − μ)/a_t by some summary of row geometry and returns
ŵ_t = μ + a_t x̂_t, scored by :func:`tl_query_lens.readout.diagnostics.evaluate_reconstruction` like the SAE.
Neighbours and centroids never include the row itself where that would copy it (nearest-row ridge, kNN).

Two readings of the neighbour and k-means baselines exist side by side (the caller picks by keyword):
  * this project's (``evaluate_readout``): neighbours exclude only the row itself; k-means keeps a dead centroid
    where it was, runs 10 iterations, and codes a row on its top-``k`` centroids by signed cosine with λ = 1e-3;
  * the Sparse Readout Prism authors' (``readout_diagnostics_paper``): a contrast's rows are rebuilt per contrast,
    with the other contrast token(s) also excluded from the neighbours (``exclude=``), so w_b cannot rebuild w_a;
    k-means reseeds dead centroids from random rows, runs 12 iterations, and codes a row on its top-``k``
    centroids by |cos| with λ = 1e-4 (``dead="reseed"``, ``rank_by="abs_cos"``).
Both use k = the readout SAE's own k and widths = the SAE's width and a quarter of it (the authors: the same
dictionary size and active budget as their SAE, 256 at 32×d).
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tl_query_lens.primitives import normalise_rows
from tl_query_lens.readout.sae import decode_sparse

logger = logging.getLogger(__name__)


def _rows_back(mu, a, x_hat):
    return mu + a[:, None] * x_hat


@torch.no_grad()
def pca(rows: torch.Tensor, *, rank: int = 256) -> torch.Tensor:
    """Projection of the normalised rows onto their top-``rank`` principal directions."""
    mu, a, x = normalise_rows(rows)
    mean = x.mean(0)
    _, _, V = torch.linalg.svd(x - mean, full_matrices=False)
    basis = V[: min(rank, V.shape[0])]
    return _rows_back(mu, a, mean + (x - mean) @ basis.T @ basis)


@torch.no_grad()
def shuffled_codes(sae, rows: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """Each row gets another row's SAE code (a global permutation), keeping its own μ and a_t."""
    mu, a, _ = normalise_rows(rows)
    perm = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(seed)).to(rows.device)
    idx, val = sae.code_indices[perm], sae.code_values[perm] / sae.row_norms[perm, None].clamp_min(1e-12)
    W_dec = sae.W_dec.detach()
    x_hat = torch.cat([decode_sparse(i, v, W_dec) for i, v in zip(idx.split(4096), val.split(4096))])
    return _rows_back(mu, a, x_hat)


@torch.no_grad()
def random_support(sae, rows: torch.Tensor, *, seed: int = 0, ridge: float = 1e-3, chunk: int = 512) -> torch.Tensor:
    """k random dictionary features per row, coefficients by ridge regression (the support is uninformed)."""
    mu, a, x = normalise_rows(rows)
    gen = torch.Generator().manual_seed(seed)
    D, k = sae.W_dec.detach(), sae.cfg.k
    out = torch.empty_like(x)
    for s in range(0, x.shape[0], chunk):
        xs = x[s : s + chunk]
        support = torch.rand(xs.shape[0], D.shape[0], generator=gen).argsort(-1)[:, :k].to(x.device)
        out[s : s + chunk] = _ridge_fit(xs, D[support], ridge)
    return _rows_back(mu, a, out)


def _ridge_fit(x: torch.Tensor, basis: torch.Tensor, lam: float) -> torch.Tensor:
    """Per row: argmin_c ‖x − cB‖² + λ‖c‖² over its own basis B [k, d]; returns cB."""
    gram = basis @ basis.transpose(1, 2) + lam * torch.eye(basis.shape[1], dtype=x.dtype, device=x.device)
    rhs = basis @ x[:, :, None]
    coef = torch.linalg.solve(gram, rhs)
    return (coef.transpose(1, 2) @ basis)[:, 0]


def _target_ids(n_rows: int, targets: torch.Tensor | None, device) -> torch.Tensor:
    return torch.arange(n_rows, device=device) if targets is None else targets.to(device=device, dtype=torch.long)


@torch.no_grad()
def nearest_rows(
    x: torch.Tensor,
    n: int,
    *,
    targets: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
    chunk: int = 1024,
) -> torch.Tensor:
    """Indices of the ``n`` nearest other rows of ``x`` by cosine, for each row of ``targets`` (default: every row).

    The target row itself is never a neighbour; ``exclude`` [m, e] (one row per target, ids < 0 ignored) removes
    further ids from each target's neighbours: the other tokens of a contrast, as the authors do. n ≤ rows − 1.
    """
    tgt = _target_ids(x.shape[0], targets, x.device)
    if exclude is not None and exclude.shape[0] != tgt.shape[0]:
        raise ValueError(f"exclude has {exclude.shape[0]} rows for {tgt.shape[0]} targets; give one row per target.")
    n = min(n, x.shape[0] - 1 - (0 if exclude is None else exclude.shape[1]))
    out = []
    for s in tqdm(range(0, tgt.shape[0], chunk), desc="nearest rows", leave=False):
        ids = tgt[s : s + chunk]
        sim = x[ids] @ x.T
        rows = torch.arange(ids.shape[0], device=x.device)
        sim[rows, ids] = -float("inf")
        if exclude is not None:
            ex = exclude[s : s + chunk].to(x.device)
            keep = ex >= 0
            sim[rows[:, None].expand_as(ex)[keep], ex[keep]] = -float("inf")
        out.append(sim.topk(n, dim=-1).indices)
    return torch.cat(out)


@torch.no_grad()
def nearest_row_ridge(
    rows: torch.Tensor,
    *,
    n_neighbours: int = 128,
    ridge: float = 1e-3,
    neighbours: torch.Tensor | None = None,
    targets: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
    chunk: int = 512,
) -> torch.Tensor:
    """Ridge regression of each normalised row on its ``n_neighbours`` nearest other rows (λ = 1e-3).

    Returns ŵ of every row, or of ``targets`` only ([m, d_model]); ``exclude``: see :func:`nearest_rows`.
    ``neighbours`` (precomputed, one row per target) overrides both.
    """
    mu, a, x = normalise_rows(rows)
    tgt = _target_ids(x.shape[0], targets, x.device)
    nb = neighbours if neighbours is not None else nearest_rows(x, n_neighbours, targets=tgt, exclude=exclude)
    out = torch.empty(tgt.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    for s in tqdm(range(0, tgt.shape[0], chunk), desc="ridge", leave=False):
        out[s : s + chunk] = _ridge_fit(x[tgt[s : s + chunk]], x[nb[s : s + chunk, :n_neighbours]], ridge)
    return _rows_back(mu, a[tgt], out)


@torch.no_grad()
def knn_basis(
    rows: torch.Tensor,
    *,
    n_neighbours: int = 128,
    neighbours: torch.Tensor | None = None,
    targets: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Similarity-weighted mean of the nearest rows (weights = positive cosines), rescaled by least squares.

    ``targets`` / ``exclude`` / ``neighbours``: as in :func:`nearest_row_ridge`.
    """
    mu, a, x = normalise_rows(rows)
    tgt = _target_ids(x.shape[0], targets, x.device)
    nb = neighbours if neighbours is not None else nearest_rows(x, n_neighbours, targets=tgt, exclude=exclude)
    out = torch.empty(tgt.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    for s in range(0, tgt.shape[0], 512):
        xs, basis = x[tgt[s : s + 512]], x[nb[s : s + 512, :n_neighbours]]
        w = torch.einsum("nd,nkd->nk", xs, basis).clamp_min(0)
        mean = torch.einsum("nk,nkd->nd", w, basis)
        scale = (mean * xs).sum(-1, keepdim=True) / (mean * mean).sum(-1, keepdim=True).clamp_min(1e-12)
        out[s : s + 512] = scale * mean
    return _rows_back(mu, a[tgt], out)


@torch.no_grad()
def spherical_kmeans(
    x: torch.Tensor,
    n_clusters: int,
    *,
    iters: int = 10,
    seed: int = 0,
    dead: Literal["keep", "reseed"] = "keep",
) -> torch.Tensor:
    """Unit centroids of the unit rows ``x`` (cosine k-means, initialised on random rows).

    At most one centroid per row. A centroid that no row chose is kept where it was (``dead="keep"``, this project's) or moved to a random row
    (``"reseed"``, the authors').
    """
    if n_clusters < 1:
        raise ValueError(f"n_clusters={n_clusters}: give at least one centroid.")
    if n_clusters > x.shape[0]:
        logger.warning("k-means: %d centroids requested for %d rows; using %d.", n_clusters, x.shape[0], x.shape[0])
        n_clusters = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    cent = x[torch.randperm(x.shape[0], generator=gen)[:n_clusters].to(x.device)].clone()
    for _ in tqdm(range(iters), desc=f"k-means {n_clusters}", leave=False):
        assign = torch.cat([(c @ cent.T).argmax(-1) for c in x.split(4096)])
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        empty = (torch.bincount(assign, minlength=n_clusters) == 0) | (sums.norm(dim=-1) == 0)  # no direction
        if dead == "reseed" and bool(empty.any()):
            sums[empty] = x[torch.randperm(x.shape[0], generator=gen)[: int(empty.sum())].to(x.device)]
        else:
            sums[empty] = cent[empty]
        cent = F.normalize(sums, dim=-1)
    return cent


@torch.no_grad()
def hard_assignment(rows: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """x̂_t = (x_t·c)c for the nearest centroid c."""
    mu, a, x = normalise_rows(rows)
    out = torch.empty_like(x)
    for s in range(0, x.shape[0], 4096):
        sim = x[s : s + 4096] @ centroids.T
        best = sim.argmax(-1)
        out[s : s + 4096] = sim.gather(1, best[:, None]) * centroids[best]
    return _rows_back(mu, a, out)


@torch.no_grad()
def kmeans_ridge(
    rows: torch.Tensor,
    centroids: torch.Tensor,
    *,
    k: int,
    ridge: float = 1e-3,
    rank_by: Literal["cos", "abs_cos"] = "cos",
    targets: torch.Tensor | None = None,
    chunk: int = 512,
) -> torch.Tensor:
    """Ridge regression of each row (or of ``targets`` only) on its top-``k`` centroids.

    ``rank_by``: centroids ranked by signed cosine (this project's) or by |cos| (the authors', who also use
    λ = 1e-4), so a centroid pointing away from the row can enter its code with a negative coefficient.
    """
    mu, a, x = normalise_rows(rows)
    tgt = _target_ids(x.shape[0], targets, x.device)
    out = torch.empty(tgt.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    for s in tqdm(range(0, tgt.shape[0], chunk), desc="k-means ridge", leave=False):
        xs = x[tgt[s : s + chunk]]
        sim = xs @ centroids.T
        top = (sim.abs() if rank_by == "abs_cos" else sim).topk(min(k, centroids.shape[0]), dim=-1).indices
        out[s : s + chunk] = _ridge_fit(xs, centroids[top], ridge)
    return _rows_back(mu, a[tgt], out)
