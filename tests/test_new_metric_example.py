"""The worked example of docs/architecture.md, "Adding an SAE metric": a new per-dictionary number reaches the
result's table, its CSV, W&B and the HTML report card by declaring it once on the result class.

The example metric is ``ce_delta = ce_spliced − ce_clean`` (nats), which ``SpliceStats.metrics()`` already computes.
In the package the change is two lines of ``saes/report.py`` (its name in ``COLUMNS``, from which the row of
``suite_quality`` and the column's type in ``SuiteQuality.COLUMN_TYPES`` follow, and in ``HEADLINE``) and one test;
here the same declarations are made on a subclass so that the test runs against the unchanged package."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from typing import ClassVar

import torch
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.saes.report import SuiteQuality, suite_quality
from tl_query_lens.tracking import Tracker


@dataclass
class QualityWithCEDelta(SuiteQuality):
    # step 1 of the example: declare the column (typed) and make it a headline scalar
    COLUMN_TYPES: ClassVar[dict[str, type]] = {**SuiteQuality.COLUMN_TYPES, "ce_delta": float}
    HEADLINE: ClassVar[tuple[str, ...]] = (*SuiteQuality.HEADLINE, "ce_delta")


def with_ce_delta(quality: SuiteQuality) -> QualityWithCEDelta:
    # step 1 of the example, the value: in the package this is one more key of suite_quality's row
    rows = [r | {"ce_delta": r["ce_spliced"] - r["ce_clean"]} for r in quality.rows]
    return QualityWithCEDelta(rows=rows, n_tokens=quality.n_tokens, seconds=quality.seconds)


def test_a_new_metric_reaches_table_wandb_and_report(tmp_path):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=4, seq_len=10, seed=3)
    torch.manual_seed(0)
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=32, d_sae=48, k=4)).eval()
    sae.cfg.metadata.hook_name = "blocks.1.hook_resid_post"
    quality = with_ce_delta(suite_quality(model, {"L1_sae": sae}, tokens, batch_size=2))
    row = quality.row("L1_sae")
    reference = row["ce_spliced"] - row["ce_clean"]  # the metric from the two numbers suite_quality already reports
    assert quality.tables()["quality"].column("ce_delta") == [reference]
    with Tracker(tmp_path, use_wandb=False) as tracker:  # W&B gets exactly what these files hold
        tracker.log_result(quality, "saes_quality")
    scalars = json.loads((tmp_path / "saes_quality.json").read_text())
    assert scalars["L1_sae/ce_delta"] == reference
    table = list(csv.DictReader((tmp_path / "saes_quality_quality.csv").read_text().splitlines()))
    assert float(table[0]["ce_delta"]) == reference
    card = quality.report_section()
    assert "<th>ce_delta</th>" in card and "L1_sae/ce_delta" in card
    # nothing else changed: the columns before it are SuiteQuality's own
    assert list(quality.COLUMN_TYPES)[:-1] == list(SuiteQuality.COLUMN_TYPES)
