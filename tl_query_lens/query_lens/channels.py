"""Subspace channels: low-rank maps from a layer's value features to each downstream module's response (docs/design.md §5).

For N value features v of source layer l and every downstream module k > l (attention and MLP of block k), the
response is r^{l→k} = J̄^k v, with J̄^k the corpus-mean Jacobian of the module's output w.r.t. its input
(``tl_query_lens.operators.module_operators``). A rank-r map W = BA (r = d/L) is fitted per (source, module) by
closed-form reduced-rank regression (exact least squares at rank r) and by the paper's Adam recipe. The column space
of W is the *channel*: the rank-r subspace of the response the module writes. Channels are compared by overlap
OL = ‖Q_iᵀQ_j‖_F² / r; same-destination pairs should overlap more than different-destination pairs (AUC,
permutation p).

:func:`subspace_channels` is the protocol (dictionaries and a corpus in, operators computed, one
:class:`ChannelAnalysis` out); :func:`channel_analysis` is its core on given value vectors and operators.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import InputError
from tl_query_lens.hooks import downstream_modules, hook_layer
from tl_query_lens.operators import module_operators
from tl_query_lens.presentation import Table
from tl_query_lens.query_lens.config import ChannelConfig, SubspaceChannelsConfig
from tl_query_lens.results import SavableResult
from tl_query_lens.tensor_checks import check_finite

logger = logging.getLogger(__name__)


@dataclass
class LowRankMap:
    """W = B A mapping a feature v to a response r ≈ W v; B ``[d_out, r]``, A ``[r, d_in]``."""

    B: Float[torch.Tensor, "d_out rank"]
    A: Float[torch.Tensor, "rank d_in"]

    @property
    def W(self) -> Float[torch.Tensor, "d_out d_in"]:
        return self.B @ self.A

    def __call__(self, X: Float[torch.Tensor, "n d_in"]) -> Float[torch.Tensor, "n d_out"]:
        return (X @ self.A.T) @ self.B.T

    def column_space(self) -> Float[torch.Tensor, "d_out rank"]:
        """Orthonormal basis of the column space of W (its top-r left singular vectors)."""
        U, _S, _ = torch.linalg.svd(self.W.double(), full_matrices=False)
        r = self.A.shape[0]
        return U[:, :r].float()


def module_responses(
    values: Float[torch.Tensor, "n d_model"],
    operators: Mapping[str, Float[torch.Tensor, "d_model d_model"]],
) -> dict[str, Float[torch.Tensor, "n d_model"]]:
    """r^{l→k} = J̄^k v for every feature (rows of ``values``) and every operator ``[d_out, d_in]``."""
    return {name: values.float() @ op.float().T for name, op in operators.items()}


def reduced_rank_regression(
    X: Float[torch.Tensor, "n d_in"], Y: Float[torch.Tensor, "n d_out"], rank: int, *, rcond: float = 1e-10
) -> LowRankMap:
    """Least-squares rank-``rank`` W minimising ‖Y − X Wᵀ‖_F² (closed form, exact).

    With X = U_x S_x V_xᵀ (thin SVD, tiny singular values dropped) the loss splits into an irreducible part plus
    ‖Z − S_x V_xᵀ Wᵀ‖², Z = U_xᵀ Y, so the optimum is the best rank-r approximation Z_r = U_r Σ_r V_rᵀ of Z
    (Eckart–Young) mapped back: Wᵀ = V_x S_x⁻¹ Z_r. Then B = V_r, A = Σ_r U_rᵀ S_x⁻¹ V_xᵀ.
    """
    Xd, Yd = X.double(), Y.double()
    Ux, Sx, Vxh = torch.linalg.svd(Xd, full_matrices=False)
    keep = Sx > rcond * Sx.max()
    Ux, Sx, Vxh = Ux[:, keep], Sx[keep], Vxh[keep]
    Z = Ux.T @ Yd  # [p, d_out]
    Uz, Sz, Vzh = torch.linalg.svd(Z, full_matrices=False)
    r = min(rank, Sz.numel())
    B = Vzh[:r].T  # [d_out, r]
    A = (Sz[:r, None] * Uz[:, :r].T) @ (Vxh / Sx[:, None])  # [r, d_in]
    return LowRankMap(B=B.float(), A=A.float())


def fit_adam(
    X: Float[torch.Tensor, "n d_in"],
    Y: Float[torch.Tensor, "n d_out"],
    rank: int,
    *,
    lr: float = 1e-3,
    epochs: int = 1000,
    init_std: float = 0.01,
    seed: int = 42,
) -> LowRankMap:
    """The paper's recipe: W = BA, A ~ N(0, init_std²), B = 0, Adam, full-batch MSE for ``epochs`` steps."""
    gen = torch.Generator().manual_seed(seed)
    A = (torch.randn(rank, X.shape[1], generator=gen) * init_std).requires_grad_(True)
    B = torch.zeros(Y.shape[1], rank, requires_grad=True)
    opt = torch.optim.Adam([A, B], lr=lr)
    X, Y = X.float(), Y.float()
    with torch.enable_grad():
        for _ in range(epochs):
            opt.zero_grad(set_to_none=True)
            loss = ((X @ A.T) @ B.T - Y).pow(2).mean()
            loss.backward()
            opt.step()
    return LowRankMap(B=B.detach(), A=A.detach())


