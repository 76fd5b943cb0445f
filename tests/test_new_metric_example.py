"""The worked example of docs/architecture.md, "Adding an SAE metric": a metric the package does NOT compute yet,
``l0_std`` (the standard deviation over the scored positions of the number of features firing), added as the recipe
says and seen in the result's table, its CSV, the W&B scalars (offline Tracker), the HTML report card and the output of
``tlql saes report``.

In the package the change is: a running sum in ``SpliceStats.update_codes`` and a key of ``SpliceStats.metrics()``
(``dictionaries/splice.py``), its name in ``METRICS`` and ``SuiteQuality.HEADLINE`` (``saes/report.py``), and this
test. Here the same declarations are made by monkeypatching (a ``SpliceStats`` subclass, the result's column types and
headline), so that the test runs against the unchanged package and fails if any step stops reaching its output."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.dictionaries.splice import SpliceStats
from tl_query_lens.saes import report
from tl_query_lens.saes.report import SuiteQuality, suite_quality
from tl_query_lens.sources import DictionarySource
from tl_query_lens.tracking import Tracker

SKIP = 1  # suite_quality's default exclude_first_positions


class StatsWithL0Std(SpliceStats):
    """Step 1, the value: one more running sum (of the squared per-position L0) and one more key of ``metrics()``."""

    def __init__(self, d_sae: int) -> None:
        super().__init__(d_sae)
        self.l0_sq = 0.0

    def update_codes(self, acts: torch.Tensor) -> None:
        super().update_codes(acts)
        self.l0_sq += (acts != 0).sum(-1).double().pow(2).sum().item()

    def metrics(self) -> dict:
        out = super().metrics()
        return out | {"l0_std": max(self.l0_sq / self.n_tokens - out["mean_l0"] ** 2, 0.0) ** 0.5}


@pytest.fixture
def with_l0_std(monkeypatch):
    monkeypatch.setattr(report, "SpliceStats", StatsWithL0Std)
    # step 2, the column: its name among the metrics (typed) and a headline scalar
    monkeypatch.setattr(SuiteQuality, "COLUMN_TYPES", {**SuiteQuality.COLUMN_TYPES, "l0_std": float})
    monkeypatch.setattr(SuiteQuality, "HEADLINE", (*SuiteQuality.HEADLINE, "l0_std"))


def _sae() -> StandardSAE:
    torch.manual_seed(1)  # a ReLU SAE: the number of firing features varies from position to position
    sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=48, metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post")))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae


def _reference(model, sae, tokens) -> float:
    """The spread written out: encode the scored positions, count the firing features, take the population std."""
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.1.hook_resid_post"])
    l0 = (sae.encode(cache["blocks.1.hook_resid_post"][:, SKIP:]) != 0).sum(-1).double()
    return l0.std(unbiased=False).item()


def test_a_new_metric_reaches_table_wandb_and_report(tmp_path, with_l0_std):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=4, seq_len=10, seed=3)
    sae = _sae()
    quality = suite_quality(model, {"L1_sae": sae}, tokens, batch_size=2)
    reference = _reference(model, sae, tokens)
    assert reference > 0
    assert quality.tables()["quality"].column("l0_std") == [pytest.approx(reference, rel=1e-9)]
    with Tracker(tmp_path, use_wandb=False) as tracker:  # W&B gets exactly what these files hold
        tracker.log_result(quality, "saes_quality")
    scalars = json.loads((tmp_path / "saes_quality.json").read_text())
    assert scalars["L1_sae/l0_std"] == pytest.approx(reference, rel=1e-9)
    table = list(csv.DictReader((tmp_path / "saes_quality_quality.csv").read_text().splitlines()))
    assert float(table[0]["l0_std"]) == pytest.approx(reference, rel=1e-6)
    card = quality.report_section()
    assert "<th>l0_std</th>" in card and "L1_sae/l0_std" in card


def test_tlql_saes_report_logs_the_new_metric_through_the_tracker(tmp_path, monkeypatch, with_l0_std):
    """``tlql saes report`` logs its whole result (``Tracker.log_result``), so the new column reaches W&B's files."""
    from tl_query_lens.cli import main

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=4, seq_len=10, seed=3)
    sae = _sae()
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", lambda *a, **k: tokens)
    monkeypatch.setattr(
        "tl_query_lens.sources.release_sources",
        lambda release, ids: [DictionarySource(f"{release}:L1_sae", "pretrained", release, "L1_sae")],
    )
    monkeypatch.setattr("tl_query_lens.sources.load_dictionary", lambda source, device=None: sae)
    out = tmp_path / "out"
    assert main(["saes", "report", "--no-wandb", "--out", str(out), "--batch-size", "2"]) == 0
    reference = _reference(model, sae, tokens)
    scalars = json.loads((out / "saes_quality.json").read_text())
    assert scalars["L1_sae/l0_std"] == pytest.approx(reference, rel=1e-9)
    table = list(csv.DictReader((out / "saes_quality_quality.csv").read_text().splitlines()))
    assert float(table[0]["l0_std"]) == pytest.approx(reference, rel=1e-6)
