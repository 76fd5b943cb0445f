"""``tlql readout fit | decompose | eval``: ``check_*(cfg, dims)`` refuses bad input before the model loads,
``run_*(model, cfg)`` returns one result (the runner, ``tl_query_lens/cli/runner.py``, saves and presents it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformer_lens import HookedTransformer

from tl_query_lens import corpus
from tl_query_lens.budget import check_memory
from tl_query_lens.errors import InputError
from tl_query_lens.hooks import check_hook
from tl_query_lens.limits import ModelDims
from tl_query_lens.paths import check_folder, folder_lock
from tl_query_lens.presentation import Table
from tl_query_lens.readout.config import (
    BASELINE_ORDER,
    OWN_VARIANTS,
    PAPER_BASELINES,
    ReadoutDecomposeCommandConfig,
    ReadoutEvalCommandConfig,
    ReadoutFitCommandConfig,
)
from tl_query_lens.readout.decompose import (
    Decomposition,
    decompose,
    group_mean,
    token_logit,
    top1_vs_competitor,
    vocab_mean_contrast,
)
from tl_query_lens.readout.decompose import margin as margin_score
from tl_query_lens.readout.evaluate import ReadoutReport, evaluate_readout
from tl_query_lens.readout.fit import ReadoutFit, fit_readout
from tl_query_lens.readout.protocols.paper import PaperReadoutDiagnostics, readout_diagnostics_paper
from tl_query_lens.readout.registry import (
    READOUT_RELEASES,
    cached_sae_path,
    describe_fit_source,
    fit_command,
    fit_source,
    release_name,
)
from tl_query_lens.readout.states import collect_states, logit_lens
from tl_query_lens.results import SavableResult
from tl_query_lens.sources import DictionarySource, load_dictionary, parse_source

logger = logging.getLogger(__name__)


@dataclass
class ReadoutFitRun(ReadoutFit):
    """``tlql readout fit``: the fit and where its SAE was saved (``saved_to``)."""

    saved_to: str = ""

    def summary_line(self) -> str:
        return f"Readout SAE saved to {self.saved_to} ({self.seconds:.0f} s): " + json.dumps(self.final)


@dataclass
class ReadoutDecomposition(Decomposition):
    """``tlql readout decompose``: the decomposition of ``score`` of the state at ``hook[position]``."""

    score: str = ""
    hook: str = ""
    position: int = -1

    def summary_line(self) -> str:
        return (
            f"{self.score} at {self.hook}[{self.position}]: exact {self.exact.item():.4f} = bias "
            f"{self.bias.item():.4f} + Σc {self.contributions.sum().item():.4f} + residual {self.residual.item():.4f}"
        )


@dataclass
class ReadoutEvalRun(SavableResult):
    """``tlql readout eval``: the report of one protocol and which fit it read.

    Attributes:
        source: which readout fit was read and how it was made (:func:`~tl_query_lens.readout.registry.fit_source`).
        label: the SAE as given (the folder, or ``<release>:<sae_id>``).
        report: the mixed-layers protocol's report (saved in ``protocol_mixed_layers/``), or None.
        paper: the paper protocol's diagnostics (saved in ``protocol_paper/``), or None.
    """

    source: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    report: ReadoutReport | None = None
    paper: PaperReadoutDiagnostics | None = None

    title: ClassVar[str] = "Readout SAE evaluation"

    def _subfolder(self, name: str, key: Any = None) -> str:
        return {"report": "protocol_mixed_layers", "paper": "protocol_paper"}.get(name) or super()._subfolder(name, key)

    def _part(self) -> Any:
        return self.paper if self.paper is not None else self.report

    def scalars(self) -> dict[str, float]:
        """The protocol's scalars."""
        return self._part().scalars() if self._part() is not None else {}

    def tables(self) -> dict[str, Table]:
        """The protocol's tables (``readout_vs_baselines`` or ``baselines``)."""
        return self._part().tables() if self._part() is not None else {}

    def summary_line(self) -> str:
        """Which fit was read; the paper protocol's numbers as one JSON line, or the ablation of the mixed-layers one."""
        lines = [describe_fit_source(self.source, self.label)]
        if self.paper is not None:
            scalars = {k: v for k, v in vars(self.paper).items() if isinstance(v, (int, float))}
            keys = "coverage_ci best_baseline coverage_baselines coverage_baselines_ci coverage_baselines_by_family"
            extra = {k: getattr(self.paper, k) for k in keys.split()} | {"by_family": self.paper.coverage_by_family}
            lines.append(json.dumps(scalars | extra))
        elif self.report is not None and self.report.ablation is not None:
            lines.append("ablation: " + json.dumps(dataclasses.asdict(self.report.ablation)))
        return "\n".join(lines)


