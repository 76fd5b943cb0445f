"""The ``tlql saes`` commands: ``train`` (the suite into the user cache), ``compare`` (the FF-KV paper's table) and
``report`` (the suite's quality), each a check before the model loads and a ``run`` that returns one result
(:mod:`tl_query_lens.command`); their configs are in :mod:`tl_query_lens.saes.config`."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sae_lens import HookedSAETransformer

from tl_query_lens import corpus, sources
from tl_query_lens.budget import check_memory
from tl_query_lens.dictionaries.compare import DictionaryComparison, compare_dictionaries
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.errors import InputError
from tl_query_lens.hooks import hook_layer
from tl_query_lens.limits import ModelDims, check_limits, dims_of
from tl_query_lens.ranges import parse_layers
from tl_query_lens.results import atomic_write_text, read_json
from tl_query_lens.saes.config import SAECompareCommandConfig, SAEReportCommandConfig, SAETrainCommandConfig
from tl_query_lens.saes.registry import SAES_RELEASES
from tl_query_lens.saes.report import SuiteQuality, add_training_window_alive, suite_quality
from tl_query_lens.saes.saebench_eval import saebench_quality
from tl_query_lens.saes.saelens_eval import saelens_quality
from tl_query_lens.saes.train import SAESuiteResult, train_saes

logger = logging.getLogger(__name__)


def check_saes_train(cfg: SAETrainCommandConfig, dims: ModelDims | None) -> None:
    """``tlql saes train`` before the model loads: the layers, and the dictionaries' memory against the budget."""
    suite = cfg.suite
    parse_layers(",".join(map(str, suite.layers)), dims.n_layers if dims else None)
    if dims is not None and dims.d_model:
        n_dicts = len(suite.layers) * len(suite.kinds)
        check_memory(
            {
                f"--d-sae {suite.d_sae}": n_dicts * 4 * 4 * 2 * dims.d_model * suite.d_sae,
                f"--batch-size {suite.batch_size_tokens}": n_dicts * 4 * 3 * suite.batch_size_tokens * suite.d_sae,
            },
            "saes train",
        )


def run_saes_train(model: HookedSAETransformer, cfg: SAETrainCommandConfig) -> SAESuiteResult:
    """``tlql saes train``: train (or resume, unless ``restart``) the suite into the user cache."""
    parse_layers(",".join(map(str, cfg.suite.layers)), model.cfg.n_layers)
    return train_saes(model, cfg.suite, resume=not cfg.restart)


def _in_release(cfg: SAECompareCommandConfig) -> tuple[list[str], list[str]]:
    """The ``<release>:<id>`` specs of ``cfg.release``, and why it adds none (a release that is not registered)."""
    listed = [f"{cfg.release}:{i}" for i in sources.release_ids(cfg.release)] if cfg.release else []
    missing = [f"release {cfg.release!r} is not registered (train it with `tlql saes train`)"]
    return listed, missing * (bool(cfg.release) and not listed)


def _compare_limits(cfg: SAECompareCommandConfig) -> dict[str, tuple[Any, str]]:
    return {"--k": (cfg.k, "d_mlp"), "--control-k": (cfg.compare.control_k, "d_mlp")}


def check_saes_compare(cfg: SAECompareCommandConfig, dims: ModelDims | None) -> None:
    """``tlql saes compare`` before the model loads: layers, dictionary specs and sizes against the model."""
    parse_layers(cfg.run.layers, dims.n_layers if dims else None)
    for spec in cfg.dictionaries:
        sources.parse_source(spec, "--dictionaries")  # a bad spec is refused here
    check_limits(dims, _compare_limits(cfg), cfg.run.model)


