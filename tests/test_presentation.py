"""Every result class presents itself through one interface: scalars, typed tables, figures and a report section;
``Tracker.log_result`` reads only that interface."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import plotly.graph_objects as go
import pytest
import torch

from tests.test_results import RESULT_CLASSES, make
from tests.test_tracking import _records_when_flushed
from tl_query_lens.atlas.build import AtlasResult
from tl_query_lens.certify.certify import Certificate
from tl_query_lens.certify.commands import PaperCertificates
from tl_query_lens.certify.protocol import ProtocolCertification, protocol_row
from tl_query_lens.certify.sweep import LayerSweep
from tl_query_lens.dictionaries.absorption import AbsorptionResult
from tl_query_lens.dictionaries.compare import DictionaryComparison
from tl_query_lens.dictionaries.splice import FFKVSummary
from tl_query_lens.presentation import CELL_TYPES, Presentable, Table
from tl_query_lens.query_lens.channels import ChannelAnalysis
from tl_query_lens.query_lens.channels_commands import ChannelsRun
from tl_query_lens.query_lens.commands import QueryLensRun, Table1Run
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.result import Signatures
from tl_query_lens.readout.commands import ReadoutDecomposition, ReadoutEvalRun, ReadoutFitRun
from tl_query_lens.readout.cross_lens_paper import CrossLensPromptResult
from tl_query_lens.readout.decompose import Decomposition
from tl_query_lens.readout.diagnostics_paper import PaperReadoutDiagnostics
from tl_query_lens.readout.evaluate import ReadoutReport
from tl_query_lens.readout.fit import ReadoutFit
from tl_query_lens.reproduce.run import Reproduction
from tl_query_lens.results import loads_json
from tl_query_lens.saes.report import COLUMNS as QUALITY_COLUMNS
from tl_query_lens.saes.report import SuiteQuality
from tl_query_lens.tracking import Tracker


# Results whose rows are free-form dicts: the generic builder of test_results fills them with placeholders, so these
# get rows shaped like the ones their functions write.
def _comparison():
    result = make(DictionaryComparison)
    result.rows = [
        {"label": "ffkv L1", "model": "trained", "kind": "ffkv", "layer": 1, "alive_rate": 0.5, "mean_l0": 3.0}
        | {"explained_variance": 0.25, "ce_delta": 0.1, "kl": 0.2, "absorption_fraction": None}
        | {"full_absorption": None, "absorption_letters": None, "absorption_note": ""},
        {"label": "sae", "model": "random", "kind": "sae", "layer": None, "alive_rate": 1, "mean_l0": float("nan")}
        | {"explained_variance": 0.5, "ce_delta": -math.inf, "kl": 0.0, "absorption_fraction": 0.125}
        | {"full_absorption": 0.0, "absorption_letters": 4, "absorption_note": "x"},
    ]
    result.faithfulness = [
        {"label": "tc L1", "layer": 1} | dict.fromkeys(DictionaryComparison.FAITHFULNESS_METRICS, 0.5)
    ]
    result.times = {"dictionaries": 1.5, "faithfulness": 2}
    return result


def _quality():
    row = {c: 0.5 for c in QUALITY_COLUMNS} | {
        "sae_id": "L1_sae",
        "kind": "sae",
        "layer": 1,
        "d_sae": 64,
        "n_tokens": 9,
    }
    return SuiteQuality(rows=[row, row | {"sae_id": "L2", "ce_recovered": float("nan")}], n_tokens=9, seconds=1.0)


def _channels():
    result = make(ChannelAnalysis)
    result.channels = ["l0->blocks.1.attn", "l0->blocks.1.mlp"]
    metric = dict.fromkeys(ChannelAnalysis.METRICS, 0.25)
    result.metrics = {"closed_form": {name: metric for name in result.channels}}
    result.overlaps = {"closed_form": [[1.0, 0.5], [0.5, 1.0]]}
    result.summary = {"closed_form": {"ol_same": 0.5, "auc": float("nan"), "n_same": 1}}
    return result


def _absorption():
    result = make(AbsorptionResult)
    letter = {"probe_f1": 0.9, "absorption_fraction": 0.1, "full_absorption": 0.0, "n_true_positives": 7}
    result.per_letter = {"a": letter | {"main_latents": [3, 5], "n_main": 2}}
    return result


def _cross_lens_prompts():
    result = make(CrossLensPromptResult)
    result.per_group = {"capitals": {"pass": 3, "n": 4, "rate": 0.75}}
    return result


def _fit():
    result = make(ReadoutFit)
    result.history = [{"step": 0, "loss": 1.5}, {"step": 10, "loss": float("nan")}]
    result.final = {"loss": 0.5, "row_ev": 0.9}
    return result


def _protocol():
    result = make(ProtocolCertification)
    result.labels = ["a", "b"]
    result.rows = [protocol_row(make(Certificate), delta=0.05), protocol_row(make(Certificate, [1]), delta=0.05)]
    # the shuffled twin's keys, as summarise() writes them: every protocol_row entry (bools and ints included)
    for row, seed in zip(result.rows, ([2], [3])):
        row |= {f"shuffled_{k}": v for k, v in protocol_row(make(Certificate, seed), delta=0.05).items()}
    result.headline = "bound_occam"
    return result


def _ffkv_summary():
    metrics = make(FFKVSummary).sparse[0]
    return FFKVSummary(k=8, sparse={1: metrics, 3: metrics}, dense={3: metrics})


def _readout_report():
    result = make(ReadoutReport)
    result.seconds = {"srp": 1.5}
    for r in [result.srp, *result.baselines.values()]:
        r.extra = {}
        r.coverage_by_family = {"top1_vs_competitor": 0.5}
        r.top1_ci, r.coverage_ci = [0.25, 0.75], [float("nan"), 1.0]
    return result


def _paper_readout():
    result = make(PaperReadoutDiagnostics)
    result.coverage_baselines = {"pca256": 0.25, "nearest_row_ridge": 0.5}
    result.coverage_baselines_ci = {"pca256": [0.2, 0.3]}
    result.coverage_baselines_by_family = {"pca256": {"top1_vs_competitor": 0.1}}
    result.rho0_median_baselines = {"pca256": 0.4}
    result.coverage_ci = [0.1, 0.2]
    return result


def _signatures():
    n, k, d = 2, 3, 4
    result = make(Signatures)
    result.feature_ids = torch.tensor([3, 7])
    result.top_ids, result.bottom_ids = torch.arange(n * k).view(n, k), torch.arange(n * k).view(n, k).flip(-1)
    result.top_scores, result.bottom_scores = torch.randn(n, k), torch.randn(n, k)
    result.directions, result.center = torch.randn(n, d), None
    result.top_strings = [["a", "b", "c"], [" x", "y", "z"]]
    result.bottom_strings = None
    result.module_names, result.module_shares = ["direct", "blocks.1.attn"], torch.tensor([[0.5, 0.5], [1.5, -0.5]])
    result.module_contributions = None
    return result


def _evaluation():
    n_methods, n_targets, n = 2, 2, 3
    result = make(SignatureEvaluation)
    result.methods, result.kl_targets = ["QL_VALUE", "LL_VALUE"], [0.25, 0.5]
    result.features, result.layers = torch.tensor([1, 5, 9]), torch.tensor([0, 0, 1])
    result.input_scores = torch.rand(n_methods, n)
    result.output_scores = torch.rand(n_methods, n_targets, n)
    result.alphas, result.search_kl, result.achieved_kl = (torch.rand(n_targets, n) for _ in range(3))
    result.steered_top = torch.zeros(n_targets, n, 4, dtype=torch.long)
    result.signature_ids = torch.zeros(n_methods, n, 5, dtype=torch.long)
    result.dictionaries = ["ffkv L0", "ffkv L0", "sae L1"]
    return result


def _decomposition():
    d_sae = 6
    contributions = torch.randn(1, d_sae)
    result = make(Decomposition)
    result.exact, result.bias, result.residual = torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25])
    result.contributions, result.projections, result.beta = contributions, torch.randn(1, d_sae), torch.randn(d_sae)
    result.top_features = [{"feature": int(contributions.abs().argmax()), "contribution": 1.0, "label": "cap"}]
    return result


def _atlas():
    result = make(AtlasResult)
    result.dictionaries = [{"slug": "12-ffkv", "label": "ffkv L12", "kind": "ffkv", "layer": 12, "n_features": 256}]
    result.seconds = {"pass": 1.5}
    return result


def _reproduction():
    result = make(Reproduction)
    row = {
        "id": "readout.top1",
        "section": "s",
        "headline": "top-1",
        "paper": "0.75-0.90",
        "documented": 0.68,
        "documented_lo": 0.66,
        "documented_hi": 0.70,
        "value": 0.69,
        "value_lo": None,
        "value_hi": None,
        "inside": True,
    }
    result.rows = [
        row,
        {**row, "id": "x", "documented": None, "documented_lo": None, "documented_hi": None, "inside": None},
    ]
    result.seconds = {"readout_paper": 80.0}
    return result


def _copy_into(cls, base):
    """A command's result class that extends ``base``'s class, holding ``base``'s realistic values."""
    result = make(cls)
    for f in dataclasses.fields(base):
        setattr(result, f.name, getattr(base, f.name))
    return result


