"""The Query Lens paper's Table-1 protocol as one function: signatures of sampled features of several dictionaries by
every method, scored by :func:`~tl_query_lens.query_lens.evaluation.evaluate_signatures` (docs/design.md §5).

Departures from the paper are the CPU-sized corpora (see docs/query_lens_evaluation.md); the method set is
:data:`~tl_query_lens.query_lens.config.SIGNATURE_METHODS` plus the ZO / TC baselines of :class:`EvaluationConfig`.
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
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import CorruptFileError, InputError
from tl_query_lens.models import dictionary_fingerprint, weights_fingerprint
from tl_query_lens.operators.distributed import all_ranks, gathered_by_key, rank_and_world
from tl_query_lens.paths import check_folder, result_name
from tl_query_lens.precision import model_passes
from tl_query_lens.query_lens.config import SIGNATURE_METHODS, Table1Config
from tl_query_lens.query_lens.evaluation import SignatureEvaluation, evaluate_signatures
from tl_query_lens.query_lens.lens import QueryLens
from tl_query_lens.query_lens.max_activating import MaxActivations, max_activating_contexts
from tl_query_lens.query_lens.protocols.paper import up_projection_key_view

logger = logging.getLogger(__name__)

# Input % / Output % of the paper (GPT-2 small), for side-by-side tables (different model and corpus sizes).
PAPER_GPT2 = {"LL_KEY": (7.84, 4.32), "LL_VALUE": (11.74, 12.57), "QL_KEY": (39.32, 1.97), "QL_VALUE": (26.43, 15.24)}


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
