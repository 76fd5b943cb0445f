"""``build_atlas``: every feature of every dictionary as a static, offline, searchable site.

Stages (each with a progress bar): check the input (dictionaries, hooks, output folder, disk space) → one forward
pass over the corpus shared by every dictionary (:mod:`~tl_query_lens.atlas.collect`) → signatures from the Query
Lens engine per unit of ``shard_size`` features (:mod:`~tl_query_lens.atlas.features`) → shard files → the index,
search index, dictionary pages and exports.

A unit whose shard is already on disk with the same inputs is not rebuilt, so a stopped build resumes and an added
dictionary is built on its own. Under ``torchrun`` each rank builds the units of its dictionaries (or feature ranges,
when there are fewer dictionaries than ranks) independently, then rank 0 assembles the site: the files do not depend
on the number of ranks.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.atlas.collect import StatsCollector
from tl_query_lens.atlas.config import AtlasConfig
from tl_query_lens.atlas.dictionaries import AtlasDictionary, encode, expand_specs, load_atlas_dictionaries
from tl_query_lens.atlas.exports import export_all
from tl_query_lens.atlas.features import (
    SHARES_SHOWN,
    SHARES_TOP_K,
    neuron_links,
    readout_tokens,
    unit_signatures,
)
from tl_query_lens.atlas.records import unit_records
from tl_query_lens.atlas.site import (
    STATIC,
    feature_runs,
    free_bytes,
    js_call,
    read_shard_meta,
    search_index,
    shard_paths,
    write_shard,
    write_static,
)
from tl_query_lens.budget import check_memory
from tl_query_lens.certify.certify import Certificate  # noqa: F401  (result classes --attach can load)
from tl_query_lens.corpus import corpus_fingerprint, load_corpus
from tl_query_lens.dictionaries.absorption import AbsorptionResult  # noqa: F401
from tl_query_lens.dictionaries.splice import SpliceStats
from tl_query_lens.errors import InputError, MissingFileError
from tl_query_lens.estimates import estimate
from tl_query_lens.hooks import stop_layer
from tl_query_lens.models import weights_fingerprint
from tl_query_lens.paths import LOCK_NAME, check_folder, check_owned, clear_temporaries
from tl_query_lens.precision import Precision, model_passes, use_bf16
from tl_query_lens.presentation import Table
from tl_query_lens.query_lens.lens import QueryLens
from tl_query_lens.ranges import parse_ranges
from tl_query_lens.results import SavableResult, atomic_write_text, read_json, write_json
from tl_query_lens.saes.report import SuiteQuality  # noqa: F401

logger = logging.getLogger(__name__)

FORMAT = 1
#: Precision of the corpus pass (tl_query_lens/precision.py; the dictionaries encode in fp32 either way). The operator
#: sweeps follow EngineConfig.sweep_dtype. docs/benchmarks.md, "bf16 where its measured accuracy holds", has the
#: measurements behind both.
CORPUS_PASS_PRECISION: Precision = "auto"
#: Disk space a feature needs while building (shard JSON + JS, exports), a generous estimate for the free-space check.
BYTES_PER_FEATURE_ESTIMATE = 40_000


@dataclass
class DictionaryQuality(SavableResult):
    """The quality row of one dictionary, measured on the atlas corpus pass.

    Attributes:
        slug / label / kind / spec / layer / d_sae: which dictionary.
        l0: mean number of features active (activation != 0) per token.
        alive: share of features that fire (activation > 0) somewhere in the pass.
        explained_variance: 1 - ||y - ŷ||² / ||y - ȳ||² at the write hook (None for a vanilla FF-KV, exact by
            construction). ce_recovered: not measured by the atlas (None); see ``tlql saes report``.
        n_tokens: positions of the pass.
    """

    title = "Dictionary quality (atlas corpus)"
    slug: str
    label: str
    kind: str
    spec: str
    layer: int
    d_sae: int
    l0: float
    alive: float
    explained_variance: float | None
    ce_recovered: float | None
    n_tokens: int

    def scalars(self) -> dict[str, float]:
        out = {"L0": self.l0, "alive": self.alive, "d_sae": float(self.d_sae), "tokens": float(self.n_tokens)}
        if self.explained_variance is not None:
            out["explained variance"] = self.explained_variance
        if self.ce_recovered is not None:
            out["CE recovered"] = self.ce_recovered
        return out


@dataclass
class AtlasResult(SavableResult):
    """What a build wrote.

    Attributes:
        out: the site folder (open ``out/index.html``). model_name: the model.
        dictionaries: one row per dictionary: slug, label, kind, layer, features built.
        n_features: features in the site. n_tokens: corpus positions of the pass.
        shards_built / shards_reused: units computed by this run / found finished on disk (all ranks).
        seconds: wall time per stage on rank 0. bytes_total / bytes_gzip: the site's data files, raw and gzip-compressed.
        rank / world: the process that returns this result.
    """

    title = "Feature atlas"
    out: str
    model_name: str
    dictionaries: list = field(default_factory=list)
    n_features: int = 0
    n_tokens: int = 0
    shards_built: int = 0
    shards_reused: int = 0
    seconds: dict = field(default_factory=dict)
    bytes_total: int = 0
    bytes_gzip: int = 0
    rank: int = 0
    world: int = 1

    def scalars(self) -> dict[str, float]:
        per = self.bytes_gzip / self.n_features if self.n_features else float("nan")
        return {
            "features": float(self.n_features),
            "dictionaries": float(len(self.dictionaries)),
            "shards built": float(self.shards_built),
            "shards reused": float(self.shards_reused),
            "seconds": float(self.seconds.get("total", float("nan"))),
            "MB (gzip)": self.bytes_gzip / 1e6,
            "bytes/feature (gzip)": per,
        }

    def tables(self) -> dict[str, Table]:
        rows = [[d["slug"], d["label"], d["kind"], d["layer"], d["n_features"]] for d in self.dictionaries]
        return {
            "dictionaries": Table.build({"slug": str, "label": str, "kind": str, "layer": int, "features": int}, rows)
        }

    @property
    def index_html(self) -> Path:
        return Path(self.out) / "index.html"

    def summary_line(self) -> str:
        """Where the site is, with its size and what this run built."""
        scalars = self.scalars()
        return (
            f"Atlas of {self.n_features} features ({len(self.dictionaries)} dictionaries) in {self.out}: "
            f"open {self.index_html}  ({scalars['seconds']:.0f} s, {scalars['bytes/feature (gzip)']:.0f} "
            f"bytes/feature gzip, {self.shards_built} shards built, {self.shards_reused} reused)"
        )


@dataclass
class Unit:
    """``ids`` of one dictionary, written as one shard ``(slug, start)``."""

    dictionary: AtlasDictionary
    start: int
    ids: torch.Tensor
    fingerprint: str


def _rank_world() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise InputError(
            "build_atlas splits the work between torchrun ranks itself and must start before "
            "torch.distributed.init_process_group (the Query Lens engine would otherwise share each operator "
            "between ranks); launch it without initialising the process group."
        )
    return rank, world


#: What the atlas writes in its --out: the only places where an interrupted run's temporary files are removed.
OWNED = ("data", "shards", "meta", "results", "result", "exports", "operators", "manifest.json", *STATIC)


def _check_out(out: Path, model: HookedTransformer) -> None:
    """Refuse a file, a user's own folder (:func:`~tl_query_lens.paths.check_owned`) or a folder that holds
    another model's atlas."""
    check_folder(out, "--out")
    check_owned(out, "--out")
    manifest = out / "manifest.json"
    if manifest.is_file():
        record = read_json(manifest)
        mine = _model_record(model)
        if record.get("model") != mine:
            raise InputError(
                f"--out {out} holds an atlas of another model ({record.get('model')}); this model is {mine}. "
                "Choose another --out folder (or delete that atlas)."
            )