def _readout_eval_run():
    result = make(ReadoutEvalRun)
    result.report, result.paper = _readout_report(), _paper_readout()
    return result


def _table1_run():
    result = make(Table1Run)
    result.evaluation = _evaluation()
    result.summaries, result.groups = {"ffkv": result.evaluation.summary()}, {"ffkv": ["ffkv L1"]}
    return result


BUILDERS = {
    AtlasResult: _atlas,
    Reproduction: _reproduction,
    FFKVSummary: _ffkv_summary,
    ReadoutReport: _readout_report,
    PaperReadoutDiagnostics: _paper_readout,
    Signatures: _signatures,
    SignatureEvaluation: _evaluation,
    Decomposition: _decomposition,
    DictionaryComparison: _comparison,
    SuiteQuality: _quality,
    ChannelAnalysis: _channels,
    AbsorptionResult: _absorption,
    CrossLensPromptResult: _cross_lens_prompts,
    ReadoutFit: _fit,
    ProtocolCertification: _protocol,
    PaperCertificates: lambda: PaperCertificates(protocol_paper=_protocol()),
    ChannelsRun: lambda: ChannelsRun(channels=_channels(), sources=[1], seconds=2.0),
    QueryLensRun: lambda: QueryLensRun(signatures={"layer1_value": _signatures()}),
    Table1Run: _table1_run,
    ReadoutFitRun: lambda: _copy_into(ReadoutFitRun, _fit()),
    ReadoutDecomposition: lambda: _copy_into(ReadoutDecomposition, _decomposition()),
    ReadoutEvalRun: _readout_eval_run,
}


