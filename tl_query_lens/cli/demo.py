"""``tlql demo``: the main job — every capability on the embedded model, with an HTML report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options, preset_defaults
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig


@dataclass
class DemoOptions:
    """How big the demo runs.

    Attributes:
        quick: small settings for a first look (a few minutes); options given on the command line still apply.
    """

    quick: bool = False


def add_parser(subparsers) -> None:
    command(
        subparsers, "demo", help="run every capability on the embedded model; HTML report + W&B", configure=configure
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.demo_config import DemoConfig

    run = ("model", "corpus", "seed", "out", "wandb")
    taken = add_options(
        parser,
        RunConfig,
        skip=[f.name for f in fields(RunConfig) if f.name not in run],
        defaults={"out": "results/demo"},
    )
    given = {f.name: None for f in fields(DemoConfig)}  # not given: the full or quick demo's value
    add_options(
        parser,
        DemoConfig,
        taken=add_options(parser, DemoOptions, taken=taken),
        defaults=given,
        skip=("use_wandb", "readout_overrides"),
        shown={
            **preset_defaults({"": DemoConfig(), "--quick": DemoConfig.quick()}),
            "operator_cache": "<user cache>/operators",
        },
    )
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from tl_query_lens.checks import check_corpus, check_model_name
    from tl_query_lens.demo import run_demo
    from tl_query_lens.demo_config import DemoConfig
    from tl_query_lens.limits import check_limits
    from tl_query_lens.paths import check_folder

    options = build(DemoOptions, args)
    cfg = build(
        DemoConfig,
        args,
        use_wandb=args.wandb,
        factory=lambda **kw: (DemoConfig.quick if options.quick else DemoConfig)(
            **{k: v for k, v in kw.items() if v is not None}
        ),
    )
    dims = check_model_name(cfg.model)
    check_corpus(cfg.corpus)
    if cfg.operator_cache is not None:
        check_folder(cfg.operator_cache, "--operator-cache")
    layers = {"--ffkv-layers": (cfg.ffkv_layers, "<n_layers"), "--ql-layer": (cfg.ql_layer, "<n_layers")}
    sizes = {"--cert-layer": (cfg.cert_layer, "<n_layers"), "--k": (cfg.k, "d_mlp")}
    check_limits(
        dims,
        {**layers, **sizes, "--n-features": (cfg.n_features, "d_mlp"), "--seq-len": (cfg.seq_len, "n_ctx")},
        cfg.model,
    )
    outputs = run_demo(cfg)
    print(f"results folder : {outputs.out}")
    print(f"HTML report    : {outputs.report}")
    print(f"feature atlas  : {outputs.atlas}  (open it in a browser; it works from file://)")
    print(f"feature export : {outputs.neuronpedia}  (Neuronpedia bulk-import layout, JSONL.gz batches)")
    if outputs.wandb_dir:
        print(f"W&B run        : {outputs.wandb_dir}  (offline unless WANDB_MODE says otherwise; `wandb sync` it)")
    print("seconds        : " + ", ".join(f"{k} {v:.0f}" for k, v in outputs.seconds.items()))
    return 0
