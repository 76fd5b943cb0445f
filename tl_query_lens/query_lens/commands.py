"""``tlql query-lens`` and ``tlql ql-evaluate``: ``check_*(cfg, dims)`` refuses bad input before the model loads,
``run_*(model, cfg)`` returns one result (the runner, ``tl_query_lens/cli/runner.py``, saves and presents it).

The Table-1 run is shared: ``tlql ql-evaluate`` reads its operator corpus from ``--op-seqs`` / ``--op-seq-len``, and
``tlql query-lens --evaluate`` from ``--n-seqs`` / ``--seq-len`` (its evaluation corpus keeps ql-evaluate's default
size). Each dictionary's scores are kept under ``<out>/parts`` as they finish, so a stopped run resumes dictionary by
dictionary.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from transformer_lens import HookedTransformer

from tl_query_lens import corpus
from tl_query_lens.config import RunConfig
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.errors import InputError
from tl_query_lens.limits import ModelDims, check_limits, dims_of
from tl_query_lens.paths import check_folder, result_name
from tl_query_lens.presentation import Table
from tl_query_lens.query_lens import table1 as table1_method
from tl_query_lens.query_lens.config import (
    NEUTRAL_PROMPTS,
    QLEvaluateCommandConfig,
    QueryLensCommandConfig,
    Table1Config,
)
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.lens import QueryLens
from tl_query_lens.query_lens.result import Signatures
from tl_query_lens.query_lens.table1 import PAPER_GPT2
from tl_query_lens.ranges import parse_features, parse_layers
from tl_query_lens.results import SavableResult
from tl_query_lens.sources import load_sources, parse_sources

logger = logging.getLogger(__name__)

QUERY_LENS_PROMPTS = 4  # neutral prompts of `tlql query-lens --evaluate`


@dataclass
class Table1Run(SavableResult):
    """The Table-1 run of ``tlql ql-evaluate`` / ``tlql query-lens --evaluate``.

    Attributes:
        evaluation: every dictionary's features and their scores (saved in ``all/``).
        summaries: per dictionary family, :meth:`SignatureEvaluation.summary` of its features (percent, bootstrap
            CIs over features, seeded by ``--seed``).
        groups: per dictionary family, the labels of its dictionaries.
    """

    evaluation: SignatureEvaluation
    summaries: dict[str, list[dict]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)

    title: ClassVar[str] = "Table 1: input / output scores of Query Lens signatures"

    def _subfolder(self, name: str, key: Any = None) -> str:
        return "all" if name == "evaluation" else super()._subfolder(name, key)

    def scalars(self) -> dict[str, float]:
        """The evaluation's scalars (scores per method, steering) and its timing (``timing/…``)."""
        seconds = self.evaluation.config.get("seconds", {})
        return self.evaluation.scalars() | {f"timing/{k}": float(v) for k, v in seconds.items()}

    def tables(self) -> dict[str, Table]:
        """``table1``: one row per dictionary family and method, the paper's GPT-2 numbers beside;
        ``per_feature``: the evaluation's per-feature table."""
        keys = list(next(iter(self.summaries.values()))[0]) if self.summaries else ["method", "n_features"]
        columns: dict[str, Any] = {"dictionary": str, "method": str, "n_features": int}
        columns |= {k: float for k in keys[2:]} | {"paper_input": (float, None), "paper_output": (float, None)}
        rows = [
            [group, *(r[k] for k in keys), *PAPER_GPT2.get(r["method"], (None, None))]
            for group, summary in self.summaries.items()
            for r in summary
        ]
        return {"table1": Table.build(columns, rows), "per_feature": self.evaluation.tables()["per_feature"]}

    def summary_line(self) -> str:
        """Each family's summary beside the paper's numbers, and the time taken."""
        seconds = self.evaluation.config.get("seconds", {})
        labels = list(dict.fromkeys(self.evaluation.dictionaries))
        lines = [f"Table 1 ({self.evaluation.features.numel()} features of {labels})"]
        for group, rows in self.summaries.items():
            members = self.groups.get(group, [])
            lines.append(
                f"\n{group} ({rows[0]['n_features']} features of {len(members)} dictionaries: {', '.join(members)})"
            )
            lines.append(SignatureEvaluation.format_summary(rows, PAPER_GPT2))
        total, operators = seconds.get("total_s", math.nan), seconds.get("operators_s", math.nan)
        return "\n".join([*lines, f"total {total:.0f} s (operators {operators:.0f} s)"])


