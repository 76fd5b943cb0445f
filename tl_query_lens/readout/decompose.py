"""Exact decomposition of a selected readout score into readout features (docs/design.md §6, Sparse Readout Prism).

For a direction q_α = Σ_t α_t w_t and a decoded state h,

    s = h·q_α = (Σα) h·μ  +  Σ_i β_i p_i  +  h·Σ_t α_t r_t,     β_i = Σ_t α_t z_{t,i},  p_i = h·d_i,

with c_i = β_i p_i the signed contribution of feature i (logit units). The bias term vanishes for contrasts
(Σα = 0). The residual is computed from the rows' own residuals r_t = w_t − μ − Σ_i z_{t,i} d_i, not as a
difference with the exact score, so ``bias + Σc + residual = exact`` is a check on the bookkeeping.
Helpers build α for each score family: token logit, margin (+1/−1), group mean, vocabulary-mean contrast,
top-1 vs competitor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from tl_query_lens.errors import InputTypeError
from tl_query_lens.presentation import Table
from tl_query_lens.readout.sae import ReadoutSAE, check_compatible, register_operation, unembedding_rows
from tl_query_lens.readout.states import check_state
from tl_query_lens.results import SavableResult
from tl_query_lens.tensor_checks import check_dictionary_finite, check_finite, check_outputs


@dataclass
class Decomposition(SavableResult):
    """s_exact = bias + Σ_i contributions_i + residual, for one α and one or more decoded states.

    For one state ``h`` of shape ``[d_model]`` the per-state fields drop the state axis (``exact`` a 0-d tensor,
    ``contributions`` ``[d_sae]``); for states ``[n, d_model]`` they keep it.

    Attributes:
        exact: h·q_α (dense head, no b_U).
        bias: (Σα) h·μ.
        contributions: c_i = β_i p_i, per state.
        residual: h·Σ α_t r_t.
        beta: β_i(α) (row side, shared by all states).
        projections: p_i = h·d_i.
        alpha_sum: Σα (0 for contrasts).
        top_features: for a single state, the features with the largest |c_i| and their labels.
    """

    exact: Float[torch.Tensor, "*n"]
    bias: Float[torch.Tensor, "*n"]
    contributions: Float[torch.Tensor, "*n d_sae"]
    residual: Float[torch.Tensor, "*n"]
    beta: Float[torch.Tensor, " d_sae"]
    projections: Float[torch.Tensor, "*n d_sae"]
    alpha_sum: float
    top_features: list[dict] = field(default_factory=list)

    @property
    def reconstructed(self) -> torch.Tensor:
        """s_recon = bias + Σ c_i (the score of the reconstructed head)."""
        return self.bias + self.contributions.sum(-1)

    @property
    def rho(self) -> torch.Tensor:
        """ρ_0 = |ε| / |s_exact| (see :func:`tl_query_lens.readout.diagnostics.rho` for ρ_δ)."""
        return self.residual.abs() / self.exact.abs()

    def top(self, n: int = 10, index: int = 0) -> list[tuple[int, float]]:
        """The ``n`` (feature, c_i) pairs with the largest |c_i| for state ``index`` (ignored for one state)."""
        c = self.contributions if self.contributions.ndim == 1 else self.contributions[index]
        idx = c.abs().topk(min(n, c.numel())).indices
        return [(int(i), float(c[i])) for i in idx]

    title: ClassVar[str] = "Readout decomposition"

    def scalars(self) -> dict[str, float]:
        """For one state: exact, bias, Σc_i, residual and ρ₀; for several, their means (``mean_…``)."""
        values = {
            "exact": self.exact,
            "bias": self.bias,
            "sum_contributions": self.contributions.sum(-1),
            "residual": self.residual,
            "rho0": self.rho,
        }
        if self.exact.numel() == 1:
            out = {k: float(v.reshape(-1)[0]) for k, v in values.items()}
        else:
            out = {f"mean_{k}": float(v.double().mean()) for k, v in values.items()}
        return out | {"alpha_sum": float(self.alpha_sum)}

    def tables(self) -> dict[str, Table]:
        """``top_features``: for the first state, the features with the largest |c_i| (labels when known)."""
        labels = {d["feature"]: d.get("label", "") for d in self.top_features if isinstance(d, dict) and "feature" in d}
        columns = {"feature": int, "contribution": float, "beta": float, "projection": float, "label": str}
        rows = [
            [i, c, self.beta[i], self.projections.reshape(-1, self.projections.shape[-1])[0, i], str(labels.get(i, ""))]
            for i, c in (self.top(10) if self.contributions.numel() else [])
        ]
        return {"top_features": Table.build(columns, rows)}

    def figures(self) -> dict[str, Any]:
        """``waterfall``: bias, the top features, the other features and the residual adding up to the exact score
        (first state)."""
        import plotly.graph_objects as go

        top = self.top(8) if self.contributions.numel() else []
        labels = {d["feature"]: d.get("label", "") for d in self.top_features if isinstance(d, dict) and "feature" in d}
        first = self.contributions if self.contributions.ndim == 1 else self.contributions[0]
        bias, residual, exact = (float(t.reshape(-1)[0]) for t in (self.bias, self.residual, self.exact))
        rest = float(first.sum()) - sum(c for _, c in top) if self.contributions.numel() else 0.0
        names = ["shared bias", *(f"#{f} {labels.get(f, '')}"[:40] for f, _ in top), "other features", "residual"]
        values = [bias, *(c for _, c in top), rest, residual]
        fig = go.Figure(
            go.Waterfall(
                x=[*names, "exact score"],
                y=[*values, exact],
                measure=["relative"] * len(values) + ["total"],
            )
        )
        fig.update_layout(title="Readout decomposition", template="plotly_white", yaxis_title="score (logit units)")
        return {"waterfall": fig}


def _rows_for(sae: ReadoutSAE, model: HookedTransformer | None) -> torch.Tensor:
    if model is None:
        rows = sae.bound_rows
        if rows is None:
            raise ValueError(
                "decompose needs the LM-head rows: pass model=... (the model the readout SAE was fitted "
                "to), or call bind(model, sae) once."
            )
        return rows
    if not isinstance(model, HookedTransformer):
        raise InputTypeError(
            f"decompose(model=) takes the HookedTransformer the readout SAE was fitted to, not a "
            f"{type(model).__name__}. For LM-head rows [d_vocab, d_model] you already checked against the SAE, "
            "call decompose_rows(sae, h, alpha, rows); or bind(model, sae) once and omit model=."
        )
    check_compatible(sae, model)
    return unembedding_rows(model)


def bind(model: HookedTransformer, sae: ReadoutSAE) -> ReadoutSAE:
    """Check ``sae`` against ``model`` and remember its LM-head rows so ``decompose`` needs no ``model=``."""
    check_compatible(sae, model)
    sae.bound_rows = unembedding_rows(model).to(sae.W_dec.device)
    return sae


def check_alpha(alpha: torch.Tensor, d_vocab: int) -> torch.Tensor:
    if not isinstance(alpha, torch.Tensor):
        raise TypeError(
            f"alpha must be a dense torch.Tensor over the vocabulary, got {type(alpha).__name__}; build "
            f"one with token_logit / margin / group_mean / vocab_mean_contrast / top1_vs_competitor."
        )
    if alpha.ndim != 1 or alpha.shape[0] != d_vocab:
        raise ValueError(
            f"alpha must have shape ({d_vocab},) (one coefficient per vocabulary row), got {tuple(alpha.shape)}."
        )
    check_finite(
        alpha,
        "score coefficients alpha",
        hint="Build alpha with token_logit / margin / group_mean / vocab_mean_contrast / top1_vs_competitor.",
    )
    return alpha


@torch.no_grad()
def decompose(
    sae: ReadoutSAE,
    h: Float[torch.Tensor, "... d_model"],
    alpha: Float[torch.Tensor, " d_vocab"],
    *,
    model: HookedTransformer | None = None,
    n_top: int = 10,
    n_label: int = 6,
    dtype: torch.dtype = torch.float64,
) -> Decomposition:
    """Decompose s = h·q_α into bias, per-feature contributions and residual (docs/design.md §6).

    Args:
        sae: a fitted :class:`ReadoutSAE`.
        h: decoded state(s) h̃ ([d_model] or [n, d_model]), e.g. ``LN_f(resid)`` or a fitted lens' output.
        alpha: dense coefficients over the vocabulary (see the family helpers in this module).
        model: the model the dictionary was fitted to (checked against it; its tokenizer labels the top features);
            optional after :func:`bind` (and right after fitting).
        n_top: features listed in ``top_features`` (single state only).
        n_label: top unembedding rows per feature label.
        dtype: accumulation dtype (float64 keeps the identity at ~1e-12 relative).
    """
    _check_finite_dictionary(sae)
    rows = _rows_for(sae, model)
    tokenizer = getattr(model, "tokenizer", None)
    return decompose_rows(sae, h, alpha, rows, n_top=n_top, n_label=n_label, dtype=dtype, tokenizer=tokenizer)


@torch.no_grad()
def decompose_rows(
    sae: ReadoutSAE,
    h: Float[torch.Tensor, "... d_model"],
    alpha: Float[torch.Tensor, " d_vocab"],
    rows: Float[torch.Tensor, "d_vocab d_model"],
    *,
    n_top: int = 10,
    n_label: int = 6,
    dtype: torch.dtype = torch.float64,
    tokenizer=None,
) -> Decomposition:
    """:func:`decompose` against LM-head ``rows`` already checked against ``sae`` (the readout methods' inner loops
    call it with the rows of one :func:`~tl_query_lens.readout.sae.check_compatible` check, so the float64 row
    residuals stay cached across calls)."""
    _check_finite_dictionary(sae)
    if rows.shape != (sae.cfg.d_vocab, sae.cfg.d_in):
        raise ValueError(
            f"Rows of shape {tuple(rows.shape)} do not match the readout SAE ({sae.cfg.d_vocab} × {sae.cfg.d_in})."
        )
    h = check_state(h, sae.cfg.d_in)
    alpha = check_alpha(alpha, sae.cfg.d_vocab).to(rows.device)
    single = h.ndim == 1
    h2 = h.reshape(-1, h.shape[-1]).to(rows.device, dtype)
    nz = alpha.nonzero().squeeze(-1)
    rows64, resid64 = sae._float64_rows(rows)
    mu = sae.b_dec.detach().to(rows.device, dtype)
    D = sae.W_dec.detach().to(rows.device, dtype)
    if nz.numel() == alpha.numel():  # dense α (e.g. a vocabulary-mean contrast): no gathers
        a, w, resid = alpha.to(dtype), rows64.to(dtype), resid64.to(dtype)
        idx, val = sae.row_codes()
    else:
        a, w, resid = alpha[nz].to(dtype), rows64[nz].to(dtype), resid64[nz].to(dtype)
        idx, val = sae.row_codes(nz)
    val = val.to(dtype)
    # Σ α_t r_t from the rows' own residuals r_t = w_t − μ − Σ_i z_{t,i} d_i (computed once per dictionary and rows).
    r_alpha = a @ resid
    beta = torch.zeros(sae.cfg.d_sae, dtype=dtype, device=rows.device).index_add_(
        0, idx.reshape(-1), (a[:, None] * val).reshape(-1)
    )
    proj = h2 @ D.T
    alpha_sum = float(a.sum())
    per_state = {
        "exact": h2 @ (a @ w),
        "bias": alpha_sum * (h2 @ mu),
        "contributions": proj * beta,
        "residual": h2 @ r_alpha,
        "projections": proj,
    }
    if single:  # one state: no state axis
        per_state = {name: value[0] for name, value in per_state.items()}
    result = Decomposition(**per_state, beta=beta, alpha_sum=alpha_sum)  # type: ignore[arg-type]
    check_outputs(result, "decompose", hint="The LM-head rows hold NaN/inf.")
    if single:
        labels = feature_labels(sae, [i for i, _ in result.top(n_top)], n=n_label, tokenizer=tokenizer)
        result.top_features = [
            {
                "feature": i,
                "contribution": c,
                "beta": float(beta[i]),
                "projection": float(proj[0, i]),
                "label": labels[i],
            }
            for i, c in result.top(n_top)
        ]
    return result


def _check_finite_dictionary(sae: ReadoutSAE) -> None:
    check_dictionary_finite(
        sae, {"W_dec": sae.W_dec, "b_dec": sae.b_dec, "code_values": sae.code_values, "row_norms": sae.row_norms}
    )


@torch.no_grad()
def feature_top_rows(sae: ReadoutSAE, feature: int, n: int = 6) -> list[int]:
    """Token ids of the vocabulary rows with the largest code z_{t,i} on ``feature``."""
    if not 0 <= feature < sae.cfg.d_sae:
        raise IndexError(f"Feature {feature} is out of range 0..{sae.cfg.d_sae - 1}.")
    sae.check_codes()
    rows, slots = (sae.code_indices == feature).nonzero(as_tuple=True)
    vals = sae.code_values[rows, slots]
    order = vals.argsort(descending=True)[:n]
    return rows[order].tolist()


def feature_labels(sae: ReadoutSAE, features: Sequence[int], *, n: int = 6, tokenizer=None) -> dict[int, str]:
    """Label = the feature's top unembedding rows, decoded with ``tokenizer`` when given (else token ids)."""
    out = {}
    for f in features:
        ids = feature_top_rows(sae, int(f), n)
        out[int(f)] = " | ".join(repr(tokenizer.decode([t])) for t in ids) if tokenizer is not None else str(ids)
    return out