def _cache_lock(cfg: ReadoutFitCommandConfig) -> contextlib.AbstractContextManager:
    """The user cache's entry of the fit, locked (a --save folder is the user's own: written once at the end)."""
    if cfg.save:
        return contextlib.nullcontext()
    entry = cached_sae_path(cfg.run.model, cfg.sae_id or cfg.preset)
    return folder_lock(entry.parent, "the readout cache", name=f".{entry.name[:100]}.tlql.lock")


def check_fit(cfg: ReadoutFitCommandConfig, dims: ModelDims | None) -> None:
    """``tlql readout fit`` before the model loads: --save, the fit's sequence length and memory, and the cache entry
    (a second fit of the same id is refused, naming the first)."""
    fit = cfg.fit
    if cfg.save:
        check_folder(cfg.save, "--save")
    if dims is not None and fit.seq_len > dims.n_ctx:
        raise InputError(f"--seq-len {fit.seq_len} exceeds the model context {dims.n_ctx}.")
    if dims is not None and dims.d_model:  # the embedded model's width is known before it loads
        width = fit.width or fit.width_mult * dims.d_model
        check_memory(
            {
                f"--width {width}": 4 * 4 * 2 * dims.d_model * width,
                f"--batch-rows {fit.batch_rows}": 4 * 3 * fit.batch_rows * width,
            },
            "readout fit",
        )
    with _cache_lock(cfg):  # taken again by the run, for the whole fit
        pass


def run_fit(model: HookedTransformer, cfg: ReadoutFitCommandConfig) -> ReadoutFitRun:
    """``tlql readout fit`` (:class:`~tl_query_lens.readout.config.ReadoutFitCommandConfig`): the fit, its SAE saved
    to ``--save`` or the user cache (``<sae_id or preset>``, ``-capped-s<steps>`` when ``max_seconds`` stopped it)."""
    base = cfg.sae_id or cfg.preset
    with _cache_lock(cfg):
        fit = fit_readout(model, cfg=cfg.fit)
        target = Path(cfg.save) if cfg.save else cached_sae_path(cfg.run.model, fit.cache_id(base))
        fit.sae.save_model(target)
    fields = {f.name: getattr(fit, f.name) for f in dataclasses.fields(fit)}
    return ReadoutFitRun(**fields, saved_to=str(target))


def readout_source(model_name: str, sae_id: str, sae_path: str | None) -> DictionarySource:
    """The readout SAE to read: the folder, or ``sae_id`` fitted in the user cache or shipped (checked, not loaded).

    Raises:
        InputError: no such SAE (the message says how to fit it), or a folder that holds none.
    """
    if not sae_path and sae_id not in READOUT_RELEASES.available_ids(model_name):
        preset = sae_id if sae_id in ("small", "paper") else "small"
        raise InputError(
            f"No readout SAE {sae_id!r} for {model_name} is shipped or cached (available: "
            f"{READOUT_RELEASES.available_ids(model_name) or 'none'}); fit "
            f"it with `{fit_command(model_name, sae_id, preset)}`, or pass --sae-id one of those or --sae-path <folder>."
        )
    return parse_source(sae_path or f"{release_name(model_name)}:{sae_id}", "--sae-path" if sae_path else "--sae-id")


def check_decompose(cfg: ReadoutDecomposeCommandConfig, dims: ModelDims | None) -> None:
    """``tlql readout decompose`` before the model loads: a prompt and score tokens that can name something (an empty
    string is no token; a margin of a token against itself is 0 by construction), and the readout SAE."""
    if cfg.prompt == "":
        raise InputError(
            "the prompt is empty; give the text whose state to decompose, e.g. 'The capital of France is'."
        )
    given: dict[str, list[str | None]] = {
        "--token": [cfg.token],
        "--vocab-contrast": [cfg.vocab_contrast],
        "--margin": list(cfg.margin or []),
        "--group": list(cfg.group or []),
    }
    for option, texts in given.items():
        if any(text == "" for text in texts):
            raise InputError(f"{option} got an empty string, which is no token; give a token's text, e.g. ' Paris'.")
    if cfg.margin and cfg.margin[0] == cfg.margin[1]:
        raise InputError(f"--margin {cfg.margin[0]!r} {cfg.margin[1]!r}: one token against itself is 0; give two.")
    readout_source(cfg.run.model, cfg.sae_id, cfg.sae_path)