@dataclass
class QueryLensRun(SavableResult):
    """The signature sets of ``tlql query-lens``, by ``"layer<L>_<side>"``; each is saved in a folder of that name.

    Attributes:
        signatures: ``"layer18_value"`` → its :class:`~tl_query_lens.query_lens.result.Signatures`.
    """

    signatures: dict[str, Signatures] = field(default_factory=dict)

    title: ClassVar[str] = "Query Lens signatures"

    def _subfolder(self, name: str, key: Any = None) -> str:
        return result_name(key) if name == "signatures" and key is not None else super()._subfolder(name, key)

    def scalars(self) -> dict[str, float]:
        """Each set's scalars (features, k, corpus tokens), prefixed by its name."""
        return {f"{name}/{k}": v for name, sig in self.signatures.items() for k, v in sig.scalars().items()}

    def tables(self) -> dict[str, Table]:
        """One table per set (``layer18_value``): its features' top / bottom tokens and scores."""
        return {name: sig.tables()["signatures"] for name, sig in self.signatures.items()}

    def summary_line(self) -> str:
        """The top tokens of the first three features of each set."""
        lines = []
        for name, sig in self.signatures.items():
            lines += [f"  {name} feature {row[0]}: top {row[4]}" for row in sig.to_table()[1][:3]]
        return "\n".join(lines)


def check_ql_evaluate(cfg: QLEvaluateCommandConfig, dims: ModelDims | None) -> None:
    """``tlql ql-evaluate`` before the model loads: prompts, folders, dictionaries, layers, corpus and sizes."""
    _check_table1(cfg.run, cfg.table1, dims, op_seq_len=cfg.op_seq_len, n_prompts=cfg.n_prompts, n_eval=cfg.run.n_seqs)


def run_ql_evaluate(model: HookedTransformer, cfg: QLEvaluateCommandConfig) -> Table1Run:
    """``tlql ql-evaluate`` (:class:`~tl_query_lens.query_lens.config.QLEvaluateCommandConfig`)."""
    return _run_table1(model, cfg.run, cfg.table1, op=(cfg.op_seqs, cfg.op_seq_len), n_prompts=cfg.n_prompts, ev=None)


def check_query_lens(cfg: QueryLensCommandConfig, dims: ModelDims | None) -> None:
    """``tlql query-lens`` before the model loads: folders, positions, layers, features and k against the model."""
    run, engine = cfg.run, cfg.table1.engine
    if cfg.evaluate:
        n_eval = QLEvaluateCommandConfig().run.n_seqs
        _check_table1(run, cfg.table1, dims, op_seq_len=run.seq_len, n_prompts=QUERY_LENS_PROMPTS, n_eval=n_eval)
        return
    if engine.cache_dir:
        check_folder(engine.cache_dir, "--cache-dir")
    if engine.skip_positions >= run.seq_len:
        raise InputError(
            f"--skip-positions {engine.skip_positions} leaves no position of --seq-len {run.seq_len}; lower it."
        )
    parse_layers(run.layers, dims.n_layers if dims else None)
    parse_features(run.features or "all", dims.d_mlp if dims else None)
    check_limits(dims, {"--k": (cfg.table1.k, "d_vocab")}, run.model)


def run_query_lens(model: HookedTransformer, cfg: QueryLensCommandConfig) -> QueryLensRun | Table1Run:
    """``tlql query-lens`` (:class:`~tl_query_lens.query_lens.config.QueryLensCommandConfig`): the signatures of
    ``--features`` of the FF-KV dictionary of each of ``--layers``, per side; with ``evaluate`` the Table-1 run."""
    run, table1 = cfg.run, cfg.table1
    if cfg.evaluate:
        ev = QLEvaluateCommandConfig().run
        op = (run.n_seqs, run.seq_len)
        return _run_table1(model, run, table1, op=op, n_prompts=QUERY_LENS_PROMPTS, ev=(ev.n_seqs, ev.seq_len))
    layers = parse_layers(run.layers, model.cfg.n_layers)
    features = parse_features(run.features or "all", model.cfg.d_mlp)  # checked before any operator
    check_limits(dims_of(model), {"--k": (table1.k, "d_vocab")}, run.model)
    tokens = corpus.load_corpus(run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="train", seed=run.seed)
    lens = QueryLens(model, tokens, engine=table1.engine)
    sides = ["value", "key"] if cfg.side == "both" else [cfg.side]
    # first_order is value-side only
    key_method: Literal["full", "logit_lens"] = "full" if cfg.method == "first_order" else cfg.method
    result = QueryLensRun()
    for layer in layers:
        sae = FFKV.from_model(model, layer)
        for side in sides:
            if side == "value":
                sig = lens.value_signatures(sae, features, k=table1.k, method=cfg.method)
            else:
                sig = lens.key_signatures(sae, features, k=table1.k, method=key_method)
            result.signatures[f"layer{layer}_{side}"] = sig
            logger.info("layer %d %s (%s): %d features", layer, side, sig.method, len(sig))
    return result