def _model_record(model: HookedTransformer) -> dict[str, Any]:
    cfg = model.cfg
    return {"name": str(cfg.model_name), "n_layers": cfg.n_layers, "d_model": cfg.d_model, "d_vocab": cfg.d_vocab}


def _feature_ids(text: str | None, d_sae: int, slug: str) -> torch.Tensor:
    if text is None or text == "all":
        return torch.arange(d_sae)
    ids = [i for i in parse_ranges(text, None, "--features") if i < d_sae]
    if not ids:
        raise InputError(f"--features {text!r} names no feature of {slug} (it has {d_sae}: 0..{d_sae - 1}).")
    return torch.tensor(ids)


def _fingerprint(cfg: AtlasConfig, model, dictionary: AtlasDictionary, tokens_fp: str, ops_fp: str) -> str:
    """The content fingerprint of a dictionary's shards: the weights actually used (model and dictionary, by
    :func:`~tl_query_lens.models.weights_fingerprint`), the corpus tokens of the pass and of the operators, and the
    settings. A same-named model with other weights, or a retrained SAE at the same path, gets new shards."""
    record = {
        "format": FORMAT,
        "cfg": {k: str(v) for k, v in cfg.fingerprint_fields().items()},
        "model": _model_record(model),
        "model_weights": weights_fingerprint(model),
        "dictionary_weights": weights_fingerprint(dictionary.sae),
        "spec": dictionary.spec,
        "tokens": tokens_fp,
        "operators": ops_fp,
    }
    # a bf16 corpus pass gets other shards; fp32 shards keep the fingerprint they had before bf16 existed
    if use_bf16(CORPUS_PASS_PRECISION, model.cfg.device):
        record["precision"] = "bfloat16-autocast"
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def _check_sizes(cfg: AtlasConfig, model: HookedTransformer, n_features: int, seq_len: int) -> None:
    """Before the corpus pass: ``k_tokens`` within the vocabulary (else every signature would be missing) and the
    collectors' memory (:mod:`~tl_query_lens.budget`): per feature, ``n_top`` + ``band_sample`` windows of float16
    activations plus their values, keys and sequence ids."""
    if cfg.k_tokens > model.cfg.d_vocab:
        raise InputError(
            f"--k-tokens {cfg.k_tokens} exceeds the model's vocabulary of {model.cfg.d_vocab} tokens; give "
            f"--k-tokens ≤ {model.cfg.d_vocab}."
        )
    if cfg.signatures and cfg.operator_seq_len > model.cfg.n_ctx:
        raise InputError(f"--operator-seq-len {cfg.operator_seq_len} exceeds the model context {model.cfg.n_ctx}.")
    window = 2 * seq_len + 24
    check_memory(
        {
            f"--n-top {cfg.n_top}": n_features * cfg.n_top * window,
            f"--band-sample {cfg.band_sample}": n_features * cfg.band_sample * window,
        },
        f"The atlas of {n_features} features",
    )