def _token_id(model: HookedTransformer, text: str) -> int:
    ids = model.to_tokens(text, prepend_bos=False)[0].tolist()
    if len(ids) != 1:
        raise InputError(f"{text!r} is {len(ids)} tokens ({ids}); give a single token (mind the leading space).")
    return ids[0]


def run_decompose(model: HookedTransformer, cfg: ReadoutDecomposeCommandConfig) -> ReadoutDecomposition:
    """``tlql readout decompose`` (:class:`~tl_query_lens.readout.config.ReadoutDecomposeCommandConfig`)."""
    sae = load_dictionary(readout_source(cfg.run.model, cfg.sae_id, cfg.sae_path))
    hook = check_hook(model, cfg.hook or f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    n_tokens = model.to_tokens(cfg.prompt).shape[1]
    if not -n_tokens <= cfg.position < n_tokens:
        raise InputError(
            f"--position {cfg.position} is outside the prompt's {n_tokens} tokens; "
            f"use 0..{n_tokens - 1} or -1 for the last."
        )
    with torch.no_grad():
        _, cache = model.run_with_cache(cfg.prompt, names_filter=[hook])
        h = logit_lens(model)(cache[hook][0, cfg.position]).float()
    V = model.cfg.d_vocab
    if cfg.token is not None:
        alpha, what = token_logit(_token_id(model, cfg.token), V), f"logit {cfg.token!r}"
    elif cfg.margin:
        pos, neg = cfg.margin
        if _token_id(model, pos) == _token_id(model, neg):
            raise InputError(f"--margin {pos!r} {neg!r} are one token; the margin would be 0. Give two tokens.")
        alpha, what = margin_score(_token_id(model, pos), _token_id(model, neg), V), f"margin {pos!r} − {neg!r}"
    elif cfg.group:
        alpha = group_mean([_token_id(model, t) for t in cfg.group], V)
        what = f"group mean {list(cfg.group)}"
    elif cfg.vocab_contrast is not None:
        token = cfg.vocab_contrast
        alpha, what = vocab_mean_contrast(_token_id(model, token), V), f"{token!r} − vocabulary mean"
    else:
        alpha, top1, comp = top1_vs_competitor(h, model)
        what = f"top-1 {model.to_string([top1])!r} − runner-up {model.to_string([comp])!r}"
    result = decompose(sae, h, alpha, model=model, n_top=cfg.top)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return ReadoutDecomposition(**fields, score=what, hook=hook, position=cfg.position)


def _baselines(cfg: ReadoutEvalCommandConfig) -> dict[str, Any]:
    """``{"baselines": chosen}`` from --baselines (checked against the protocol's), or {} for the protocol's own."""
    chosen = tuple(b for b in (cfg.baselines or "").split(",") if b)
    known = PAPER_BASELINES + OWN_VARIANTS if cfg.protocol == "paper" else BASELINE_ORDER
    unknown = [b for b in chosen if b not in known]
    if unknown:
        raise InputError(
            f"--baselines {unknown} unknown for --protocol {cfg.protocol}; choose from {list(known)} ('' for none)."
        )
    return {} if cfg.baselines is None else {"baselines": chosen}


def check_eval(cfg: ReadoutEvalCommandConfig, dims: ModelDims | None) -> None:
    """``tlql readout eval`` before the model loads: the baselines and the readout SAE."""
    _baselines(cfg)
    readout_source(cfg.run.model, cfg.sae_id, cfg.sae_path)


def run_eval(model: HookedTransformer, cfg: ReadoutEvalCommandConfig) -> ReadoutEvalRun:
    """``tlql readout eval`` (:class:`~tl_query_lens.readout.config.ReadoutEvalCommandConfig`)."""
    run = cfg.run
    source = readout_source(run.model, cfg.sae_id, cfg.sae_path)
    label = cfg.sae_path or f"{release_name(run.model)}:{cfg.sae_id}"
    provenance = fit_source(run.model, cfg.sae_id, cfg.sae_path)  # which fit is read, and how it was made
    logger.info(describe_fit_source(provenance, label))
    readout = load_dictionary(source)
    tokens = corpus.load_corpus(
        run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="evaluation", seed=run.seed
    )
    result = ReadoutEvalRun(source=provenance, label=label)
    if cfg.protocol == "paper":
        states = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
        paper = dataclasses.replace(cfg.paper, **_baselines(cfg))
        result.paper = readout_diagnostics_paper(model, readout, states, cfg=paper)
    else:
        own = dataclasses.replace(cfg.readout, **_baselines(cfg))
        result.report = evaluate_readout(model, readout, collect_states(model, tokens), cfg=own)
    return result
