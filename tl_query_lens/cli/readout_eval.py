"""``tlql readout eval``: diagnostics of a readout SAE and row-geometry baselines on held-out states, under this
project's mixed-layers protocol or the paper's."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.readout_decompose import DecomposeOptions, load_readout
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN = {"out": "results/readout/eval", "n_seqs": 32, "seq_len": 17}
RUN_SKIP = ("layers", "features", "dictionary")


@dataclass
class EvalOptions:
    """The protocol of ``tlql readout eval`` and its baselines.

    Attributes:
        protocol: 'mixed-layers' (this project's: logit-lens states of 4 layers, 3 contrast families, baselines) or
            'paper' (the authors': final-layer states, top-1 vs top-2 / vocabulary mean, ρ₀, through-origin ablation
            R² over top-10 of covered contrasts, their baselines: neighbours without the contrast tokens, k-means by
            |cos|).
        baselines: comma list (default: the protocol's own set, cheapest first; '' for none). 'paper' also takes
            this project's variants by name (nearest_row_ridge, knn_basis, kmeans_ridge_small, kmeans_ridge_full).
    """

    protocol: Literal["mixed-layers", "paper"] = "mixed-layers"
    baselines: str | None = None


def add_parser(subparsers) -> None:
    command(subparsers, "eval", help="diagnostics and row-geometry baselines on held-out states", configure=configure)


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.readout.config import PaperReadoutConfig, ReadoutEvalConfig

    taken = add_options(parser, RunConfig, skip=RUN_SKIP, defaults=RUN)
    taken = add_options(parser, DecomposeOptions, taken=taken, skip=("hook", "position", "top"))
    taken = add_options(parser, ReadoutEvalConfig, taken=add_options(parser, EvalOptions, taken=taken))
    add_options(
        parser, PaperReadoutConfig, taken=taken
    )  # the fields it shares with ReadoutEvalConfig keep its defaults
    parser.set_defaults(func=run_eval)


def _baselines(options: EvalOptions) -> dict[str, Any]:
    from tl_query_lens.errors import InputError
    from tl_query_lens.readout.config import BASELINE_ORDER, OWN_VARIANTS, PAPER_BASELINES

    chosen = tuple(b for b in (options.baselines or "").split(",") if b)
    known = PAPER_BASELINES + OWN_VARIANTS if options.protocol == "paper" else BASELINE_ORDER
    if [b for b in chosen if b not in known]:
        unknown, protocol = [b for b in chosen if b not in known], options.protocol
        raise InputError(
            f"--baselines {unknown} unknown for --protocol {protocol}; choose from {list(known)} ('' for none)."
        )
    return {} if options.baselines is None else {"baselines": chosen}


def run_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, load_tokens, tracker
    from tl_query_lens.readout import collect_states
    from tl_query_lens.readout.config import PaperReadoutConfig, ReadoutEvalConfig
    from tl_query_lens.readout.diagnostics_paper import readout_diagnostics_paper
    from tl_query_lens.readout.evaluate import evaluate_readout
    from tl_query_lens.readout.registry import describe_fit_source, fit_source, release_name

    run_cfg, options, sae = build(RunConfig, args), build(EvalOptions, args), build(DecomposeOptions, args)
    own = {f.name for f in fields(ReadoutEvalConfig)}
    if options.protocol == "paper":
        cfg = build(PaperReadoutConfig, args, exclude=own | {"baselines"}, **_baselines(options))
    else:
        cfg = build(ReadoutEvalConfig, args, exclude=("baselines",), **_baselines(options))
    check_run(run_cfg)
    loader = load_readout(run_cfg.model, sae.sae_id, sae.sae_path)
    source = fit_source(run_cfg.model, sae.sae_id, sae.sae_path)  # which fit is read, and how it was made
    print(describe_fit_source(source, sae.sae_path or f"{release_name(run_cfg.model)}:{sae.sae_id}"))
    model = load_model(run_cfg)
    readout, tokens = loader(), load_tokens(run_cfg, model, "evaluation")
    if options.protocol == "paper":
        states = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
        result = readout_diagnostics_paper(model, readout, states, cfg=cfg)
        result.save(Path(run_cfg.out) / "protocol_paper")
        scalars = {k: v for k, v in vars(result).items() if isinstance(v, (int, float))}
        with tracker(run_cfg, "readout-eval-paper", args, readout=cfg, dictionary=source) as track:
            track.log_scalars("readout_paper_protocol", scalars)
            track.log_scalars("readout_paper_protocol_baselines", result.coverage_baselines)
        keys = "coverage_ci best_baseline coverage_baselines coverage_baselines_ci coverage_baselines_by_family"
        extra = {k: getattr(result, k) for k in keys.split()} | {"by_family": result.coverage_by_family}
        print(json.dumps(scalars | extra))
        return 0
    report = evaluate_readout(model, readout, collect_states(model, tokens), cfg=cfg)
    report.save(run_cfg.out)
    with tracker(run_cfg, "readout-eval", args, readout=cfg, dictionary=source) as track:
        for res in [report.srp, *report.baselines.values()]:
            scalars = {k: v for k, v in asdict(res).items() if isinstance(v, float)}
            track.log_scalars("srp" if res.method == "srp" else f"baseline_{res.method}", scalars)
        if report.ablation is not None:
            track.log_scalars("ablation", asdict(report.ablation))
        track.log_table("readout_vs_baselines", *report.table())
    cols, rows = report.table()
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    if report.ablation is not None:
        print("ablation: " + json.dumps(asdict(report.ablation)))
    return 0