# --------------------------------------------------------------------------------------------- score families
def _one_hot(tokens: Sequence[int] | torch.Tensor, d_vocab: int, weight: float = 1.0) -> torch.Tensor:
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    if tokens.numel() == 0:
        raise ValueError("A score family needs at least one token.")
    if int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab:
        raise IndexError(f"Token ids must be in 0..{d_vocab - 1}.")
    return torch.zeros(d_vocab).index_add_(0, tokens, torch.full((tokens.numel(),), weight))


def token_logit(token: int, d_vocab: int) -> torch.Tensor:
    """α = e_t: the logit of one token."""
    return _one_hot([token], d_vocab)


def margin(positive: int | Sequence[int], negative: int | Sequence[int], d_vocab: int) -> torch.Tensor:
    """α = +1 on ``positive``, −1 on ``negative`` (group means when lists are given): a logit difference."""
    pos = torch.as_tensor(positive).reshape(-1)
    neg = torch.as_tensor(negative).reshape(-1)
    return _one_hot(pos, d_vocab, 1.0 / pos.numel()) - _one_hot(neg, d_vocab, 1.0 / neg.numel())


def group_mean(tokens: Sequence[int], d_vocab: int) -> torch.Tensor:
    """α = 1/|G| on a token group: the group's mean logit."""
    ids = torch.as_tensor(tokens).reshape(-1)
    return _one_hot(ids, d_vocab, 1.0 / ids.numel())


