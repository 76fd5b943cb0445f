"""``tlql readout fit | decompose | eval``: readout SAEs (Sparse Readout Prism) from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from typing import Literal

from tl_query_lens.cli import readout_decompose, readout_eval
from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options, preset_defaults
from tl_query_lens.cli.subcommand import command, configure
from tl_query_lens.config import RunConfig
from tl_query_lens.paths import plain_name

RUN_SKIP = ("n_seqs", "seq_len", "layers", "features", "dictionary")


@dataclass
class FitOptions:
    """Which fit ``tlql readout fit`` runs and where the SAE goes.

    Attributes:
        preset: 'small' (sized for a 2-core CPU; the shipped fit) or 'paper' (32×d, k=256, 20k steps: a GPU job); the options below
            that are not given keep the preset's values.
        sae_id: name in the release.
        save: folder to save the SAE to (the user cache is where SAE.from_pretrained finds it).
    """

    preset: Literal["small", "paper"] = "small"
    sae_id: str | None = None
    save: str | None = None

    def __post_init__(self) -> None:
        if self.sae_id is not None:
            plain_name(self.sae_id, "sae_id")  # a folder of the user cache: nothing outside it


def add_parser(subparsers) -> None:
    command(
        subparsers,
        "readout",
        help="readout SAEs: fit, decompose a score, evaluate against baselines",
        configure=_configure_actions,
    )


def _configure_actions(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    command(actions, "fit", help="fit a readout SAE to the model's LM head and cache it", configure=configure_fit)
    readout_decompose.add_parser(actions)
    readout_eval.add_parser(actions)
    for action in actions.choices.values():
        configure(action)


def configure_fit(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.readout.config import ReadoutFitConfig

    run = add_options(parser, RunConfig, skip=RUN_SKIP, defaults={"out": "results/readout/fit"})
    taken = add_options(parser, FitOptions, taken=run, shown={"sae_id": "the preset's name", "save": "the user cache"})
    preset = {f.name: None for f in fields(ReadoutFitConfig)}  # not given: the preset's value
    shown = preset_defaults({"": ReadoutFitConfig.preset("small"), "--preset paper": ReadoutFitConfig.preset("paper")})
    add_options(
        parser, ReadoutFitConfig, taken=taken, defaults=preset, shown={**shown, "width": "width_mult x d_model"}
    )
    parser.set_defaults(func=run_fit)


def run_fit(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    from tl_query_lens.budget import check_memory
    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, tracker
    from tl_query_lens.paths import folder_lock
    from tl_query_lens.readout.config import ReadoutFitConfig
    from tl_query_lens.readout.fit import fit_readout
    from tl_query_lens.readout.registry import cached_sae_path

    run_cfg, options = build(RunConfig, args, exclude=RUN_SKIP), build(FitOptions, args)
    given = {f.name for f in fields(ReadoutFitConfig) if getattr(args, f.name, None) is not None}
    cfg = build(
        ReadoutFitConfig,
        args,
        factory=lambda **kw: ReadoutFitConfig.preset(options.preset, **{k: v for k, v in kw.items() if k in given}),
    )
    dims = check_run(run_cfg, folders={"--save": options.save}, seq_len=cfg.seq_len)
    if dims is not None and dims.d_model:  # the embedded model's width is known before it loads
        width = cfg.width or cfg.width_mult * dims.d_model
        check_memory(
            {
                f"--width {width}": 4 * 4 * 2 * dims.d_model * width,
                f"--batch-rows {cfg.batch_rows}": 4 * 3 * cfg.batch_rows * width,
            },
            "readout fit",
        )
    base = options.sae_id or options.preset
    # the user cache's entry is locked before any work: a second `readout fit` of the same id is refused, naming the
    # first (a --save folder is the user's own: written once at the end, not shared)
    entry = cached_sae_path(run_cfg.model, base)
    lock = (
        contextlib.nullcontext()
        if options.save
        else folder_lock(entry.parent, "the readout cache", name=f".{entry.name[:100]}.tlql.lock")
    )
    with lock:
        model = load_model(run_cfg)
        fit = fit_readout(model, cfg=cfg)
        fit.save(run_cfg.out)
        with tracker(run_cfg, "readout-fit", args, fit=cfg) as track:
            for record in fit.history:
                track.log_scalars("train", record, step=int(record["step"]))
            track.log_scalars("final", fit.final)
            if fit.history:
                track.log_table("train_history", list(fit.history[0]), [list(r.values()) for r in fit.history])
        target = Path(options.save) if options.save else cached_sae_path(run_cfg.model, fit.cache_id(base))
        fit.sae.save_model(target)
    print(f"Readout SAE saved to {target} ({fit.seconds:.0f} s): " + json.dumps(fit.final))
    return 0