def example(cls):
    return BUILDERS[cls]() if cls in BUILDERS else make(cls)


@pytest.mark.parametrize("cls", RESULT_CLASSES, ids=lambda c: c.__name__)
def test_every_result_presents_itself(cls):
    result = example(cls)
    assert isinstance(result, Presentable)
    scalars = result.scalars()
    assert isinstance(scalars, dict) and all(isinstance(k, str) and type(v) is float for k, v in scalars.items())
    tables = result.tables()
    for name, table in tables.items():
        assert isinstance(table, Table), name
        assert all(col.type in CELL_TYPES for col in table.columns)
        table.check()  # every cell has its column's declared type
        assert len(set(table.names)) == len(table.names), f"{name}: duplicate columns"
    figures = result.figures()
    assert all(isinstance(f, go.Figure) for f in figures.values())
    section = result.report_section()
    assert section.startswith("<section>") and section.endswith("</section>")
    assert "PlotlyConfig" not in section  # figures without plotly.js: the report embeds it once
    for name in tables:
        assert f"<h3>{name}</h3>" in section
    if cls in BUILDERS:
        assert tables and all(t.rows for t in tables.values()), "the realistic example fills every table"


def test_tables_carry_the_values_of_the_result():
    """Typed tables hold the same numbers as the fields (and as the lists of the older row methods)."""
    cert = make(Certificate)
    curve = cert.tables()["curve"]
    assert curve.column("N") == cert.curve_N and _same(curve.column("bound_occam"), cert.curve_bound_occam)
    sweep = LayerSweep({1: cert}, {1: make(Certificate, [1])}, seed=0)
    table = sweep.tables()["certificates"]
    assert table.names == list(LayerSweep.COLUMNS)
    assert [r[1:] for r in table.rows] == [tuple(r[1:]) for r in sweep.rows()] or all(
        _same(list(a[1:]), list(b[1:])) for a, b in zip(table.rows, sweep.rows())
    )
    assert table.column("label") == ["1", "1"] and table.column("proxy") == ["real", "shuffled"]
    summary = _ffkv_summary()
    per_layer = summary.tables()["per_layer"]
    assert per_layer.names == list(FFKVSummary.COLUMNS) and per_layer.column("layer") == [1, 3]
    assert per_layer.column("ev_vanilla")[0] is None and _same(
        per_layer.column("ev_vanilla")[1], summary.dense[3].explained_variance
    )
    assert _same(summary.scalars()["layer1/kl"], summary.sparse[1].kl)
    quality = _quality()
    assert quality.tables()["quality"].records()[1]["sae_id"] == "L2"
    assert quality.scalars()["L1_sae/explained_variance"] == 0.5


