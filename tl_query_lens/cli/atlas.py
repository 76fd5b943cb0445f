"""``tlql atlas``: every feature of the chosen dictionaries as a static site that opens offline (docs/atlas.md)."""

from __future__ import annotations

import argparse
import dataclasses

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN_SKIP = ("n_seqs", "seq_len", "layers", "features", "dictionary", "out", "corpus", "seed")


def add_parser(subparsers) -> None:
    command(
        subparsers,
        "atlas",
        help="build the feature atlas: a static, searchable site of every feature (resumable; torchrun splits it)",
        configure=configure,
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.atlas import AtlasConfig

    taken = add_options(parser, RunConfig, skip=RUN_SKIP)
    add_options(parser, AtlasConfig, taken=taken)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tl_query_lens.atlas import AtlasConfig, build_atlas
    from tl_query_lens.cli.checks import check_limits, check_run
    from tl_query_lens.cli.common import load_model, tracker

    run_cfg = build(RunConfig, args, exclude=RUN_SKIP, out=str(args.out), corpus=args.corpus, seed=args.seed)
    defaults = {f.name: f.default for f in dataclasses.fields(AtlasConfig) if f.default is not dataclasses.MISSING}
    given = {
        f.name
        for f in dataclasses.fields(AtlasConfig)
        if hasattr(args, f.name) and getattr(args, f.name) != defaults.get(f.name) and f.name != "quick"
    }
    factory = (
        (lambda **kw: AtlasConfig.preset_quick(**{k: v for k, v in kw.items() if k in given})) if args.quick else None
    )
    cfg = build(AtlasConfig, args, factory=factory)
    dims = check_run(run_cfg, seq_len=cfg.seq_len, operator_seq_len=cfg.operator_seq_len)
    check_limits(dims, {"--k-tokens": (cfg.k_tokens, "d_vocab")}, run_cfg.model)
    model = load_model(run_cfg)
    result = build_atlas(model, cfg.dictionary, cfg)
    if result.rank == 0:
        with tracker(run_cfg, "atlas", args, out=cfg.out / "result", atlas=cfg) as track:
            track.log_result(result, "atlas")
        scalars = result.scalars()
        print(
            f"Atlas of {result.n_features} features ({len(result.dictionaries)} dictionaries) in {cfg.out}: "
            f"open {result.index_html}  ({scalars['seconds']:.0f} s, {scalars['bytes/feature (gzip)']:.0f} "
            f"bytes/feature gzip, {result.shards_built} shards built, {result.shards_reused} reused)"
        )
    return 0