def fit_metrics(fit: LowRankMap, X: torch.Tensor, Y: torch.Tensor) -> dict[str, float]:
    """MSE, rel-L2 = ‖Ŷ − Y‖_F/‖Y‖_F, mean row cosine, explained energy = 1 − ‖Ŷ − Y‖_F²/‖Y‖_F²."""
    pred = fit(X).double()
    Y = Y.double()
    err = (pred - Y).pow(2).sum()
    energy = Y.pow(2).sum().clamp_min(1e-300)
    cos = torch.nn.functional.cosine_similarity(pred, Y, dim=-1, eps=1e-30)
    return {
        "mse": (err / Y.numel()).item(),
        "rel_l2": (err / energy).sqrt().item(),
        "cosine": cos.mean().item(),
        "explained_energy": (1 - err / energy).item(),
    }


def subspace_overlap(Q1: Float[torch.Tensor, "d r"], Q2: Float[torch.Tensor, "d r"]) -> float:
    """OL = ‖Q1ᵀ Q2‖_F² / r for orthonormal bases (1 = same subspace, 0 = orthogonal; random ≈ r/d)."""
    if Q1.shape != Q2.shape:
        raise ValueError(f"Bases must have the same shape, got {tuple(Q1.shape)} and {tuple(Q2.shape)}.")
    return ((Q1.double().T @ Q2.double()).pow(2).sum() / Q1.shape[1]).item()


def auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """Area under the ROC curve: P(positive > negative) + ½ P(tie) (Mann–Whitney)."""
    if positive.numel() == 0 or negative.numel() == 0:
        raise ValueError("AUC needs at least one positive and one negative score.")
    diff = positive.double()[:, None] - negative.double()[None, :]
    return ((diff > 0).double().mean() + 0.5 * (diff == 0).double().mean()).item()


def _average_ranks(scores: torch.Tensor) -> torch.Tensor:
    """1-based ranks with ties sharing their average rank."""
    _values, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    upper = counts.cumsum(0).double()
    return ((upper - counts.double() + 1 + upper) / 2)[inverse]


def permutation_p(scores: torch.Tensor, labels: torch.Tensor, *, n_permutations: int = 10000, seed: int = 0) -> float:
    """One-sided permutation p-value of the AUC of ``scores`` for boolean ``labels`` (labels shuffled).

    AUC = (Σ ranks of positives − n⁺(n⁺+1)/2) / (n⁺ n⁻) (Mann–Whitney, average ranks for ties), so each permutation
    only re-sums fixed ranks.
    """
    labels = labels.bool()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("A permutation test needs at least one positive and one negative label.")
    ranks = _average_ranks(scores)
    observed = ranks[labels].sum()
    gen = torch.Generator().manual_seed(seed)
    hits = 0
    for start in range(0, n_permutations, 1000):
        m = min(1000, n_permutations - start)
        perms = torch.argsort(torch.rand(m, len(scores), generator=gen), dim=1)[:, :n_pos]
        hits += int((ranks[perms].sum(1) >= observed - 1e-9).sum())
    return (hits + 1) / (n_permutations + 1)


