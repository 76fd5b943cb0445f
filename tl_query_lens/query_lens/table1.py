"""The Query Lens paper's Table-1 protocol as one function: signatures of sampled features of several dictionaries by
every method, scored by :func:`~tl_query_lens.query_lens.evaluation.evaluate_signatures` (DESIGN §5).

Departures from the paper are the CPU-sized corpora (see docs/query_lens_evaluation.md); the method set is
:data:`~tl_query_lens.query_lens.lens.SIGNATURE_METHODS` plus the ZO / TC baselines of :class:`EvaluationConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.query_lens.evaluation import EvaluationConfig, SignatureEvaluation, evaluate_signatures
from tl_query_lens.query_lens.lens import SIGNATURE_METHODS, QueryLens
from tl_query_lens.query_lens.max_activating import max_activating_contexts

logger = logging.getLogger(__name__)

# Input % / Output % of the paper (GPT-2 small), for side-by-side tables (different model and corpus sizes).
PAPER_GPT2 = {"LL_KEY": (7.84, 4.32), "LL_VALUE": (11.74, 12.57), "QL_KEY": (39.32, 1.97), "QL_VALUE": (26.43, 15.24)}


@dataclass
class Table1Config(EvaluationConfig):
    """Options of :func:`evaluate_table1`: those of :class:`EvaluationConfig` plus

    Attributes:
        k: signature size.
        features_per_layer: features sampled (seeded, without replacement) per dictionary.
        features: explicit feature ids used for every dictionary instead of a sample (None: sample).
        methods: signature methods scored (names of :data:`SIGNATURE_METHODS`).
        skip_positions / chunk / cache_dir: the Query Lens engine's options (operators kept in ``cache_dir``).
        up_key: also score the authors' SwiGLU key (up-projection column at ``hook_resid_mid``) as LL_KEY_UP /
            QL_KEY_UP beside LL_KEY / QL_KEY.
    """

    k: int = 25
    features_per_layer: int = 13
    features: tuple[int, ...] | None = None
    methods: tuple[str, ...] = tuple(SIGNATURE_METHODS)
    skip_positions: int = 0
    chunk: int = 64
    cache_dir: str | None = None
    up_key: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.methods = tuple(self.methods)
        self.features = None if self.features is None else tuple(int(f) for f in self.features)
        unknown = [m for m in self.methods if m not in SIGNATURE_METHODS]
        if unknown:
            raise ValueError(f"Unknown signature methods {unknown}; choose from {list(SIGNATURE_METHODS)}.")
        if self.k < 1 or self.features_per_layer < 1:
            raise ValueError("k and features_per_layer must be ≥ 1.")

    def evaluation(self) -> EvaluationConfig:
        """The :class:`EvaluationConfig` part."""
        return EvaluationConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EvaluationConfig)})


def evaluate_table1(
    model: HookedTransformer,
    dictionaries: Mapping[int | str, Any],
    operator_tokens: Int[torch.Tensor, "batch pos"],
    evaluation_tokens: Int[torch.Tensor, "batch pos"],
    *,
    cfg: Table1Config | None = None,
    **overrides: Any,
) -> SignatureEvaluation:
    """Table-1 input and output scores of every signature method on features of several dictionaries.

    Args:
        model: the clean model.
        dictionaries: label (usually the layer) → dictionary (anything :func:`~tl_query_lens.as_key_value` takes).
        operator_tokens: corpus of the Query Lens operators (train split).
        evaluation_tokens: corpus searched for max-activating contexts (evaluation split).
        cfg / overrides: :class:`Table1Config` (keyword overrides replace single fields).

    Returns:
        One :class:`SignatureEvaluation` over all sampled features (``config["seconds"]`` holds the timing).
    """
    cfg = resolve_config(Table1Config, cfg, overrides)
    start = time.perf_counter()
    lens = QueryLens(
        model, operator_tokens, skip_positions=cfg.skip_positions, chunk=cfg.chunk, cache_dir=cfg.cache_dir
    )
    sides = {SIGNATURE_METHODS[m] for m in cfg.methods}
    up_views = {}
    if cfg.up_key:
        from tl_query_lens.dictionaries.key_value import as_key_value
        from tl_query_lens.query_lens.paper_protocol import up_projection_key_view

        up_views = {label: up_projection_key_view(as_key_value(d, model), model) for label, d in dictionaries.items()}
    lens.precompute(
        list(dictionaries.values()) + list(up_views.values()),
        value_methods={m for s, m in sides if s == "value"},
        key_methods={m for s, m in sides if s == "key"},
    )
    seconds = {"operators_s": time.perf_counter() - start}
    gen = torch.Generator().manual_seed(cfg.seed)
    evaluation = cfg.evaluation()
    parts = []
    for label, dictionary in dictionaries.items():
        d_sae = int(dictionary.cfg.d_sae)
        if cfg.features is not None:
            features = torch.tensor(cfg.features)
        else:
            features = torch.randperm(d_sae, generator=gen)[: cfg.features_per_layer].sort().values
        signatures = lens.signature_set(dictionary, features, k=cfg.k, methods=cfg.methods)
        methods = {name: sig.top_ids for name, sig in signatures.items()}
        if label in up_views:
            up = up_views[label]
            methods["LL_KEY_UP"] = lens.key_signatures(up, features, k=cfg.k, method="logit_lens").top_ids
            methods["QL_KEY_UP"] = lens.key_signatures(up, features, k=cfg.k, method="full").top_ids
        contexts = max_activating_contexts(model, dictionary, evaluation_tokens, n_contexts=cfg.n_contexts)
        parts.append(
            evaluate_signatures(
                model, dictionary, evaluation_tokens, methods, features, contexts=contexts, cfg=evaluation
            )
        )
        logger.info("%s done after %.0f s", label, time.perf_counter() - start)
    result = SignatureEvaluation.concat(parts)
    seconds["total_s"] = time.perf_counter() - start
    result.config = {**result.config, **dataclasses.asdict(cfg), "seconds": seconds}
    return result
