"""``tlql demo``: the main job — every capability on the embedded model, with an HTML report."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run every capability on the embedded model; HTML report + W&B")
    parser.add_argument("--quick", action="store_true", help="small settings for a first look (a few minutes)")
    parser.add_argument("--out", default="results/demo", help="results folder")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="embedded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-wandb", dest="wandb", action="store_false", help="keep results on disk only")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.demo import DemoConfig, run_demo

    common = {
        "out": Path(args.out),
        "model": args.model,
        "corpus": args.corpus,
        "seed": args.seed,
        "use_wandb": args.wandb,
    }
    cfg = DemoConfig.quick(**common) if args.quick else DemoConfig(**common)
    outputs = run_demo(cfg)
    print(f"results folder : {outputs.out}")
    print(f"HTML report    : {outputs.report}")
    print(f"feature export : {outputs.neuronpedia}  (Neuronpedia-style JSON)")
    if outputs.wandb_dir:
        print(f"W&B run        : {outputs.wandb_dir}  (offline unless WANDB_MODE says otherwise; `wandb sync` it)")
    print("seconds        : " + ", ".join(f"{k} {v:.0f}" for k, v in outputs.seconds.items()))
    return 0