def _layers(text: str, n_layers: int) -> list[int]:
    return list(range(n_layers)) if text == "all" else parse_ranges(text, n_layers, "--layers")


def _assign(units: list[Unit], n_dicts: int, rank: int, world: int) -> list[Unit]:
    """This rank's units: whole dictionaries round-robin, or units round-robin when dictionaries are fewer than
    ranks."""
    if world == 1:
        return units
    if n_dicts >= world:
        order: dict[str, int] = {}
        for u in units:
            order.setdefault(u.dictionary.slug, len(order))
        return [u for u in units if order[u.dictionary.slug] % world == rank]
    return [u for i, u in enumerate(units) if i % world == rank]


def build_atlas(
    model: HookedTransformer,
    sources: list[str] | tuple[str, ...] | None = None,
    cfg: AtlasConfig | None = None,
    *,
    tokens: torch.Tensor | None = None,
    operator_tokens: torch.Tensor | None = None,
    lens=None,
    progress: bool = True,
) -> AtlasResult:
    """Build (or resume) the feature atlas of ``sources`` (default ``cfg.dictionary``) in ``cfg.out``.

    Args:
        model: the clean TransformerLens model.
        sources: dictionary specs (see :class:`AtlasConfig`'s ``dictionary``).
        cfg: sizes and contents; default :class:`AtlasConfig()`.
        tokens / operator_tokens: corpus windows of the pass / of the operators, instead of loading ``cfg.corpus``
            (a model without a tokenizer needs them).
        lens: a :class:`~tl_query_lens.QueryLens` of ``model`` to reuse (its corpus is the operator corpus; operators
            and pushed feature sets it already holds are not computed again).
        progress: show progress bars.

    Raises:
        InputError: an unknown dictionary, a hook the model lacks, an output folder holding another model's atlas,
            too little free disk space (all before the corpus pass), or a disk that fills while writing (the finished
            shards are kept; rerun to resume).
    """
    cfg = cfg or AtlasConfig()
    start_time = time.perf_counter()
    seconds: dict[str, float] = {}
    out = Path(cfg.out)
    rank, world = _rank_world()
    specs = tuple(sources) if sources else cfg.dictionary
    _check_out(out, model)
    if cfg.operator_cache is not None:
        check_folder(cfg.operator_cache, "--operator-cache")
    sources_parsed = expand_specs(specs, str(model.cfg.model_name), _layers(cfg.layers, model.cfg.n_layers))
    dictionaries = load_atlas_dictionaries(model, sources_parsed)
    attached = _attached(cfg, dictionaries)
    if tokens is None:
        tokens = load_corpus(cfg.corpus, model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, split=cfg.split, seed=cfg.seed)
    if lens is not None:
        operator_tokens = lens.tokens
    if cfg.signatures and operator_tokens is None:
        operator_tokens = load_corpus(
            cfg.corpus, model, n_seqs=cfg.operator_seqs, seq_len=cfg.operator_seq_len, split="train", seed=cfg.seed
        )
    tokens = tokens.cpu()
    tokens_fp = corpus_fingerprint(tokens)
    ops_fp = corpus_fingerprint(operator_tokens) if operator_tokens is not None else "-"
    units: list[Unit] = []
    for d in dictionaries:
        ids = _feature_ids(cfg.features, d.d_sae, d.slug)
        fp = _fingerprint(cfg, model, d, tokens_fp, ops_fp)
        for s in range(0, len(ids), cfg.shard_size):
            chunk = ids[s : s + cfg.shard_size]
            units.append(Unit(d, int(chunk[0]), chunk, fp))
    done = {(u.dictionary.slug, u.start) for u in units if _finished(out, u)}
    mine = [u for u in _assign(units, len(dictionaries), rank, world) if (u.dictionary.slug, u.start) not in done]
    _check_sizes(cfg, model, sum(len(u.ids) for u in mine), int(tokens.shape[1]))
    need = sum(len(u.ids) for u in mine) * BYTES_PER_FEATURE_ESTIMATE
    if mine and free_bytes(out) < need:
        raise InputError(
            f"--out {out}: about {need / 1e6:.0f} MB are needed for {sum(len(u.ids) for u in mine)} features and "
            f"{free_bytes(out) / 1e6:.0f} MB are free. Free some space or choose another --out; finished shards "
            f"({len(done)}) are kept and a rerun resumes."
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).touch()  # the marker of a folder tlql writes (the command line's lock file when it holds one)
    clear_temporaries(out, OWNED)
    if rank == 0:
        write_json(out / "manifest.json", {"format": FORMAT, "model": _model_record(model)})
    seconds["checks"] = time.perf_counter() - start_time
    logger.info(
        "atlas: %d dictionaries, %d units (%d finished, %d for rank %d/%d)",
        len(dictionaries),
        len(units),
        len(done),
        len(mine),
        rank,
        world,
    )
    if mine:
        _build_units(model, mine, cfg, tokens, operator_tokens, dictionaries, out, seconds, progress, lens)
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(hours=6))
        dist.barrier()
    result = AtlasResult(out=str(out), model_name=str(model.cfg.model_name), rank=rank, world=world)
    if rank == 0:
        t0 = time.perf_counter()
        _assemble(
            model,
            cfg,
            dictionaries,
            units,
            attached,
            out,
            result,
            int(tokens[:, cfg.exclude_first_positions :].numel()),
        )
        seconds["site"] = time.perf_counter() - t0
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    result.shards_built = len(units) - len(done)
    result.shards_reused = len(done)
    seconds["total"] = time.perf_counter() - start_time
    result.seconds = seconds
    if rank == 0:
        result.save(out / "result")
    return result


