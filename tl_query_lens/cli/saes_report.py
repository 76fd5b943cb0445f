"""``tlql saes report``: quality of each trained dictionary of the suite on the evaluation split."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN = ("model", "device", "out", "wandb", "wandb_project")


@dataclass
class ReportOptions:
    """Which dictionaries ``tlql saes report`` measures.

    Attributes:
        ids: comma-separated dictionary ids of the model's release (tlql-saes-<model>), or 'all'.
        protocol: 'project' (this package's splice, first position clean), and comma-separated, beside it:
            'saelens' (SAELens' own run_evals of the residual SAEs on the same windows: every position spliced,
            special tokens left out by id), 'saebench' (SAEBench's core run_evals through the SAELens-6 adapter of
            tl_query_lens.saes.saebench_eval: every position spliced, special tokens out of the statistics).
    """

    ids: str = "all"
    protocol: str = "project"

    def __post_init__(self) -> None:
        names = self.protocols()
        if not names or not names <= {"project", "saelens", "saebench"}:
            raise ValueError(
                f"protocol must be project, saelens, saebench or a comma list of them, got {self.protocol!r}."
            )

    def protocols(self) -> set[str]:
        """The protocol names asked for."""
        return {p.strip() for p in self.protocol.split(",") if p.strip()}


def add_parser(subparsers) -> None:
    command(
        subparsers, "report", help="quality of each trained dictionary on the evaluation split", configure=configure
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.saes.config import SAEReportConfig

    skip = [f.name for f in fields(RunConfig) if f.name not in RUN]
    taken = add_options(parser, RunConfig, skip=skip, defaults={"device": "cpu", "out": "results/saes_report"})
    add_options(parser, ReportOptions, taken=add_options(parser, SAEReportConfig, taken=taken))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, load_tokens, tracker
    from tl_query_lens.results import atomic_write_text, read_json
    from tl_query_lens.saes.config import SAEReportConfig
    from tl_query_lens.saes.registry import SAES_RELEASES
    from tl_query_lens.saes.report import add_training_window_alive, suite_quality
    from tl_query_lens.sources import load_dictionary, release_sources

    cfg, options = build(SAEReportConfig, args), build(ReportOptions, args)
    run_cfg = build(RunConfig, args, corpus=cfg.corpus, seed=cfg.seed, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len)
    check_run(run_cfg)
    release = SAES_RELEASES.release_name(run_cfg.model)
    SAES_RELEASES.register()
    ids = None if options.ids == "all" else [i.strip() for i in options.ids.split(",") if i.strip()]
    saes = {s.name: load_dictionary(s, device=run_cfg.device) for s in release_sources(release, ids)}
    model = load_model(run_cfg)
    tokens = load_tokens(run_cfg, model, "evaluation")
    suite_file = SAES_RELEASES.root() / release / "suite.json"
    suite = read_json(suite_file) if suite_file.exists() else {}
    out = Path(run_cfg.out)
    with tracker(run_cfg, "saes-report", args, report=cfg, suite=suite) as track:
        first = cfg.exclude_first_positions
        quality = suite_quality(model, saes, tokens, batch_size=cfg.batch_size, exclude_first_positions=first)
        quality.config = dict(track.config)
        add_training_window_alive(quality, SAES_RELEASES.root() / release)
        if "saelens" in options.protocols():
            from tl_query_lens.saes.saelens_eval import saelens_quality

            quality.saelens = saelens_quality(model, saes, tokens, batch_size=cfg.batch_size)
        if "saebench" in options.protocols():
            from tl_query_lens.saes.saebench_eval import saebench_quality

            quality.saebench = saebench_quality(model, saes, tokens, batch_size=cfg.batch_size)
        quality.save(out)
        atomic_write_text(out / "quality.md", quality.markdown() + "\n")
        track.log_result(quality, "saes_quality")  # its scalars and table, to files and W&B
    print(quality.markdown())
    print(
        f"{quality.n_tokens} evaluation tokens, {quality.seconds:.0f} s; dictionaries trained on "
        f"{suite.get('training_tokens_seen', '?')} tokens each ({suite.get('status', '?')}); written to {out}"
    )
    return 0