def _same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b


def test_table_refuses_cells_of_another_type():
    """The type check can fail: an int in a float column is converted by build, a string or a list is refused, and
    check() names a cell put there by hand."""
    table = Table.build({"n": int, "x": float, "tag": (str, None)}, [[1, 2, None], [torch.tensor(3), 0.5, "a"]])
    assert table.rows == [(1, 2.0, None), (3, 0.5, "a")]
    with pytest.raises(TypeError, match="cannot take"):
        Table.build({"x": float}, [["0.5"]])
    with pytest.raises(TypeError, match="cannot take"):
        Table.build({"n": int}, [[True]])
    with pytest.raises(TypeError, match="does not take None"):
        Table.build({"x": float}, [[None]])
    table.rows.append((1.0, 0.5, "b"))
    with pytest.raises(TypeError, match="Row 2, column 'n'"):
        table.check()


def test_log_result_reads_only_the_interface(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_DIR", raising=False)
    cert = make(Certificate)
    cert.config = {"write_hook": "blocks.3.hook_mlp_out"}
    cert.N_star, cert.bound_occam = 1234.0, 7.5  # finite: W&B writes NaN as null
    sweep = LayerSweep({3: cert}, seed=0)
    with Tracker(tmp_path, name="log-result") as tracker:
        written = tracker.log_result(sweep, "certify")
    assert set(written) == {"scalars", "table/certificates", "figure/bound_vs_N", "figure/bound_occam_vs_N"}
    on_disk = loads_json((tmp_path / "certify.json").read_text())  # standard JSON, non-finite floats encoded
    assert on_disk["3/bound"] == cert.bound and on_disk["times/clean_s"] == sweep.times.clean
    rows = list(csv.reader((tmp_path / "certify_certificates.csv").read_text().splitlines()))
    assert rows[0] == list(LayerSweep.COLUMNS) and rows[1][:3] == ["3", "blocks.3.hook_mlp_out", "real"]
    records = _records_when_flushed(next(tracker.run_dir.glob("*.wandb")))
    history, summary = {}, {}
    for r in records:
        kind = r.WhichOneof("record_type")
        items = r.history.item if kind == "history" else r.summary.update if kind == "summary" else []
        for item in items:
            (history if kind == "history" else summary)[item.key or ".".join(item.nested_key)] = item.value_json
    assert json.loads(history["certify_certificates._type"]) == "table-file"
    assert json.loads(history["certify_certificates.nrows"]) == 1
    assert "plotly" in json.loads(history["certify_bound_vs_N._type"])
    assert json.loads(history["certify/3/bound_occam"]) == pytest.approx(cert.bound_occam)
    assert json.loads(summary["certify/3/N_star"]) == pytest.approx(cert.N_star)