def _finished(out: Path, unit: Unit) -> bool:
    """Whether ``unit``'s shard can be reused: its content fingerprint (weights, tokens, settings) and feature ids
    match, and both of its files still have the SHA-256 recorded when they were written (a truncated or edited
    ``.json`` / ``.js`` is rebuilt)."""
    shard = read_shard_meta(out, unit.dictionary.slug, unit.start)
    if shard is None or shard.get("fingerprint") != unit.fingerprint or shard.get("ids") != unit.ids.tolist():
        return False
    js, raw = shard_paths(out, unit.dictionary.slug, unit.start)
    return all(
        isinstance(shard.get(key), str) and _sha256(path) == shard[key]
        for key, path in (("js_sha256", js), ("json_sha256", raw))
    )


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _attached(cfg: AtlasConfig, dictionaries: list[AtlasDictionary]) -> dict[str, list[SavableResult]]:
    """``attach`` entries loaded (any saved result, by the type its folder names)."""
    by_name = {d.label: d.slug for d in dictionaries} | {d.slug: d.slug for d in dictionaries}
    by_name |= {d.spec: d.slug for d in dictionaries}
    out: dict[str, list[SavableResult]] = {}
    for item in cfg.attach:
        name, _, folder = item.partition("=")
        if name.strip() not in by_name:
            raise InputError(
                f"--attach {item!r}: no dictionary {name.strip()!r} in this atlas; use one of {sorted(by_name)}."
            )
        out.setdefault(by_name[name.strip()], []).append(load_any_result(Path(folder.strip())))
    return out