def vocab_mean_contrast(token: int, d_vocab: int) -> torch.Tensor:
    """α = e_t − 1/|V|: a token's logit against the vocabulary mean."""
    return token_logit(token, d_vocab) - 1.0 / d_vocab


class Contrast(NamedTuple):
    """A score and the tokens it contrasts: ``alpha`` = e_top1 − e_competitor."""

    alpha: Float[torch.Tensor, " d_vocab"]
    top1: int
    competitor: int


@torch.no_grad()
def top1_vs_competitor(h: torch.Tensor, model, competitor: int | None = None) -> Contrast:
    """α = e_top1 − e_competitor for state h under the dense head; the competitor defaults to the runner-up.

    Returns a :class:`Contrast` (``alpha``, ``top1``, ``competitor``; unpacks like a tuple).
    """
    logits = check_state(h, model.cfg.d_model).reshape(-1).float() @ model.W_U.float() + model.b_U.float()
    top2 = logits.topk(2).indices.tolist()
    top1 = top2[0]
    if competitor is None:
        competitor = top2[1]
    if competitor == top1:
        raise ValueError(f"The competitor {competitor} is the top-1 token itself; choose another token.")
    return Contrast(margin(top1, competitor, model.cfg.d_vocab), top1, int(competitor))


register_operation("decompose", decompose)  # ReadoutSAE.decompose
