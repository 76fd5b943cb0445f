"""The evaluation protocol of the Query Lens paper's Table 1: input and output scores of token signatures (docs/design.md §5).

Input score I(T): share of a feature's max-activating tokens (top token of each of its N most-activating corpus
contexts) whose normalised string is in T. Output score O(T) = |S ∩ T| / |S|, S = the 25 tokens whose rank percentile
rises most, on average over positions, when the feature is clamped to α on prompt and generated positions of neutral
prompts (α set by bisection so that KL(clean ‖ steered) hits a target). Any method's top-k ids can be scored; the
ZO and TC baselines are computed here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import UnknownNameError
from tl_query_lens.precision import model_passes
from tl_query_lens.presentation import Table
from tl_query_lens.primitives import bootstrap_indices, mean_ci
from tl_query_lens.query_lens.config import EvaluationConfig
from tl_query_lens.query_lens.max_activating import (
    MaxActivations,
    max_activating_contexts,
    output_scores,
)
from tl_query_lens.query_lens.protocols import PROTOCOLS
from tl_query_lens.query_lens.protocols.tlql import kl_matched_alphas, steering_top_tokens  # noqa: F401  (re-exported)
from tl_query_lens.query_lens.steering import clamp_signatures, sample_continuations, zero_ablation_signatures
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


# SignatureEvaluation's tensor fields and their feature axis (joined by concat, indexed by select).
_FEATURE_AXIS = {
    "features": 0,
    "layers": 0,
    "input_scores": 1,
    "output_scores": 2,
    "alphas": 1,
    "search_kl": 1,
    "achieved_kl": 1,
    "steered_top": 1,
    "signature_ids": 1,
}


@dataclass
class SignatureEvaluation(SavableResult):
    """Per-feature input / output scores of every method (fractions in [0, 1]).

    Attributes:
        methods: method names, the row order of the score tensors.
        features: ``[n]`` feature ids. layers: ``[n]`` layer of each feature's dictionary read hook.
        kl_targets: KL targets (nats), the order of the target axis.
        input_scores: ``[n_methods, n]``.
        output_scores: ``[n_methods, n_targets, n]``.
        alphas: ``[n_targets, n]`` clamp values found by the search.
        search_kl: ``[n_targets, n]`` KL at α on the clean continuations used by the search.
        achieved_kl: ``[n_targets, n]`` KL at α on the steered generations the output score is measured on.
        steered_top: ``[n_targets, n, n_steered]`` the steering top tokens S.
        signature_ids: ``[n_methods, n, k]`` the scored token sets T (rows padded with -1 if methods differ in k).
        config: the protocol settings.
        dictionaries: label of each feature's dictionary (set by :func:`~tl_query_lens.query_lens.table1.
            evaluate_table1`; empty when unknown).
    """

    methods: list[str]
    features: Int[torch.Tensor, " n"]
    layers: Int[torch.Tensor, " n"]
    kl_targets: list[float]
    input_scores: Float[torch.Tensor, "n_methods n"]
    output_scores: Float[torch.Tensor, "n_methods n_targets n"]
    alphas: Float[torch.Tensor, "n_targets n"]
    search_kl: Float[torch.Tensor, "n_targets n"]
    achieved_kl: Float[torch.Tensor, "n_targets n"]
    steered_top: Int[torch.Tensor, "n_targets n n_steered"]
    signature_ids: Int[torch.Tensor, "n_methods n k"]
    config: dict = field(default_factory=dict)
    dictionaries: list[str] = field(default_factory=list)

    @classmethod
    def concat(cls, results: Sequence[SignatureEvaluation]) -> SignatureEvaluation:
        """Join evaluations of different dictionaries (same methods and targets) along the feature axis."""
        first = results[0]
        for r in results[1:]:
            if r.methods != first.methods or list(r.kl_targets) != list(first.kl_targets):
                raise ValueError("Only evaluations with the same methods and KL targets can be joined.")
        labelled = all(len(r.dictionaries) == r.features.numel() for r in results)
        return cls(
            methods=first.methods,
            kl_targets=list(first.kl_targets),
            config=dict(first.config),
            dictionaries=[label for r in results for label in r.dictionaries] if labelled else [],
            **{name: torch.cat([getattr(r, name) for r in results], dim=dim) for name, dim in _FEATURE_AXIS.items()},
        )

    def select(self, dictionaries: Sequence[str]) -> SignatureEvaluation:
        """The features whose dictionary label is in ``dictionaries`` (e.g. the FF-KV rows apart from the SAE rows).

        Raises:
            UnknownNameError: a label that no feature carries (the message lists the labels present).
        """
        wanted = set(dictionaries)
        if not wanted or wanted - set(self.dictionaries):
            raise UnknownNameError(
                f"No features of {sorted(wanted - set(self.dictionaries)) or 'no labels'}; labels present: "
                f"{sorted(set(self.dictionaries))}."
            )
        keep = torch.tensor([j for j, label in enumerate(self.dictionaries) if label in wanted], dtype=torch.long)
        return type(self)(
            methods=list(self.methods),
            kl_targets=list(self.kl_targets),
            config=dict(self.config),
            dictionaries=[self.dictionaries[j] for j in keep.tolist()],
            **{name: getattr(self, name).index_select(dim, keep) for name, dim in _FEATURE_AXIS.items()},
        )

    def summary(self, *, n_boot: int = 2000, seed: int = 0) -> list[dict]:
        """Mean scores in percent with percentile-bootstrap 95% CIs over features, one row per method."""
        n = self.features.numel()
        idx = bootstrap_indices(n, n_boot=n_boot, seed=seed)
        rows = []
        for m, name in enumerate(self.methods):
            row = {"method": name, "n_features": n, **mean_ci("input", self.input_scores[m], idx)}
            for t, target in enumerate(self.kl_targets):
                row.update(mean_ci(f"output@{target:g}", self.output_scores[m, t], idx))
            rows.append(row)
        return rows

    def per_feature_table(self) -> tuple[list[str], list[list]]:
        """``(columns, rows)``: one row per feature with α, achieved KL and every method's scores."""
        targets = [f"{t:g}" for t in self.kl_targets]
        labels = self.dictionaries if len(self.dictionaries) == self.features.numel() else None
        columns = ["dictionary"] * (labels is not None) + ["layer", "feature"]
        columns += [f"alpha@{t}" for t in targets] + [f"kl@{t}" for t in targets]
        for m in self.methods:
            columns += [f"{m}_input"] + [f"{m}_output@{t}" for t in targets]
        rows = []
        for j in range(self.features.numel()):
            row = [labels[j]] * (labels is not None) + [int(self.layers[j]), int(self.features[j])]  # type: ignore[index]
            row += [float(self.alphas[t, j]) for t in range(len(targets))]
            row += [float(self.achieved_kl[t, j]) for t in range(len(targets))]
            for i in range(len(self.methods)):
                row += [float(self.input_scores[i, j])]
                row += [float(self.output_scores[i, t, j]) for t in range(len(targets))]
            rows.append(row)
        return columns, rows

    @staticmethod
    def format_summary(rows: list[dict], paper: Mapping[str, tuple[float, float]] | None = None) -> str:
        """Markdown table of :meth:`summary` rows: mean [95% CI] in percent per method (``paper`` numbers beside)."""
        paper = paper or {}
        outs = [k for k in rows[0] if k.startswith("output@") and not k.endswith(("_lo", "_hi"))]
        head = "| method | Input % | " + " | ".join(f"Output % (KL {k[7:]})" for k in outs) + " | paper Input/Output |"
        lines = [head, "|" + "---|" * (3 + len(outs))]
        for r in rows:
            cells = [f"{r[key]:.2f} [{r[key + '_lo']:.2f}, {r[key + '_hi']:.2f}]" for key in ("input", *outs)]
            ref = paper.get(r["method"])
            lines.append(f"| {r['method']} | " + " | ".join(cells) + f" | {f'{ref[0]} / {ref[1]}' if ref else '—'} |")
        return "\n".join(lines)

    title: ClassVar[str] = "Signature evaluation (input / output scores)"

    def scalars(self) -> dict[str, float]:
        """Per method, the mean input and output scores (``{method}/input``, ``{method}/output@{target}``); per KL
        target, the mean clamp value and achieved KL (``steering/mean_alpha@{target}``, ``…/mean_achieved_kl@…``)."""
        out: dict[str, float] = {}
        for m, name in enumerate(self.methods):
            out[f"{name}/input"] = float(self.input_scores[m].double().mean())
            for t, target in enumerate(self.kl_targets):
                out[f"{name}/output@{target:g}"] = float(self.output_scores[m, t].double().mean())
        for t, target in enumerate(self.kl_targets):
            out[f"steering/mean_alpha@{target:g}"] = float(self.alphas[t].double().mean())
            out[f"steering/mean_achieved_kl@{target:g}"] = float(self.achieved_kl[t].double().mean())
        return out

    def tables(self) -> dict[str, Table]:
        """``summary``: :meth:`summary` (percent, bootstrap CIs), one row per method; ``per_feature``:
        :meth:`per_feature_table`."""
        summary = self.summary()
        keys = list(summary[0]) if summary else ["method", "n_features"]
        types = {"method": str, "n_features": int} | {k: float for k in keys[2:]}
        columns, rows = self.per_feature_table()
        feature_types = {
            c: (str if c == "dictionary" else int if c in ("layer", "feature") else float) for c in columns
        }
        return {
            "summary": Table.build(types, ([r[k] for k in keys] for r in summary)),
            "per_feature": Table.build(feature_types, rows),
        }


def evaluate_signatures(
    model: HookedTransformer,
    dictionary,
    tokens: Int[torch.Tensor, "batch pos"],
    methods: Mapping[str, Int[torch.Tensor, "n k"]],
    features: Sequence[int] | torch.Tensor,
    *,
    contexts: MaxActivations | None = None,
    tokenizer=None,
    prompt_tokens: Sequence[torch.Tensor] | None = None,
    cfg: EvaluationConfig | None = None,
    **overrides: Any,
) -> SignatureEvaluation:
    """Table-1 input and output scores of token signatures of one dictionary's features (docs/design.md §5).

    Args:
        model: the model the dictionary belongs to.
        dictionary: anything :func:`tl_query_lens.as_key_value` accepts.
        tokens: corpus searched for max-activating contexts (each row is one context).
        methods: name → ``[n_features, k]`` top token ids of the features, in ``features`` order (any method).
        features: feature ids.
        contexts: max-activating contexts computed earlier (else computed here).
        tokenizer: decodes ids for the input score (default ``model.tokenizer``).
        prompt_tokens: neutral prompts as token ids (default: ``cfg.prompts`` tokenised by the model).
        cfg / overrides: an :class:`EvaluationConfig`; keyword overrides (n_contexts, kl_targets, n_generate,
            temperature, seed, ...) replace single fields.
    """
    cfg = resolve_config(EvaluationConfig, cfg, overrides)
    protocol = PROTOCOLS[cfg.protocol]
    view = as_key_value(dictionary, model)
    features = view.feature_ids(features)
    methods = _check_methods(methods, len(features), model.cfg.d_vocab)
    with model_passes(model, cfg.autocast):
        return _evaluate(model, view, tokens, methods, features, contexts, tokenizer, prompt_tokens, cfg, protocol)


def _evaluate(model, view, tokens, methods, features, contexts, tokenizer, prompt_tokens, cfg, protocol):
    """The body of :func:`evaluate_signatures` (under its precision context)."""
    if contexts is None:
        contexts = max_activating_contexts(model, view, tokens, n_contexts=cfg.n_contexts)
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if tokenizer is None:
        raise ValueError("The input score compares token strings: pass tokenizer= (the model has none attached).")
    if prompt_tokens is None:
        prompt_tokens = [model.to_tokens(p, prepend_bos=model.cfg.default_prepend_bos)[0] for p in cfg.prompts]
    prompts = [torch.as_tensor(p).reshape(-1).cpu() for p in prompt_tokens]
    gen = torch.Generator().manual_seed(cfg.seed)
    clean_text = [
        sample_continuations(model, p, 1, n_generate=cfg.n_generate, temperature=cfg.temperature, generator=gen)[
            0
        ].cpu()
        for p in prompts
    ]
    if "ZO" in cfg.baselines:
        methods["ZO"] = zero_ablation_signatures(model, view, features, contexts, tokens, k=_k(methods))
    if "TC" in cfg.baselines:
        methods["TC"] = clamp_signatures(model, view, features, clean_text, values=cfg.tc_values, k=_k(methods))
    logger.info(
        "layer %s: α search for %d features, targets %s (%s protocol)",
        view.layer,
        len(features),
        cfg.kl_targets,
        cfg.protocol,
    )
    steered, achieved, alphas, search_kl = protocol.steering(
        model, view, features, prompts, clean_text, contexts, cfg, _k(methods)
    )
    names = list(methods)
    top_tokens = contexts.token[features]
    return SignatureEvaluation(
        methods=names,
        features=features,
        layers=torch.full_like(features, view.layer if view.layer is not None else -1),
        kl_targets=list(cfg.kl_targets),
        input_scores=torch.stack([protocol.input_scores(tokenizer, top_tokens, methods[m]) for m in names]),
        output_scores=torch.stack([torch.stack([output_scores(s, methods[m]) for s in steered]) for m in names]),
        alphas=alphas.float(),  # float32 also under autocast
        search_kl=search_kl.float(),
        achieved_kl=torch.stack(achieved).float(),
        steered_top=torch.stack(steered),
        signature_ids=_pad_stack([methods[m] for m in names]),
        config={**cfg.__dict__, "corpus_fingerprint": contexts.corpus_fingerprint, "read_hook": view.read_hook},
    )


def _pad_stack(ids: list[torch.Tensor]) -> torch.Tensor:
    k = max(t.shape[1] for t in ids)
    return torch.stack([torch.nn.functional.pad(t, (0, k - t.shape[1]), value=-1) for t in ids])


def _k(methods: Mapping[str, torch.Tensor]) -> int:
    return max((ids.shape[1] for ids in methods.values()), default=25)


def _check_methods(methods: Mapping[str, torch.Tensor], n: int, d_vocab: int) -> dict[str, torch.Tensor]:
    checked = {}
    for name, ids in methods.items():
        ids = torch.as_tensor(ids)
        if ids.ndim != 2 or ids.shape[0] != n or ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"Method {name!r}: expected a [n_features={n}, k] integer tensor of token ids (e.g. sig.top_ids), "
                f"got {tuple(ids.shape)} {ids.dtype}."
            )
        if ids.numel() and (ids.min() < 0 or ids.max() >= d_vocab):
            raise ValueError(f"Method {name!r} has token ids outside 0..{d_vocab - 1}; wrong tokenizer?")
        checked[name] = ids.long().cpu()
    return checked
