import json
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import pytest
import torch

from tl_query_lens.results import SavableResult, read_tensors, write_tensors
from tl_query_lens.tracking import Tracker, read_offline_records


@dataclass
class _Result(SavableResult):
    scores: torch.Tensor
    name: str
    value: float


def test_savable_result_round_trip(tmp_path):
    res = _Result(scores=torch.randn(3, 4), name="x", value=float("nan"))
    res.save(tmp_path / "r")
    back = _Result.load(tmp_path / "r")
    assert torch.equal(back.scores, res.scores) and back.name == "x"
    path = write_tensors(tmp_path / "t.safetensors", {"a": torch.ones(2)}, {"model": "m", "n": 3})
    tensors, meta = read_tensors(path)
    assert meta == {"model": "m", "n": 3} and torch.equal(tensors["a"], torch.ones(2))


def _records_when_flushed(path, timeout: float = 20.0):
    """wandb's writer may still be flushing a second run of the same process when ``finish()`` returns."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_offline_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_offline_run_logs_table_and_artifact(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must be the default
    monkeypatch.delenv("WANDB_DIR", raising=False)
    rows = [[0, 0.5, "a"], [1, 0.25, "b"]]
    with Tracker(tmp_path, name="test", config={"k": 3}) as tracker:
        table_path = tracker.log_table("summary", ["layer", "score", "tag"], rows)
        tracker.log_scalars("metrics", {"ev": 0.9})
        tracker.log_plot("curve", go.Figure(go.Scatter(x=[0, 1], y=[1, 2])))
        tracker.log_artifact("summary-files", [table_path])
        assert tracker.run_dir is None  # W&B is opened only after the results are on disk
    run_dir = tracker.run_dir
    assert tracker.wandb_error is None and run_dir.name.startswith("offline-run-")
    assert table_path.read_text().splitlines()[1] == "0,0.5,a"  # on disk first
    records = _records_when_flushed(next(run_dir.glob("*.wandb")))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds and "exit" in kinds
    logged = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                logged[item.key or ".".join(item.nested_key)] = item.value_json
    assert json.loads(logged["summary.nrows"]) == 2
    table_json = json.loads((run_dir / "files" / json.loads(logged["summary.path"])).read_text())
    assert table_json["columns"] == ["layer", "score", "tag"] and table_json["data"] == rows
    assert json.loads(logged["metrics/ev"]) == 0.9
    assert json.loads(logged["curve._type"]) == "html-file"
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    ours = [a for a in artifacts if a.name == "summary-files"]
    assert ours and any(e.path == "summary.csv" for e in ours[0].manifest.contents)


def test_missing_artifact_file_is_refused(tmp_path):
    tracker = Tracker(tmp_path, use_wandb=False)
    with pytest.raises(FileNotFoundError, match="write these to disk"):
        tracker.log_artifact("x", [tmp_path / "nope.json"])