def run_saes_compare(model: HookedSAETransformer, cfg: SAECompareCommandConfig) -> DictionaryComparison:
    """``tlql saes compare``: per layer of ``cfg.run.layers`` the FF-KV variants, the release's SAEs / transcoders
    and ``cfg.dictionaries`` at that layer, and the random-model control, on the corpus' evaluation split; a
    dictionary that cannot be loaded is left out of the table with a warning (listed in the result's config)."""
    run = cfg.run
    layers = parse_layers(run.layers, model.cfg.n_layers)
    check_limits(dims_of(model), _compare_limits(cfg), run.model)
    in_release, missing = _in_release(cfg)
    specs: list[str | sources.DictionarySource] = [*in_release]
    specs += [sources.parse_source(s, "--dictionaries") for s in cfg.dictionaries]
    tokens = corpus.load_corpus(
        run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="evaluation", seed=run.seed
    )
    trained = {}
    for spec in specs:
        try:
            sae = sources.load_dictionary(spec, model)
        except InputError as err:  # a dictionary that cannot be loaded is left out of the table, with a warning
            missing.append(str(err))
            continue
        name = "transcoder" if sae.cfg.metadata.hook_name_out else "SAE"
        label = spec.name if not isinstance(spec, str) else spec.split(":", 1)[1]
        if hook_layer(sae.cfg.metadata.hook_name) in layers:
            trained[f"{name} L{hook_layer(sae.cfg.metadata.hook_name)} {label}"] = sae
    for line in missing:
        logger.warning("Not in the table: %s", line)
    dictionaries = {}
    for layer in layers:
        ks = [getattr(s.cfg, "k", 0) for label, s in trained.items() if label.startswith(f"SAE L{layer} ")]
        k = cfg.k or next((int(k) for k in ks if k), 32)  # the layer's TopK SAE's k, else 32
        dictionaries[f"FF-KV vanilla L{layer}"] = FFKV.from_model(model, layer, "vanilla")
        dictionaries[f"FF-KV TopK-{k} L{layer}"] = FFKV.from_model(model, layer, "topk", k)
        dictionaries[f"FF-KV normalized L{layer}"] = FFKV.from_model(model, layer, "normalized")
        dictionaries.update({label: s for label, s in trained.items() if f" L{layer} " in label + " "})
    compare = cfg.compare if cfg.absorption else replace(cfg.compare, absorption=None)
    result = compare_dictionaries(model, dictionaries, tokens, cfg=compare)
    result.config["not_loaded"] = missing
    return result


def check_saes_report(cfg: SAEReportCommandConfig, dims: ModelDims | None) -> None:
    """``tlql saes report`` before the model loads: the ids asked for are in the model's release."""
    SAES_RELEASES.register()
    sources.release_sources(SAES_RELEASES.release_name(cfg.run.model), cfg.id_list())


def run_saes_report(model: HookedSAETransformer, cfg: SAEReportCommandConfig) -> SuiteQuality:
    """``tlql saes report``: the quality of each dictionary asked for on the evaluation split (and SAELens' /
    SAEBench's protocols beside it where ``cfg.protocol`` names them); writes ``quality.md`` under ``--out``."""
    run, report = cfg.run, cfg.report
    release = SAES_RELEASES.release_name(run.model)
    SAES_RELEASES.register()
    saes = {
        s.name: sources.load_dictionary(s, device=run.device) for s in sources.release_sources(release, cfg.id_list())
    }
    tokens = corpus.load_corpus(
        report.corpus, model, n_seqs=report.n_seqs, seq_len=report.seq_len, split="evaluation", seed=report.seed
    )
    suite_file = SAES_RELEASES.root() / release / "suite.json"
    suite = read_json(suite_file) if suite_file.exists() else {}
    first = report.exclude_first_positions
    quality = suite_quality(model, saes, tokens, batch_size=report.batch_size, exclude_first_positions=first)
    quality.config = {**asdict(cfg), "suite": suite}
    add_training_window_alive(quality, SAES_RELEASES.root() / release)
    if "saelens" in cfg.protocols():
        quality.saelens = saelens_quality(model, saes, tokens, batch_size=report.batch_size)
    if "saebench" in cfg.protocols():
        quality.saebench = saebench_quality(model, saes, tokens, batch_size=report.batch_size)
    atomic_write_text(Path(run.out) / "quality.md", quality.markdown() + "\n")
    return quality