def load_any_result(folder: Path) -> SavableResult:
    """A saved result of any class (the one its ``result.json`` names)."""
    record = read_json(folder / "result.json", fix="Pass a folder written by a result's .save().")
    classes: dict[str, type[SavableResult]] = {}
    pending = [SavableResult]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            classes.setdefault(sub.__name__, sub)
            pending.append(sub)
    if record.get("type") not in classes:
        raise MissingFileError(f"{folder} holds a {record.get('type')!r}, which no loaded module defines.")
    return classes[record["type"]].load(folder)


class _Quality:
    """L0, alive and explained variance of one whole dictionary over the pass, summed by
    :class:`~tl_query_lens.dictionaries.splice.SpliceStats` (the one definition of L0 and alive, as in ``tlql ffkv``
    and ``tlql saes report``); the atlas has no spliced logits, so no CE or KL."""

    def __init__(self, d: AtlasDictionary) -> None:
        self.d = d
        self.stats = SpliceStats(d.d_sae)
        self.exact = d.kind == "ffkv" and getattr(d.sae.cfg, "variant", "") == "vanilla"

    @torch.no_grad()
    def update(self, acts: torch.Tensor, target: torch.Tensor | None, skip: int) -> None:
        acts = acts[:, skip:]
        self.stats.update_codes(acts)
        if self.exact or target is None:
            return
        y = target[:, skip:]
        recon = self.d.sae.decode(acts)
        if recon.numel() != y.numel():  # a decoder into another space than the write hook (hook_z): no EV
            self.exact = True
            return
        self.stats.update_reconstruction(y.flatten(2).float(), recon.reshape(y.flatten(2).shape).float())

    def result(self) -> DictionaryQuality:
        values = self.stats.metrics()
        d = self.d
        return DictionaryQuality(
            d.slug,
            d.label,
            d.kind,
            d.spec,
            d.layer,
            d.d_sae,
            l0=values["mean_l0"],
            alive=values["alive_rate"],
            explained_variance=None if self.exact else values.get("explained_variance"),
            ce_recovered=None,
            n_tokens=values["n_tokens"],
        )


@torch.no_grad()
def _forward_pass(model, units, cfg, tokens, out, progress):
    """One pass over ``tokens`` for every dictionary of ``units``: their collectors and quality rows."""
    by_dict: dict[str, list[Unit]] = {}
    for u in units:
        by_dict.setdefault(u.dictionary.slug, []).append(u)
    collectors, qualities, dicts = {}, {}, {}
    for slug, group in by_dict.items():
        d = group[0].dictionary
        dicts[slug] = d
        ids = torch.cat([u.ids for u in group])
        collectors[slug] = StatsCollector(
            ids, tokens.shape[1], n_top=cfg.n_top, n_sample=cfg.band_sample, seed=cfg.seed, slug=slug
        )
        if not (out / "results" / slug / "result.json").is_file():
            qualities[slug] = _Quality(d)
    hooks = sorted({d.sae.cfg.metadata.hook_name for d in dicts.values()})
    hooks += sorted({dicts[s].write_hook for s in qualities if not qualities[s].exact} - set(hooks))
    captured: dict[str, torch.Tensor] = {}

    def grab(act, hook):
        captured[hook.name] = act.float()  # the dictionaries encode in fp32 (a bf16 pass gives bf16 MLP outputs)

    finals = [h for h in hooks if h.startswith(("ln_final", "unembed"))]
    stop = None if finals else stop_layer(hooks)
    bar = tqdm(range(0, tokens.shape[0], cfg.batch_size), desc="atlas: forward pass", disable=not progress)
    for start in bar:
        batch = tokens[start : start + cfg.batch_size].to(model.cfg.device)
        with model_passes(model, CORPUS_PASS_PRECISION):
            model.run_with_hooks(batch, fwd_hooks=[(h, grab) for h in hooks], stop_at_layer=stop)
        for slug, d in dicts.items():
            acts = encode(d, captured[d.sae.cfg.metadata.hook_name])
            collectors[slug].update(
                acts[..., collectors[slug].ids.to(acts.device)], start, d.d_sae, cfg.exclude_first_positions
            )
            if slug in qualities:
                qualities[slug].update(acts, captured.get(d.write_hook), cfg.exclude_first_positions)
        captured.clear()
    return collectors, qualities


