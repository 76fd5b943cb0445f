"""``reproduce``: rows read through the presentation interface, resumable experiments, documented intervals, and the
exit status of ``tlql reproduce``. The experiments here are stand-ins (the real ones need the shipped release and
run in the slow suite); what is tested is the machinery every real row goes through."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from tl_query_lens.config import RunConfig
from tl_query_lens.presentation import Table
from tl_query_lens.reproduce import experiments as ex
from tl_query_lens.reproduce import rows as rw
from tl_query_lens.reproduce import run as rr
from tl_query_lens.results import SavableResult


@dataclass
class FakeResult(SavableResult):
    score: float
    score_ci: list[float]
    per_label: dict[str, float]

    title: ClassVar[str] = "fake"

    def tables(self) -> dict[str, Table]:
        return {"t": Table.build({"label": str, "v": float}, [[k, v] for k, v in self.per_label.items()])}


@dataclass
class FakeConfig:
    """A stand-in experiment's config: ``quick()`` its reduced size.

    Attributes:
        run: where its partial results go. size: which preset.
    """

    run: RunConfig = field(default_factory=RunConfig)
    size: str = "big"

    SIZES: ClassVar[dict[str, str]] = {"quick": "tiny", "full": "big"}

    @classmethod
    def quick(cls) -> FakeConfig:
        return cls(size="tiny")


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    calls = {"n": 0, "score": 0.5}

    def run(model, cfg):
        calls["n"] += 1
        calls["cfg"] = cfg
        return FakeResult(calls["score"], [calls["score"] - 0.1, calls["score"] + 0.1], {"a": 1.0, "b": 2.0})

    experiment = ex.Experiment("fake", "a stand-in", FakeConfig, run, FakeResult)
    rows = [
        rw.Row(
            "fake.score",
            "s",
            "score",
            "0.9",
            "fake",
            ("scalar", "score"),
            ci=(("scalar", "score_ci_lo"), ("scalar", "score_ci_hi")),
        ),
        rw.Row("fake.b", "s", "b", "2", "fake", ("table", "t", {"label": "b"}, "v"), scale=10.0, tolerance=0.5),
        rw.Row("fake.missing", "s", "missing", "-", "fake", ("table", "t", {"label": "zzz"}, "v"), full_only=True),
    ]
    monkeypatch.setattr(rr, "EXPERIMENTS", {"fake": experiment})
    monkeypatch.setattr(rw, "ROWS", rows)
    monkeypatch.setattr(rr, "DOCUMENTED", tmp_path / "documented.json")
    return calls


def test_rows_are_read_through_the_presentation_interface(fake, tmp_path):
    result = rr.reproduce(None, size="quick", out=str(tmp_path / "out"))
    # the experiment ran with its quick preset, its folder as its --out (partial results resume from there)
    assert fake["cfg"] == FakeConfig(run=RunConfig(out=str(tmp_path / "out" / "experiments" / "fake")), size="tiny")
    by_id = {r["id"]: r for r in result.rows}
    assert set(by_id) == {"fake.score", "fake.b"}  # the full-only row is not part of a quick run
    assert by_id["fake.score"]["value"] == 0.5 and by_id["fake.score"]["value_lo"] == pytest.approx(0.4)
    assert by_id["fake.b"]["value"] == 20.0  # table cell 2.0, scaled by 10
    assert all(r["inside"] is None for r in result.rows)  # nothing documented yet
    text = (tmp_path / "out" / "reproduction.md").read_text()
    assert "| `fake.b` | b | 2 | — | 20 | not documented |" in text
    assert (tmp_path / "out" / "reproduction.csv").read_text().splitlines()[0].startswith("id,section,headline")


def test_record_then_rerun_resumes_and_checks_the_interval(fake, tmp_path):
    out = str(tmp_path / "out")
    rr.reproduce(None, size="quick", out=out, record=True)
    documented = json.loads((tmp_path / "documented.json").read_text())["quick"]
    assert documented["fake.score"]["lo"] == pytest.approx(0.4)  # the CI of the recorded run
    assert (documented["fake.b"]["lo"], documented["fake.b"]["hi"]) == (19.5, 20.5)  # ± tolerance
    again = rr.reproduce(None, size="quick", out=out)
    assert fake["n"] == 1  # the saved experiment was loaded, not measured again
    assert all(r["inside"] is True for r in again.rows) and not again.outside

    fake["score"] = 0.95  # a new measurement that left the documented interval
    moved = rr.reproduce(None, size="quick", out=str(tmp_path / "fresh"))
    assert fake["n"] == 2 and moved.outside == ["fake.score"]
    assert "**no**" in moved.markdown()
    # A run of the other size is measured again, not read from the quick folder.
    rr.reproduce(None, size="full", out=out)
    assert fake["n"] == 3


def test_cli_exits_nonzero_when_a_figure_is_outside(fake, tmp_path, monkeypatch):
    from tl_query_lens.cli import main

    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: None)
    out = str(tmp_path / "out")
    assert main(["reproduce", "--quick", "--no-wandb", "--out", out, "--record"]) == 0
    fake["score"] = 0.95
    assert main(["reproduce", "--quick", "--no-wandb", "--out", str(tmp_path / "again")]) == 1


def test_an_experiment_whose_corpus_is_missing_is_skipped_with_the_install_command(fake, tmp_path, monkeypatch):
    from tl_query_lens.cli import main

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "empty-cache"))  # no 'broad' corpus installed here
    needs_broad = ex.Experiment(
        "fake", "a stand-in", FakeConfig, lambda *a: pytest.fail("ran"), FakeResult, needs=("broad",)
    )
    monkeypatch.setattr(rr, "EXPERIMENTS", {"fake": needs_broad})
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: None)
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--no-wandb", "--out", str(out)]) == 0  # skipped, not failed
    text = (out / "reproduction.md").read_text()
    assert "`fake` not measured" in text and "setup.sh --broad-corpus" in text
    assert "| `fake.score` | score | 0.9 | — | — | not measured (see below) |" in text
    assert fake["n"] == 0 and not (out / "experiments" / "fake").exists()
    # A result measured earlier (where the corpus was installed) still loads without it.
    run_once = ex.Experiment(
        "fake", "a stand-in", FakeConfig, lambda *a: FakeResult(0.5, [0.4, 0.6], {"b": 2.0}), FakeResult
    )
    monkeypatch.setattr(rr, "EXPERIMENTS", {"fake": run_once})
    rr.reproduce(None, size="quick", out=str(out))
    monkeypatch.setattr(rr, "EXPERIMENTS", {"fake": needs_broad})
    again = rr.reproduce(None, size="quick", out=str(out))
    assert not again.skipped and again.rows[0]["value"] == 0.5


def test_unknown_experiment_and_size_are_refused(tmp_path):
    """An unknown size is refused by the config; an unknown experiment by ``reproduce`` before it writes or runs
    anything (the model is not touched: None stands for it)."""
    from tl_query_lens.errors import InputError
    from tl_query_lens.reproduce.config import ReproduceConfig

    with pytest.raises(InputError, match="choose from"):
        rr.reproduce(None, ReproduceConfig(experiments=("nope",), out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="quick"):
        ReproduceConfig(size="medium")  # type: ignore[arg-type]


def test_every_real_experiment_has_two_sizes():
    """Each experiment is a config and a run: ``quick()`` is a smaller preset than the documented default."""
    for name, experiment in ex.EXPERIMENTS.items():
        full, quick = experiment.preset("full"), experiment.preset("quick")
        assert type(full) is type(quick) is experiment.config and full != quick, name
        assert set(experiment.sizes) == {"quick", "full"}, name


def test_every_real_row_names_an_experiment_and_a_reader():
    for row in rw.ROWS:
        assert row.experiment in ex.EXPERIMENTS, row.id
        assert row.read[0] in ("scalar", "table") and row.tolerance > 0, row.id  # a CI alone can have zero width
    assert len({r.id for r in rw.ROWS}) == len(rw.ROWS)
    quick, full = rw.rows_for("quick"), rw.rows_for("full")
    assert len(quick) < len(full) and {r.experiment for r in quick} == set(ex.EXPERIMENTS)


SHIPPED = rr.Path(ex.__file__).resolve().parents[1] / "release" / ex.SUITE


@pytest.mark.slow
@pytest.mark.skipif(not SHIPPED.is_dir(), reason="no release packed in this checkout")
def test_quick_reproduction_passes_on_the_shipped_release(tmp_path):
    """`tlql reproduce --quick` on the embedded model: every quick row documented and inside its interval."""
    from tl_query_lens.cli import main

    out = tmp_path / "reproduce"
    assert main(["reproduce", "--quick", "--no-wandb", "--out", str(out)]) == 0
    text = (out / "reproduction.md").read_text()
    assert "not documented" not in text and "**no**" not in text
    assert sum(line.startswith("| `") for line in text.splitlines()) == len(rw.rows_for("quick"))
    missing = [name for name in ex.EXPERIMENTS if rr.missing_needs(name)]  # .ci/run installs the 'broad' corpus
    assert ("not measured" in text) == bool(missing), missing


def test_a_saved_experiment_is_reused_only_for_the_same_weights(fake, tmp_path):
    """Content fingerprint: a same-named model with other weights measures again; the same model loads it."""
    import torch

    from tests.helpers import tiny_model

    model_a, model_b = tiny_model("gelu_ln"), tiny_model("gelu_ln")
    with torch.no_grad():
        model_b.blocks[0].mlp.W_out.mul_(1.25)
    out = str(tmp_path / "out")
    rr.reproduce(model_a, size="quick", out=out)
    rr.reproduce(model_a, size="quick", out=out)
    assert fake["n"] == 1
    rr.reproduce(model_b, size="quick", out=out)
    assert fake["n"] == 2


def test_estimate_follows_the_first_real_batch_and_adds_none(tmp_path, monkeypatch, caplog):
    """The overall estimate comes from the run's own first forward batch (no extra one): each experiment's cost model
    (``forward_tokens``) times the seconds per token of that batch, on a clock the stand-in experiments advance."""
    from tests.helpers import count_forwards, tiny_model, tiny_tokens

    model = tiny_model("gelu_ln")
    now = [0.0]
    monkeypatch.setattr("tl_query_lens.estimates.time.perf_counter", lambda: now[0])

    def stand_in(n_forwards: int):
        def run(model, cfg):
            for _ in range(n_forwards):
                model(tiny_tokens(model, 4, 8))  # 32 tokens, 3.2 s each: 0.1 s per token
                now[0] += 3.2
            return FakeResult(0.5, [0.4, 0.6], {"a": 1.0})

        return run

    experiments = {
        name: ex.Experiment(name, "a stand-in", FakeConfig, stand_in(n), FakeResult, forward_tokens={"quick": t})
        for name, n, t in (("fake_a", 2, 64), ("fake_b", 1, 1000))
    }
    monkeypatch.setattr(rr, "EXPERIMENTS", experiments)
    monkeypatch.setattr(
        rw, "ROWS", [rw.Row(f"{n}.score", "s", "score", "-", n, ("scalar", "score")) for n in experiments]
    )
    monkeypatch.setattr(rr, "DOCUMENTED", tmp_path / "documented.json")
    forwards = count_forwards(model, monkeypatch)
    with caplog.at_level("INFO", logger="tl_query_lens.reproduce"):
        rr.reproduce(model, size="quick", out=str(tmp_path / "out"))
    assert forwards == [32, 32, 32]  # the stand-ins' own batches, nothing more
    assert [r.getMessage() for r in caplog.records] == [
        "reproduce: step 1 of 2 (fake_a); elapsed 0:00, estimated total after the first forward batch",
        "reproduce: first forward batch timed (0.1 s per token); estimated total 1:50",  # 3.2 s + 6.4 s + 100 s
        "reproduce: step 2 of 2 (fake_b); elapsed 0:06, estimated total 1:46",
        "reproduce: fake_b will take about 1:40; a smaller --experiments list shrinks it",
    ]