@dataclass
class ChannelAnalysis(SavableResult):
    """Channel fits, held-out metrics and pairwise overlaps.

    Attributes:
        channels: channel names ``"l{source}->blocks.k.{attn|mlp}"``.
        sources, destinations: ``[C]`` source layer and destination layer k of each channel.
        modules: ``"attn"`` / ``"mlp"`` per channel.
        rank: r.
        metrics: fit → channel → {mse, rel_l2, cosine, explained_energy, train_mse}.
        overlaps: fit → ``[C, C]`` OL matrix (stored as nested lists).
        summary: fit → {ol_same, ol_different, auc, p_value, n_same, n_different, ol_random}.
        config: settings.
    """

    channels: list[str]
    sources: list[int]
    destinations: list[int]
    modules: list[str]
    rank: int
    metrics: dict
    overlaps: dict
    summary: dict
    config: dict = field(default_factory=dict)

    METRICS: ClassVar[tuple[str, ...]] = ("mse", "rel_l2", "cosine", "explained_energy", "train_mse")
    title: ClassVar[str] = "Subspace channels"

    def scalars(self) -> dict[str, float]:
        """``{fit}/{ol_same, ol_different, auc, p_value, n_same, n_different, ol_random}`` per fit."""
        return {f"{fit}/{k}": float(v) for fit, s in self.summary.items() for k, v in s.items()}

    def tables(self) -> dict[str, Table]:
        """``channel_metrics``: one row per (channel, fit), the held-out metrics."""
        columns = {"channel": str, "fit": str, **dict.fromkeys(self.METRICS, float)}
        rows = (
            [name, fit, *(m[name][c] for c in self.METRICS)]
            for fit, m in self.metrics.items()
            for name in self.channels
        )
        return {"channel_metrics": Table.build(columns, rows)}

    def figures(self) -> dict[str, Any]:
        """``overlap_{fit}``: the channel-overlap matrix OL of each fit."""
        import plotly.graph_objects as go

        figures = {}
        for fit, overlap in self.overlaps.items():
            heatmap = go.Heatmap(z=overlap, x=self.channels, y=self.channels, colorscale="Viridis", zmin=0, zmax=1)
            figure = go.Figure(heatmap)
            figure.update_layout(title=f"Channel overlap OL ({fit}, rank {self.rank})")
            figures[f"overlap_{fit}"] = figure
        return figures