def _build_units(model, units, cfg, tokens, operator_tokens, dictionaries, out, seconds, progress, lens=None) -> None:
    # one corpus pass serves every unit: ceil(n_seqs / batch_size) forward batches, estimated after the first one
    n_batches = math.ceil(len(tokens) / cfg.batch_size)
    t0 = time.perf_counter()
    with estimate("atlas", n_batches, "--n-tokens").on_forward(model):
        collectors, qualities = _forward_pass(model, units, cfg, tokens, out, progress)
    seconds["forward_pass"] = time.perf_counter() - t0
    for slug, quality in qualities.items():
        _guard_disk(out, quality.result().save, out / "results" / slug)
    t0 = time.perf_counter()
    links = neuron_links(model, dictionaries, cfg.n_links)
    readouts = {d.slug: readout_tokens(d, cfg.n_links) for d in dictionaries if d.kind == "readout"}
    if not cfg.signatures:
        lens = None
    elif lens is None:
        lens = QueryLens(model, operator_tokens, progress=progress, cache_dir=cfg.operator_cache or out / "operators")
    if lens is not None:
        full = [u.dictionary for u in units if _basis(u.dictionary, cfg, model) == "identity"]
        full = list({d.slug: d for d in full}.values())
        if full:
            lens.precompute([d.view for d in full], value_methods=("full", "first_order"), key_methods=("full",))
    seconds["operators"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    offsets: dict[str, int] = {}
    for unit in tqdm(units, desc="atlas: signatures and shards", disable=not progress):
        d = unit.dictionary
        collector = collectors[d.slug]
        first = offsets.get(d.slug, 0)
        stats = collector.result().rows(torch.arange(first, first + len(unit.ids)))
        offsets[d.slug] = first + len(unit.ids)
        sigs = None
        if lens is not None:
            sigs = unit_signatures(lens, model, d, unit.ids, cfg.k_tokens, _basis(d, cfg, model))
        records = unit_records(
            stats,
            sigs,
            tokens,
            getattr(model, "tokenizer", None),
            n_bands=cfg.n_bands,
            band_examples=cfg.band_examples,
            before=cfg.context_before,
            after=cfg.context_after,
            skip=cfg.exclude_first_positions,
            k_tokens=cfg.k_tokens,
            links=links.get(d.slug),
            readout=readouts.get(d.slug),
        )
        meta = {
            "fingerprint": unit.fingerprint,
            "ids": unit.ids.tolist(),
            "postings": records.postings,
            "n_positions": stats.n_positions,
        }
        _guard_disk(out, write_shard, out, d.slug, unit.start, records.strings, records.features, meta)
    seconds["signatures_and_shards"] = time.perf_counter() - t0


def _basis(d: AtlasDictionary, cfg: AtlasConfig, model) -> str:
    """The full operators when the dictionary asks for at least d_model features, else the feature basis (decided
    per dictionary, so a feature's numbers do not depend on how the work is split)."""
    n = len(_feature_ids(cfg.features, d.d_sae, d.slug))
    return "identity" if n >= model.cfg.d_model else "features"


def _guard_disk(out: Path, write, *args) -> None:
    """``write(*args)``; a full disk becomes an InputError that says the finished shards are kept."""
    try:
        write(*args)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        clear_temporaries(out, OWNED)
        raise InputError(
            f"The disk holding {out} is full. The finished shards are kept; free some space and rerun the same "
            "command to resume."
        ) from err


def _assemble(model, cfg, dictionaries, units, attached, out: Path, result: AtlasResult, n_tokens: int) -> None:
    """Rank 0: index, search index, dictionary pages, static files and exports, from the shards on disk."""
    postings: dict[str, list[tuple[str, int, float]]] = {}
    entries = []
    total = 0
    shard_bytes, shard_gzip = 0, 0
    for d in tqdm(dictionaries, desc="atlas: index", disable=True):
        starts = [u.start for u in units if u.dictionary.slug == d.slug]
        n = 0
        ranges, built = [], []
        for s in starts:
            shard = read_shard_meta(out, d.slug, s)
            if shard is None:
                raise RuntimeError(f"shard {d.slug}/{s} is missing after the build")
            shard_bytes += shard["js_bytes"]
            shard_gzip += shard["js_gzip_bytes"]
            n += len(shard["ids"])
            ranges.append([s, shard["ids"][0], shard["ids"][-1], len(shard["ids"])])
            built.extend(shard["ids"])
            for key, refs in shard["postings"].items():
                postings.setdefault(key, []).extend((d.slug, f, w) for f, w in refs)
        total += n
        sections = []
        quality_dir = out / "results" / d.slug
        presented = [DictionaryQuality.load(quality_dir)] if (quality_dir / "result.json").is_file() else []
        for item in presented + attached.get(d.slug, []):
            sections.append(_section(item))
        entries.append(
            {
                "slug": d.slug,
                "label": d.label,
                "kind": d.kind,
                "spec": d.spec,
                "layer": d.layer,
                "d_sae": d.d_sae,
                "n_features": n,
                "shards": ranges,
                "built": feature_runs(built),
                "read_hook": d.read_hook,
                "write_hook": d.write_hook,
                "sections": sections,
            }
        )
        result.dictionaries.append(
            {"slug": d.slug, "label": d.label, "kind": d.kind, "layer": d.layer, "n_features": n}
        )
    index = {
        "format": FORMAT,
        "model": _model_record(model),
        "n_tokens": n_tokens,
        "config": {k: str(v) for k, v in cfg.fingerprint_fields().items()},
        "dictionaries": entries,
        "shares_k": SHARES_TOP_K,
        "shares_shown": SHARES_SHOWN,
        "methods": {
            "LL_VALUE": "logit lens: W_U·LN_f(v)",
            "QL_VALUE": "Query Lens, full: W_U·LN_f(M_l v) + b_U",
            "QL_INDIRECT": "Query Lens, indirect only: W_U·LN_f(M_l v − v)",
            "LL_KEY": "logit lens key: E·k",
            "QL_KEY": "Query Lens key: centred embeddings · N_lᵀ k",
        },
    }
    top = [js_call("index", index), js_call("search", search_index(postings))]
    atomic_write_text(out / "data" / "index.js", top[0])
    atomic_write_text(out / "data" / "search.js", top[1])
    write_static(out)
    if cfg.exports:
        export_all(
            out,
            model,
            entries,
            {u.dictionary.slug: u.fingerprint for u in units},
            creator=cfg.neuronpedia_creator,
            visibility=cfg.neuronpedia_visibility,
        )
    result.n_features = total
    result.n_tokens = n_tokens
    encoded = [t.encode("utf-8") for t in top]
    result.bytes_total = shard_bytes + sum(len(b) for b in encoded)
    result.bytes_gzip = shard_gzip + sum(len(gzip.compress(b, 6)) for b in encoded)


def _finite(value: Any) -> Any:
    """NaN and ±inf as None (the data files are strict JSON)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _section(item) -> dict[str, Any]:
    """A result as the page shows it: only through the presentation interface (scalars and tables)."""
    tables = {}
    for name, table in item.tables().items():
        columns, rows = table.lists()
        tables[name] = {"columns": columns, "rows": [[_finite(v) for v in row] for row in rows]}
    scalars = {k: _finite(v) for k, v in item.scalars().items()}
    return {"title": item.title or type(item).__name__, "scalars": scalars, "tables": tables}
