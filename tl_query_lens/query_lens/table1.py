"""The Query Lens paper's Table-1 protocol as one function: signatures of sampled features of several dictionaries by
every method, scored by :func:`~tl_query_lens.query_lens.evaluation.evaluate_signatures` (docs/design.md §5).

Departures from the paper are the CPU-sized corpora (see docs/query_lens_evaluation.md); the method set is
:data:`~tl_query_lens.query_lens.lens.SIGNATURE_METHODS` plus the ZO / TC baselines of :class:`EvaluationConfig`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch
from jaxtyping import Int
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import CorruptFileError, InputError
from tl_query_lens.models import dictionary_fingerprint, weights_fingerprint
from tl_query_lens.operators import EngineConfig
from tl_query_lens.operators.config import fold_flat_engine_options
from tl_query_lens.operators.distributed import all_ranks, gathered_by_key, rank_and_world
from tl_query_lens.paths import check_folder, result_name
from tl_query_lens.precision import model_passes
from tl_query_lens.query_lens.evaluation import (
    EvaluationConfig,
    SignatureEvaluation,
    evaluate_signatures,
)
from tl_query_lens.query_lens.lens import SIGNATURE_METHODS, Basis, QueryLens
from tl_query_lens.query_lens.max_activating import MaxActivations, max_activating_contexts
from tl_query_lens.query_lens.protocols.paper import up_projection_key_view

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
        feature_selection: what the sample is drawn from. ``"uniform"``: every feature of the dictionary.
            ``"active"``: the features that fire (activation > 0) in at least ``n_contexts`` distinct sequences of
            the evaluation corpus, so each has N truly activating max-activating contexts (the authors require
            ≥ 20 examples per feature); a uniform draw from a trained SAE would also pick dead or rare latents whose
            "contexts" are arbitrary. ``"auto"``: ``"uniform"`` for FF-KV dictionaries (every SwiGLU/GELU neuron
            is non-zero almost everywhere, and their Table-1 rows stay as before), ``"active"`` for any other SAE.
        exclude_first_positions: leading positions of every evaluation sequence left out of the max-activating
            search and the active counts (1 for residual SAEs trained without position 0, e.g. the tlql-saes suite).
        methods: signature methods scored (names of :data:`SIGNATURE_METHODS`).
        engine: the operator engine's options (:class:`~tl_query_lens.operators.config.EngineConfig`; operators are
            kept in its cache_dir). Keyword overrides of :func:`evaluate_table1` reach its fields (``chunk=16``).
        basis: how the Query Lens operators reach the signatures. ``"identity"``: every dictionary's full value, key
            and module operators, one engine sweep per kind over all of them (d_model directions each; kept in the
            engine's cache_dir and reused by any features and any later run on the same operator corpus).
            ``"features"``: only the sampled features' directions are pushed forward (values) and pulled back
            (keys), per dictionary (``features_per_layer`` directions instead of d_model, so about d_model /
            features_per_layer times fewer passes; cached per feature set). The signatures are the same up to
            rounding (``M v`` either way). ``"auto"``: :class:`~tl_query_lens.query_lens.lens.QueryLens`' own rule
            per request (the smaller basis, as nothing is precomputed).
        up_key: also score the authors' SwiGLU key (up-projection column at ``hook_resid_mid``) as LL_KEY_UP /
            QL_KEY_UP beside LL_KEY / QL_KEY.
        checkpoint_dir: folder where each dictionary's evaluation is saved as soon as it is done; a rerun that
            matches it (model, dictionary, corpora, prompts, features and every other option) loads it instead of
            evaluating that dictionary again, so a long run that is stopped resumes dictionary by dictionary.
            None: nothing is saved (``tlql ql-evaluate``: ``<out>/parts``).
    """

    k: int = 25
    features_per_layer: int = 13
    features: tuple[int, ...] | None = None
    feature_selection: Literal["auto", "uniform", "active"] = "auto"
    exclude_first_positions: int = 0
    methods: tuple[str, ...] = tuple(SIGNATURE_METHODS)
    engine: EngineConfig = field(default_factory=EngineConfig)
    basis: Basis = "identity"
    # Deprecated spellings of engine.skip_positions / engine.chunk / engine.cache_dir (folded into engine).
    skip_positions: InitVar[int | None] = None
    chunk: InitVar[int | None] = None
    cache_dir: InitVar[str | None] = None
    up_key: bool = False
    checkpoint_dir: str | None = None

    RANGES: ClassVar[dict[str, str]] = EvaluationConfig.RANGES | {
        "k": "[1, inf)",
        "features_per_layer": "[1, inf)",
        "features": "[0, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(  # type: ignore[override]
        self, skip_positions: int | None, chunk: int | None, cache_dir: str | None
    ) -> None:
        super().__post_init__()
        self.engine = fold_flat_engine_options(
            "Table1Config", self.engine, {"skip_positions": skip_positions, "chunk": chunk, "cache_dir": cache_dir}
        )
        self.methods = tuple(self.methods)
        self.features = None if self.features is None else tuple(int(f) for f in self.features)
        unknown = [m for m in self.methods if m not in SIGNATURE_METHODS]
        if unknown:
            raise ValueError(f"Unknown signature methods {unknown}; choose from {list(SIGNATURE_METHODS)}.")
        if self.feature_selection not in ("auto", "uniform", "active"):
            raise ValueError(
                f"feature_selection must be 'auto', 'uniform' or 'active', got {self.feature_selection!r}."
            )
        if self.basis not in get_args(Basis):
            raise ValueError(f"basis must be one of {get_args(Basis)}, got {self.basis!r}.")
        if self.exclude_first_positions < 0:
            raise ValueError(f"exclude_first_positions must be ≥ 0, got {self.exclude_first_positions}.")
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
    tokenizer: Any = None,
    prompt_tokens: Sequence[torch.Tensor] | None = None,
    cfg: Table1Config | None = None,
    **overrides: Any,
) -> SignatureEvaluation:
    """Table-1 input and output scores of every signature method on features of several dictionaries.

    Args:
        model: the clean model.
        dictionaries: label (usually the layer) → dictionary (anything :func:`~tl_query_lens.as_key_value` takes).
        operator_tokens: corpus of the Query Lens operators (train split).
        evaluation_tokens: corpus searched for max-activating contexts (evaluation split).
        tokenizer / prompt_tokens: as for :func:`evaluate_signatures` (default: the model's tokenizer and
            ``cfg.prompts`` tokenised by the model).
        cfg / overrides: :class:`Table1Config` (keyword overrides replace single fields).

    Returns:
        One :class:`SignatureEvaluation` over all sampled features; ``dictionaries`` holds each feature's label,
        ``config["feature_selection_by_dictionary"]`` how each dictionary's features were chosen and
        ``config["seconds"]`` the timing (of this rank).

    Under ``torchrun`` (after ``torch.distributed.init_process_group``) each rank searches and evaluates every
    world-size-th dictionary and the engine splits the operator corpus between ranks; every rank returns the whole
    result, one process's up to the order in which the operators' sums were added (identical where they come from
    the same cache file). Ranks wait for each other between the stages: give ``init_process_group`` a ``timeout``
    longer than one dictionary's evaluation (gloo's default is 30 minutes).
    """
    cfg = resolve_config(Table1Config, cfg, overrides)
    if cfg.checkpoint_dir is not None:
        check_folder(cfg.checkpoint_dir, "checkpoint_dir")  # before any pass, so nothing computed is lost to it
    start = time.perf_counter()
    up_views = {}
    if cfg.up_key:
        # the authors' SwiGLU key exists for FF-KV only: any other dictionary fails here, before any pass
        up_views = {label: up_projection_key_view(as_key_value(d, model), model) for label, d in dictionaries.items()}
    # Max-activating contexts first: the "active" selection reads them, and a dictionary with too few active
    # features fails here, before any operator is computed.
    # Under torch.distributed each rank takes dictionaries round-robin (searches and evaluations); the engine shards
    # the operator corpus itself. The contexts are then shared, so every rank draws the same features.
    rank, world = rank_and_world()
    mine = [label for i, label in enumerate(dictionaries) if i % world == rank]
    with model_passes(model, cfg.autocast):
        contexts = {
            label: max_activating_contexts(
                model,
                dictionaries[label],
                evaluation_tokens,
                n_contexts=cfg.n_contexts,
                exclude_first_positions=cfg.exclude_first_positions,
            )
            for label in mine
        }
    contexts = gathered_by_key(contexts, list(dictionaries))
    gen = torch.Generator().manual_seed(cfg.seed)
    chosen, selection = {}, {}
    for label, dictionary in dictionaries.items():
        chosen[label], selection[str(label)] = select_features(dictionary, contexts[label], cfg, gen, label=label)
    seconds = {"contexts_s": time.perf_counter() - start}
    lens = QueryLens(model, operator_tokens, engine=cfg.engine, basis=cfg.basis)
    if cfg.basis == "identity":
        sides = {SIGNATURE_METHODS[m] for m in cfg.methods}
        lens.precompute(
            list(dictionaries.values()) + list(up_views.values()),
            value_methods={m for s, m in sides if s == "value"},
            key_methods={m for s, m in sides if s == "key"},
        )
    evaluation = cfg.evaluation()
    # Signatures of every dictionary on every rank, in one order: a signature may still compute operators (all of
    # them in the feature basis; the up-projection key's in any case), and the engine's all-reduce needs every rank
    # to make the same calls.
    signature_ids = {}
    for label, dictionary in dictionaries.items():
        features = chosen[label]
        signatures = lens.signature_set(dictionary, features, k=cfg.k, methods=cfg.methods)
        signature_ids[label] = {name: sig.top_ids for name, sig in signatures.items()}
        if label in up_views:
            up = up_views[label]
            signature_ids[label]["LL_KEY_UP"] = lens.key_signatures(up, features, k=cfg.k, method="logit_lens").top_ids
            signature_ids[label]["QL_KEY_UP"] = lens.key_signatures(up, features, k=cfg.k, method="full").top_ids
    seconds["operators_s"] = time.perf_counter() - start - seconds["contexts_s"]  # operators and signatures
    parts, resumed = {}, []
    for label in mine:
        dictionary, features, methods = dictionaries[label], chosen[label], signature_ids[label]
        saved = None
        if cfg.checkpoint_dir is not None:
            key = _part_fingerprint(
                model, dictionary, label, features, methods, evaluation_tokens, tokenizer, prompt_tokens, cfg
            )
            saved = Path(cfg.checkpoint_dir) / f"{result_name(label)}-{key}"
        part = _load_part(saved)
        if part is not None:
            resumed.append(str(label))
        else:
            part = evaluate_signatures(
                model,
                dictionary,
                evaluation_tokens,
                methods,
                features,
                contexts=contexts[label],
                tokenizer=tokenizer,
                prompt_tokens=prompt_tokens,
                cfg=evaluation,
            )
            part.dictionaries = [str(label)] * features.numel()
            if saved is not None:
                _save_part(part, saved)
        parts[label] = part
        logger.info("%s done after %.0f s", label, time.perf_counter() - start)
    if world > 1:  # in the dictionaries' order, as one process lists them
        done = {label for labels in all_ranks(resumed) for label in labels}
        resumed = [str(label) for label in dictionaries if str(label) in done]
    result = SignatureEvaluation.concat(list(gathered_by_key(parts, list(dictionaries)).values()))
    seconds["total_s"] = time.perf_counter() - start
    result.config = {
        **result.config,
        **dataclasses.asdict(cfg),
        "feature_selection_by_dictionary": selection,
        "seconds": seconds,
        "resumed_dictionaries": resumed,  # loaded from checkpoint_dir: their time is not in ``seconds``
    }
    return result