def _check_table1(
    run: RunConfig, table1: Table1Config, dims: ModelDims | None, *, op_seq_len: int, n_prompts: int, n_eval: int
) -> None:
    if not 1 <= n_prompts <= len(NEUTRAL_PROMPTS):
        raise InputError(
            f"--n-prompts {n_prompts}: 1..{len(NEUTRAL_PROMPTS)} (only {len(NEUTRAL_PROMPTS)} neutral prompts exist)."
        )
    for what, path in {"--cache-dir": table1.engine.cache_dir, "--checkpoint-dir": table1.checkpoint_dir}.items():
        if path:
            check_folder(path, what)
    if dims is not None and op_seq_len > dims.n_ctx:
        raise InputError(f"--op-seq-len {op_seq_len} exceeds the model context {dims.n_ctx}.")
    sources = parse_sources(run.dictionary)
    parse_layers(run.layers, dims.n_layers if dims else None)
    if n_eval < table1.n_contexts:
        raise InputError(
            f"the evaluation corpus has {n_eval} sequences (--n-seqs) but --n-contexts is {table1.n_contexts}: each "
            f"feature needs that many max-activating contexts. Raise --n-seqs to ≥ {table1.n_contexts} or lower "
            "--n-contexts."
        )
    only_ffkv = all(s.kind == "ffkv" for s in sources)
    if run.features and only_ffkv:
        parse_features(run.features, dims.d_mlp if dims else None)
    limits = {
        "--k": (table1.k, "d_vocab"),
        **({"--features-per-layer": (table1.features_per_layer, "d_mlp")} if only_ffkv else {}),
    }
    check_limits(dims, limits, run.model)


def _run_table1(
    model: HookedTransformer,
    run: RunConfig,
    table1: Table1Config,
    *,
    op: tuple[int, int],
    n_prompts: int,
    ev: tuple[int, int] | None,
) -> Table1Run:
    """Dictionaries loaded, :func:`~tl_query_lens.query_lens.table1.evaluate_table1` on the operator corpus ``op``
    and the evaluation corpus ``ev`` (None: ``--n-seqs`` × ``--seq-len``), one summary per dictionary family."""
    out = Path(run.out)
    engine = dataclasses.replace(table1.engine, cache_dir=table1.engine.cache_dir or str(out / "operators"))
    cfg = dataclasses.replace(
        table1,
        features=None,
        prompts=NEUTRAL_PROMPTS[:n_prompts],
        engine=engine,
        checkpoint_dir=table1.checkpoint_dir or str(out / "parts"),
    )
    check_limits(dims_of(model), {"--k": (cfg.k, "d_vocab")}, run.model)
    loaded = load_sources(parse_sources(run.dictionary), model, parse_layers(run.layers, model.cfg.n_layers))
    saes: dict[int | str, Any] = {d.label: d.sae for d in loaded}
    d_sae = min(int(sae.cfg.d_sae) for sae in saes.values())
    if cfg.features_per_layer > d_sae:  # all of them would be used, silently
        raise InputError(
            f"--features-per-layer {cfg.features_per_layer} exceeds the {d_sae} features of the narrowest dictionary; "
            f"give at most {d_sae} (or --features 'all' for every one)."
        )
    if run.features:  # checked against every dictionary before any operator is computed
        cfg.features = tuple(parse_features(run.features, d_sae) or range(d_sae))
    ev_seqs, ev_seq_len = ev or (run.n_seqs, run.seq_len)
    op_tokens = corpus.load_corpus(run.corpus, model, n_seqs=op[0], seq_len=op[1], split="train", seed=run.seed)
    ev_tokens = corpus.load_corpus(
        run.corpus, model, n_seqs=ev_seqs, seq_len=ev_seq_len, split="evaluation", seed=run.seed
    )
    result = table1_method.evaluate_table1(model, saes, op_tokens, ev_tokens, cfg=cfg)
    groups = {d.group: [e.label for e in loaded if e.group == d.group] for d in loaded}
    summaries = {group: result.select(labels).summary(seed=run.seed) for group, labels in groups.items()}
    return Table1Run(evaluation=result, summaries=summaries, groups=groups)
