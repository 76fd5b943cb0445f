"""Signatures: the result of a Query Lens call — top/bottom tokens of every requested feature, streamable scores."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from tl_query_lens.presentation import Table
from tl_query_lens.results import SavableResult


@dataclass
class Signatures(SavableResult):
    """Key or value signatures of ``n_features`` features (docs/design.md §5).

    Scores of feature i over the vocabulary are ``readout(directions[i])``: for ``readout="unembed"`` that is
    ``directions[i] @ W_U`` (``+ b_U`` when ``add_bias``), for ``"embed"`` ``W_E @ directions[i]`` (raw LL_KEY), for
    ``"embed_centred"`` ``((W_E − c)/‖W_E − c‖) @ directions[i]`` (QL_KEY). Only the top/bottom k are stored;
    :meth:`scores` recomputes one feature's full vector on demand.

    Attributes:
        side: ``"value"`` (what the feature promotes) or ``"key"`` (what activates it).
        method: ``"full"``, ``"first_order"`` or ``"logit_lens"``.
        hook: the value hook (value side; for post-norm blocks' corpus methods the source hook the tangent is pushed
            from, e.g. ``blocks.l.mlp.hook_post``) or read hook (key side) of the dictionary.
        feature_ids: ``[n_features]`` dictionary indices, in request order.
        top_ids / top_scores: ``[n_features, k]`` highest-scoring tokens, best first.
        bottom_ids / bottom_scores: ``[n_features, k]`` lowest-scoring tokens, lowest first.
        directions: ``[n_features, d_model]`` vectors the readout scores (after LN_f on the value side).
        readout: how directions become vocabulary scores (see above).
        add_bias: whether ``b_U`` is added (value/full only, docs/design.md §5).
        center: mean embedding c of the corpus tokens (``embed_centred`` readout), else None.
        top_strings / bottom_strings: decoded tokens when the model has a tokenizer.
        module_names / module_shares: first-order decomposition (``method="first_order"``): share of the top-k scores
            carried by the direct term ``v`` and by each downstream module's ``J̄ v`` (see ``QueryLens``); rows sum to 1.
            ``module_contributions`` holds the same terms in logit units, summed over the top-k tokens.
        model_name / corpus_fingerprint / n_tokens / skip_positions: provenance.
    """

    side: str
    method: str
    hook: str
    feature_ids: Int[torch.Tensor, " n_features"]
    top_ids: Int[torch.Tensor, "n_features k"]
    top_scores: Float[torch.Tensor, "n_features k"]
    bottom_ids: Int[torch.Tensor, "n_features k"]
    bottom_scores: Float[torch.Tensor, "n_features k"]
    directions: Float[torch.Tensor, "n_features d_model"]
    readout: str
    add_bias: bool = False
    center: Float[torch.Tensor, " d_model"] | None = None
    top_strings: list[list[str]] | None = None
    bottom_strings: list[list[str]] | None = None
    module_names: list[str] | None = None
    module_shares: Float[torch.Tensor, "n_features n_terms"] | None = None
    module_contributions: Float[torch.Tensor, "n_features n_terms"] | None = None
    model_name: str = ""
    corpus_fingerprint: str = ""
    n_tokens: int = 0
    skip_positions: int = 0
    _model: HookedTransformer | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.feature_ids.shape[0])

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    def attach(self, model: HookedTransformer) -> Signatures:
        """Give a loaded result the model whose W_U / W_E :meth:`scores` needs; returns self."""
        if model.cfg.d_model != self.directions.shape[1]:
            raise ValueError(
                f"Model d_model={model.cfg.d_model} does not match directions of width {self.directions.shape[1]}."
            )
        self._model = model
        return self

    @torch.no_grad()
    def scores(self, i: int) -> Float[torch.Tensor, " d_vocab"]:
        """Full-vocabulary scores of the i-th requested feature (position in ``feature_ids``, not the feature id)."""
        if not -len(self) <= i < len(self):
            raise IndexError(
                f"i={i} out of range for {len(self)} features; scores(i) takes a position in "
                f"feature_ids (feature {int(self.feature_ids[0])} is i=0), not a feature id."
            )
        return readout_scores(
            self._require_model(),
            self.directions[i : i + 1 if i != -1 else None],
            self.readout,
            self.add_bias,
            self.center,
        )[0]

    def _require_model(self) -> HookedTransformer:
        if self._model is None:
            raise RuntimeError(
                "This result has no model attached (e.g. it was loaded from disk): call result.attach(model) first."
            )
        return self._model

    def to_table(self, n: int | None = None) -> tuple[list[str], list[list]]:
        """``(columns, rows)``: one row per feature with its top/bottom ``n`` (default k) tokens and scores."""
        n = self.k if n is None else min(n, self.k)
        columns = ["feature", "side", "method", "hook", "top_tokens", "top_scores", "bottom_tokens", "bottom_scores"]
        if self.module_shares is not None and self.module_names is not None:
            columns += [f"share_{name}" for name in self.module_names]
        rows = []
        for i in range(len(self)):
            top = self.top_strings[i][:n] if self.top_strings else [str(t) for t in self.top_ids[i, :n].tolist()]
            bottom = (
                self.bottom_strings[i][:n] if self.bottom_strings else [str(t) for t in self.bottom_ids[i, :n].tolist()]
            )
            row = [
                int(self.feature_ids[i]),
                self.side,
                self.method,
                self.hook,
                " | ".join(map(repr, top)),
                _numbers(self.top_scores[i, :n]),
                " | ".join(map(repr, bottom)),
                _numbers(self.bottom_scores[i, :n]),
            ]
            if self.module_shares is not None:
                row += [round(x, 4) for x in self.module_shares[i].tolist()]
            rows.append(row)
        return columns, rows

    def save(self, path):
        model, self._model = self._model, None
        try:
            return super().save(path)
        finally:
            self._model = model

    def scalars(self) -> dict[str, float]:
        """How many features, the list length k and the corpus tokens behind the operators."""
        return {"n_features": float(len(self)), "k": float(self.k), "n_tokens": float(self.n_tokens)}

    def tables(self) -> dict[str, Table]:
        """``signatures``: one row per feature, its top / bottom tokens and scores (per-module shares when known)."""
        columns, rows = self.to_table()
        types: dict[str, type] = {"feature": int, **dict.fromkeys(columns[1:8], str)}
        return {"signatures": Table.build(types | {c: float for c in columns[8:]}, rows)}


def _numbers(values: torch.Tensor) -> str:
    return ", ".join(f"{x:.4g}" for x in values.tolist())


def readout_scores(
    model: HookedTransformer,
    directions: Float[torch.Tensor, "n d_model"],
    readout: str,
    add_bias: bool,
    center: torch.Tensor | None,
) -> Float[torch.Tensor, "n d_vocab"]:
    """Vocabulary scores of a few directions (see :class:`Signatures`), in fp32 whatever the model's dtype."""
    directions = directions.to(model.W_U.device, torch.float32)
    if readout == "unembed":
        scores = directions @ model.W_U.float()
        return scores + model.b_U.float() if add_bias else scores
    if readout == "embed":
        return directions @ model.W_E.float().T
    if readout == "embed_centred":
        if center is None:
            raise ValueError("readout 'embed_centred' needs the corpus mean embedding `center`.")
        return directions @ centred_embeddings(model, center).T
    raise ValueError(f"Unknown readout {readout!r}.")


def centred_embeddings(model: HookedTransformer, center: torch.Tensor) -> Float[torch.Tensor, "d_vocab d_model"]:
    """``(e_t − c)/‖e_t − c‖`` for every token t (docs/design.md §5, QL_KEY)."""
    centred = model.W_E.float() - center.to(model.W_E.device, torch.float32)
    return centred / centred.norm(dim=-1, keepdim=True).clamp_min(1e-12)