def _part_fingerprint(
    model: HookedTransformer,
    dictionary: Any,
    label: Any,
    features: torch.Tensor,
    signatures: Mapping[str, torch.Tensor],
    evaluation_tokens: torch.Tensor,
    tokenizer: Any,
    prompt_tokens: Sequence[torch.Tensor] | None,
    cfg: Table1Config,
) -> str:
    """Hash of everything one dictionary's evaluation depends on: the model and the dictionary (weights and config),
    the features, their signatures by every method (so the operators enter through what they produced, and the
    engine's options and the basis, which change only speed, memory and rounding, do not), the evaluation corpus,
    prompts and the protocol's options. Where files are kept does not enter."""
    options = dataclasses.asdict(cfg)
    for name in ("checkpoint_dir", "engine", "basis"):
        options.pop(name)
    record = {
        "label": str(label),
        "features": features.tolist(),
        "signatures": {name: corpus_fingerprint(ids) for name, ids in signatures.items()},
        "options": options,
        "model": [str(model.cfg.model_name), weights_fingerprint(model)],
        "dictionary": dictionary_fingerprint(dictionary),
        "evaluation_tokens": corpus_fingerprint(evaluation_tokens),
        "tokenizer": None if tokenizer is None else type(tokenizer).__name__,
        "prompt_tokens": None
        if prompt_tokens is None
        else [corpus_fingerprint(t.reshape(1, -1)) for t in prompt_tokens],
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _load_part(folder: Path | None) -> SignatureEvaluation | None:
    """A dictionary's saved evaluation, or None where there is none (or it cannot be read: it is then redone)."""
    if folder is None or not folder.is_dir():
        return None
    try:
        part = SignatureEvaluation.load(folder)
    except (CorruptFileError, TypeError) as err:
        logger.warning("checkpoint %s cannot be read (%s); evaluating again", folder, err)
        return None
    logger.info("loaded %s (checkpoint_dir)", folder)
    return part


def _save_part(part: SignatureEvaluation, folder: Path) -> None:
    """Save atomically: into a sibling folder, then renamed, so a stop midway leaves no half-written part. A failed
    write (disk full) only warns: the part stays in the result being computed."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        part.save(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    except OSError as err:
        logger.warning("could not save %s (%s); the run goes on, but a rerun will evaluate it again", folder, err)


def select_features(
    dictionary: Any,
    contexts: MaxActivations,
    cfg: Table1Config,
    generator: torch.Generator,
    *,
    label: Any = "",
) -> tuple[Int[torch.Tensor, " n"], dict[str, Any]]:
    """The features of one dictionary that Table 1 scores, and how they were chosen (see ``feature_selection``).

    ``cfg.features`` when given; else ``cfg.features_per_layer`` ids drawn without replacement by ``generator``
    (seeded once per :func:`evaluate_table1` call and consumed in dictionary order), from every feature
    (``"uniform"``) or from those active in ≥ ``cfg.n_contexts`` evaluation sequences (``"active"``), sorted.

    Raises:
        OutOfRangeError: explicit ids beyond the dictionary's width.
        InputError: fewer eligible features than ``features_per_layer`` (the message says what to change).
    """

    view = as_key_value(dictionary)
    if cfg.features is not None:
        return view.feature_ids(cfg.features), {"rule": "explicit", "n_features": len(cfg.features)}
    rule = cfg.feature_selection
    if rule == "auto":
        rule = "uniform" if view.activation.startswith("ffkv") else "active"
    if rule == "uniform":
        pool = torch.arange(view.d_sae)
    else:
        if contexts.n_active.numel() != view.d_sae:
            raise InputError(f"{label}: these max-activating contexts carry no n_active counts; recompute them.")
        pool = torch.nonzero(contexts.n_active >= cfg.n_contexts).reshape(-1)
        if pool.numel() < cfg.features_per_layer:
            raise InputError(
                f"{label}: only {pool.numel()} of {view.d_sae} features fire in ≥ n_contexts={cfg.n_contexts} of the "
                f"evaluation sequences, fewer than features_per_layer={cfg.features_per_layer}; search more "
                "sequences (n_seqs / --n-seqs), sample fewer features, or choose feature_selection='uniform'."
            )
    features = pool[torch.randperm(pool.numel(), generator=generator)[: cfg.features_per_layer]].sort().values
    return features, {"rule": rule, "eligible": int(pool.numel()), "d_sae": view.d_sae}
