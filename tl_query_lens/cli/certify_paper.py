"""``tlql certify --protocol paper``: the paper protocol's table (headline = the Occam bound), saved and logged."""

from __future__ import annotations

import argparse

from tl_query_lens.config import RunConfig

PAPER_COLUMNS = [
    "N",
    "P",
    "m",
    "R_hat",
    "eps_hat",
    "eta_hat",
    "log_choose",
    "bound_occam",
    "bound",
    "bound_direct",
    "R_hat_clean",
    "baseline_bits",
    "nontrivial_occam",
    "N_star_closed_form_occam",
    "N_star_schedule_occam",
    "N_star_closed_form",
    "N_star_schedule",
    "gap_mean",
    "abs_gap_mean",
    "kl_bits",
    "top1_agreement",
]


def report_paper(result, run_cfg: RunConfig, args: argparse.Namespace, cfg) -> int:
    """``--protocol paper``: the protocol's result saved (without its certificates), then its table logged."""
    from dataclasses import replace
    from pathlib import Path

    from tl_query_lens.cli.common import print_rows, tracker

    replace(result, sweep=None).save(Path(run_cfg.out) / "protocol_paper")
    shuffled = [
        c for c in ("shuffled_bound_occam", "shuffled_abs_gap_mean", "shuffled_gap_mean") if c in result.rows[0]
    ]
    columns = ["label", *PAPER_COLUMNS, *shuffled]
    rows = [[label, *(row[c] for c in columns[1:])] for label, row in zip(result.labels, result.rows)]
    with tracker(run_cfg, "certify-paper", args, certify=cfg) as track:
        table = track.log_table("certificates_paper_protocol", columns, rows)
    print(
        f"paper protocol ({result.n_documents} evaluation documents, {result.n_eligible} long enough; "
        f"headline = {result.headline}): {table}"
    )
    print_rows(columns, rows)
    return 0
