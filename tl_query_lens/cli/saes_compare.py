"""``tlql saes compare``: the FF-KV paper's comparison — FF-KV (vanilla / TopK / normalized) vs SAEs vs transcoders vs
a random model, one table."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import ClassVar

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig, check_ranges

logger = logging.getLogger(__name__)
RUN = {"out": "results/saes_compare", "layers": "6,12,18,24", "n_seqs": 32, "seq_len": 64}


@dataclass
class CompareOptions:
    """The dictionaries of ``tlql saes compare`` besides FF-KV.

    Attributes:
        release: SAELens release whose SAEs / transcoders at --layers join the table ('' for none).
        dictionaries: more dictionaries: folders saved with save_model, '<release>:<sae_id>' or
            '<hf-org>/<repo>:<sae_id>'.
        k: TopK FF-KV size (default: the k of the layer's TopK SAE when loaded, else 32).
        absorption: score first-letter absorption.
    """

    release: str = "tlql-saes-smollm2-135m"
    dictionaries: tuple[str, ...] = ()
    k: int | None = None
    absorption: bool = True

    RANGES: ClassVar[dict[str, str]] = {"k": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)


def add_parser(subparsers) -> None:
    command(
        subparsers,
        "compare",
        configure=configure,
        help="FF-KV (vanilla / TopK / normalized) vs SAE vs transcoder vs a random model, one table",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.dictionaries.config import AbsorptionConfig, CompareConfig

    taken = add_options(parser, RunConfig, skip=("features", "dictionary"), defaults=RUN)
    taken = add_options(
        parser,
        CompareConfig,
        taken=add_options(parser, CompareOptions, taken=taken),
        skip=("absorption", "faithfulness"),
    )
    add_options(parser, AbsorptionConfig, taken=taken, aliases={"n_icl_examples": "--icl"})
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, load_tokens, print_rows, tracker
    from tl_query_lens.dictionaries.compare import DictionaryComparison, compare_dictionaries
    from tl_query_lens.dictionaries.config import AbsorptionConfig, CompareConfig
    from tl_query_lens.dictionaries.ffkv import FFKV
    from tl_query_lens.errors import InputError
    from tl_query_lens.hooks import hook_layer
    from tl_query_lens.limits import check_limits, dims_of
    from tl_query_lens.ranges import parse_layers
    from tl_query_lens.sources import load_dictionary, parse_source, release_ids

    run_cfg, options = build(RunConfig, args), build(CompareOptions, args)
    absorption = build(AbsorptionConfig, args, exclude=("batch_size",)) if options.absorption else None
    cfg = build(CompareConfig, args, absorption=absorption)
    dims = check_run(run_cfg)
    parse_layers(run_cfg.layers, dims.n_layers if dims else None)
    in_release = [f"{options.release}:{i}" for i in release_ids(options.release)] if options.release else []
    missing = [f"release {options.release!r} is not registered (train it with `tlql saes train`)"] * (
        bool(options.release) and not in_release
    )
    sources = [parse_source(spec, "--dictionaries") for spec in options.dictionaries]  # bad specs refused here
    limits = {"--k": (options.k, "d_mlp"), "--control-k": (cfg.control_k, "d_mlp")}
    check_limits(dims, limits, run_cfg.model)
    model = load_model(run_cfg)
    layers = parse_layers(run_cfg.layers, model.cfg.n_layers)
    check_limits(dims_of(model), limits, run_cfg.model)
    tokens = load_tokens(run_cfg, model, "evaluation")
    trained = {}
    for spec in in_release + sources:
        try:
            sae = load_dictionary(spec, model)
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
        k = options.k or next((int(k) for k in ks if k), 32)  # the layer's TopK SAE's k, else 32
        dictionaries[f"FF-KV vanilla L{layer}"] = FFKV.from_model(model, layer, "vanilla")
        dictionaries[f"FF-KV TopK-{k} L{layer}"] = FFKV.from_model(model, layer, "topk", k)
        dictionaries[f"FF-KV normalized L{layer}"] = FFKV.from_model(model, layer, "normalized")
        dictionaries.update({label: s for label, s in trained.items() if f" L{layer} " in label + " "})
    result = compare_dictionaries(model, dictionaries, tokens, cfg=cfg)
    out = Path(run_cfg.out)
    result.save(out)
    with tracker(run_cfg, "saes-compare", args, compare=cfg, not_loaded=missing) as track:
        table = track.log_table("comparison", list(DictionaryComparison.COLUMNS), result.table())
        faith = track.log_table(
            "faithfulness", list(DictionaryComparison.FAITHFULNESS_COLUMNS), result.faithfulness_table()
        )
        track.log_scalars("times", result.times)
    print(f"comparison: {table}\nfaithfulness: {faith}")
    print_rows(DictionaryComparison.COLUMNS, result.table())
    return 0
