"""Row-geometry baselines under the readout SAE's μ / a_t accounting (DESIGN §6).

Each baseline reconstructs the normalised rows x_t = (w_t − μ)/a_t by some summary of row geometry and returns
ŵ_t = μ + a_t x̂_t, scored by :func:`tl_query_lens.readout.diagnostics.evaluate_reconstruction` like the SAE.
Neighbours and centroids never include the row itself where that would copy it (nearest-row ridge, kNN).

Departure from the paper, stated: spherical k-means + ridge uses the top-``k`` centroids of each row with k the
readout SAE's own k (the paper: top-256), which keeps the ridge solves affordable on a CPU and matches the SAE's
sparsity; the "two widths" are the SAE's width and a quarter of it.
"""

from __future__ import annotations

import logging

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


@torch.no_grad()
def nearest_rows(x: torch.Tensor, n: int, *, chunk: int = 1024) -> torch.Tensor:
    """Indices of each row's ``n`` nearest other rows by cosine (itself excluded; n ≤ rows − 1)."""
    n = min(n, x.shape[0] - 1)
    out = []
    for s in tqdm(range(0, x.shape[0], chunk), desc="nearest rows", leave=False):
        sim = x[s : s + chunk] @ x.T
        sim[torch.arange(sim.shape[0]), torch.arange(s, s + sim.shape[0])] = -float("inf")
        out.append(sim.topk(n, dim=-1).indices)
    return torch.cat(out)


@torch.no_grad()
def nearest_row_ridge(
    rows: torch.Tensor,
    *,
    n_neighbours: int = 128,
    ridge: float = 1e-3,
    neighbours: torch.Tensor | None = None,
    chunk: int = 512,
) -> torch.Tensor:
    """Ridge regression of each normalised row on its ``n_neighbours`` nearest other rows (λ = 1e-3)."""
    mu, a, x = normalise_rows(rows)
    nb = neighbours if neighbours is not None else nearest_rows(x, n_neighbours)
    out = torch.empty_like(x)
    for s in tqdm(range(0, x.shape[0], chunk), desc="ridge", leave=False):
        out[s : s + chunk] = _ridge_fit(x[s : s + chunk], x[nb[s : s + chunk, :n_neighbours]], ridge)
    return _rows_back(mu, a, out)


@torch.no_grad()
def knn_basis(rows: torch.Tensor, *, n_neighbours: int = 128, neighbours: torch.Tensor | None = None) -> torch.Tensor:
    """Similarity-weighted mean of the nearest rows (weights = positive cosines), rescaled by least squares."""
    mu, a, x = normalise_rows(rows)
    nb = neighbours if neighbours is not None else nearest_rows(x, n_neighbours)
    out = torch.empty_like(x)
    for s in range(0, x.shape[0], 512):
        xs, basis = x[s : s + 512], x[nb[s : s + 512, :n_neighbours]]
        w = torch.einsum("nd,nkd->nk", xs, basis).clamp_min(0)
        mean = torch.einsum("nk,nkd->nd", w, basis)
        scale = (mean * xs).sum(-1, keepdim=True) / (mean * mean).sum(-1, keepdim=True).clamp_min(1e-12)
        out[s : s + 512] = scale * mean
    return _rows_back(mu, a, out)


@torch.no_grad()
def spherical_kmeans(x: torch.Tensor, n_clusters: int, *, iters: int = 10, seed: int = 0) -> torch.Tensor:
    """Unit centroids of the normalised rows (cosine k-means, initialised on random rows)."""
    gen = torch.Generator().manual_seed(seed)
    cent = x[torch.randperm(x.shape[0], generator=gen)[:n_clusters].to(x.device)].clone()
    for _ in tqdm(range(iters), desc=f"k-means {n_clusters}", leave=False):
        assign = torch.cat([(c @ cent.T).argmax(-1) for c in x.split(4096)])
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        empty = sums.norm(dim=-1) == 0
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
    rows: torch.Tensor, centroids: torch.Tensor, *, k: int, ridge: float = 1e-3, chunk: int = 512
) -> torch.Tensor:
    """Ridge regression of each row on its top-``k`` centroids by cosine."""
    mu, a, x = normalise_rows(rows)
    out = torch.empty_like(x)
    for s in tqdm(range(0, x.shape[0], chunk), desc="k-means ridge", leave=False):
        xs = x[s : s + chunk]
        top = (xs @ centroids.T).topk(min(k, centroids.shape[0]), dim=-1).indices
        out[s : s + chunk] = _ridge_fit(xs, centroids[top], ridge)
    return _rows_back(mu, a, out)


BASELINE_ORDER = (
    "shuffled_codes",
    "random_support",
    "pca256",
    "hard_assignment",
    "kmeans_ridge_small",
    "kmeans_ridge_full",
    "knn_basis",
    "nearest_row_ridge",
)