def channel_analysis(
    values_by_source: Mapping[int, Float[torch.Tensor, "n d_model"]],
    operators: Mapping[str, Float[torch.Tensor, "d_model d_model"]],
    *,
    n_layers: int,
    downstream: Mapping[int, Sequence[str]] | None = None,
    cfg: ChannelConfig | None = None,
    **overrides: Any,
) -> ChannelAnalysis:
    """Fit the channels of every (source layer, downstream module) pair and compare their column spaces.

    Args:
        values_by_source: source layer l → value vectors ``[N, d_model]`` of its features.
        operators: module operators ``blocks.k.attn`` / ``blocks.k.mlp`` → ``[d_model, d_model]``; by default every
            module with k > l is used for source l (values written at ``blocks.l.hook_resid_post``).
        n_layers: the model's L (for the default rank d/L).
        downstream: source layer → the module names its values pass through (``downstream_modules(value_hook)``:
            block l's MLP too for an attention write, both block-l modules for ``hook_resid_pre``); None: k > l.
        cfg / overrides: a :class:`ChannelConfig`; keyword overrides replace single fields.
    """
    cfg = resolve_config(ChannelConfig, cfg, overrides)
    for source, values in values_by_source.items():
        check_finite(
            values,
            f"value vectors of source layer {source}",
            hint="The dictionary's W_dec is corrupt or training diverged: reload or retrain it.",
        )
    # Small dense fits: done on the CPU whatever device the operators were computed on (the engine returns them on
    # the model's device), so seeded CPU generators and the inputs never mix devices.
    values_by_source = {source: values.detach().float().cpu() for source, values in values_by_source.items()}
    operators = {name: op.detach().float().cpu() for name, op in operators.items()}
    d = next(iter(values_by_source.values())).shape[1]
    rank = cfg.rank or max(1, d // n_layers)
    names: list[str] = []
    sources: list[int] = []
    dests: list[int] = []
    modules: list[str] = []
    fits: dict[str, dict] = {f: {} for f in cfg.fits}
    metrics: dict[str, dict] = {f: {} for f in cfg.fits}
    for source, values in sorted(values_by_source.items()):
        n = values.shape[0]
        n_train = round(cfg.train_frac * n)
        if n_train < 2 or n - n_train < 1:
            raise ValueError(f"Source layer {source}: {n} features cannot be split {cfg.train_frac:.0%}/rest.")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
        train, test = perm[:n_train], perm[n_train:]
        if downstream is None:
            reached = {k: op for k, op in operators.items() if _layer_of(k) > source}
        else:
            reached = {k: operators[k] for k in downstream[source] if k in operators}
        if not reached:
            raise ValueError(f"No module operators downstream of layer {source}; compute module_operators for k > l.")
        responses = module_responses(values, reached)
        for module, Y in responses.items():
            name = f"l{source}->{module}"
            names.append(name)
            sources.append(source)
            dests.append(_layer_of(module))
            modules.append(module.split(".")[-1])
            for fit_name in cfg.fits:
                if fit_name == "closed_form":
                    fit = reduced_rank_regression(values[train], Y[train], rank)
                else:
                    fit = fit_adam(
                        values[train],
                        Y[train],
                        rank,
                        lr=cfg.lr,
                        epochs=cfg.epochs,
                        init_std=cfg.init_std,
                        seed=cfg.seed,
                    )
                fits[fit_name][name] = fit
                metrics[fit_name][name] = {
                    **fit_metrics(fit, values[test], Y[test]),
                    "train_mse": fit_metrics(fit, values[train], Y[train])["mse"],
                }
        logger.info("source layer %d: %d channels fitted", source, len(responses))
    overlaps, summary = {}, {}
    for fit_name in cfg.fits:
        bases = [fits[fit_name][n].column_space() for n in names]
        C = len(names)
        ol = torch.eye(C, dtype=torch.float64)
        for i, j in itertools.combinations(range(C), 2):
            ol[i, j] = ol[j, i] = subspace_overlap(bases[i], bases[j])
        overlaps[fit_name] = ol.tolist()
        summary[fit_name] = _pair_summary(ol, names, dests, modules, cfg, rank, d)
    return ChannelAnalysis(
        channels=names,
        sources=sources,
        destinations=dests,
        modules=modules,
        rank=rank,
        metrics=metrics,
        overlaps=overlaps,
        summary=summary,
        config=dict(cfg.__dict__),
    )


def subspace_channels(
    model: HookedTransformer,
    dictionaries: Mapping[int, Any],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    cfg: SubspaceChannelsConfig | None = None,
    **overrides: Any,
) -> ChannelAnalysis:
    """The channels protocol: value vectors of each source layer's dictionary, module operators of the downstream
    blocks on ``tokens``, then :func:`channel_analysis`.

    Args:
        model: the clean model.
        dictionaries: source layer l → dictionary (anything :func:`~tl_query_lens.as_key_value` takes) whose values
            are written at layer l (FF-KV of layer l, a transcoder or SAE writing there).
        tokens: corpus of the module operators (train split).
        cfg / overrides: :class:`SubspaceChannelsConfig` (keyword overrides replace single fields).
    """

    cfg = resolve_config(SubspaceChannelsConfig, cfg, overrides)
    if not dictionaries:
        raise ValueError("dictionaries is empty; pass {source layer: dictionary} for at least one layer.")
    values, downstream = {}, {}
    n_layers = model.cfg.n_layers
    for source, dictionary in dictionaries.items():
        view = as_key_value(dictionary, model)
        written = hook_layer(view.write_hook)
        if written != source:
            raise ValueError(
                f"The dictionary given for source layer {source} writes at {view.write_hook} (layer {written}); "
                f"key it by {written}."
            )
        if not view.fixed_values:
            raise InputError(
                f"The values of the dictionary of source layer {source} pass through a per-token norm before "
                f"{view.write_hook} (a post-norm block, Gemma-2), so they are no fixed residual directions and have no "
                "channel through the module operators; use a dictionary writing a residual hook of that layer."
            )
        values[source] = view.values
        downstream[source] = downstream_modules(view.value_hook, n_layers)  # attention writes: block l's MLP too
    needed = sorted({_layer_of(name) for names in downstream.values() for name in names})
    layers = cfg.operator_layers or tuple(needed)
    operators = module_operators(model, tokens, layers, cfg.engine)
    return channel_analysis(
        values, {name: operators[name] for name in operators}, n_layers=n_layers, downstream=downstream, cfg=cfg
    )


def _layer_of(module: str) -> int:
    layer = hook_layer(module)
    if layer is None:
        raise ValueError(f"Operator name {module!r} is not a block module ('blocks.k.attn' / 'blocks.k.mlp').")
    return layer


def _pair_summary(ol, names, dests, modules, cfg: ChannelConfig, rank: int, d: int) -> dict[str, float]:
    pairs = list(itertools.combinations(range(len(names)), 2))
    if cfg.destination == "layer":
        same = [dests[i] == dests[j] for i, j in pairs]
    else:
        same = [dests[i] == dests[j] and modules[i] == modules[j] for i, j in pairs]
    labels = torch.tensor(same, dtype=torch.bool)
    scores = torch.tensor([ol[i, j].item() for i, j in pairs], dtype=torch.float64)
    if labels.all() or not labels.any():
        raise InputError(
            f"destination={cfg.destination!r} gives no {'different' if labels.all() else 'same'}-destination pairs "
            "for these channels; use "
            + ("destination='module' or earlier source layers." if labels.all() else "destination='layer'.")
        )
    return {
        "ol_same": scores[labels].mean().item(),
        "ol_different": scores[~labels].mean().item(),
        "auc": auc(scores[labels], scores[~labels]),
        "p_value": permutation_p(scores, labels, n_permutations=cfg.n_permutations, seed=cfg.seed),
        "n_same": int(labels.sum()),
        "n_different": int((~labels).sum()),
        "ol_random": rank / d,
    }
