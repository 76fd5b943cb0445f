"""An unreachable W&B never costs results: the command finishes, everything is on disk, the warning says what to do.

W&B is made unreachable the way a new user meets it: ``WANDB_MODE=online``, no API key (no netrc either), and a
base URL on the loopback where nothing listens (connections are refused).
"""

import csv
import logging
import socket

import pytest

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import main
from tl_query_lens.tracking import Tracker


def _refused_url() -> str:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def unreachable_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", _refused_url())
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def tiny_loaders(monkeypatch):
    model = tiny_model("gelu_ln")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)

    def tokens(*a, n_seqs, seq_len, **kw):
        return tiny_tokens(model, n_seqs, seq_len)

    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", tokens)
    return model


def _check_warning(text: str, out) -> None:
    assert "W&B logging failed" in text and "No API key configured" in text
    assert f"Every result is on disk under {out}" in text
    assert "wandb sync" in text and "--no-wandb" in text and "WANDB_MODE=offline" in text


def test_cli_finishes_with_results_when_wandb_is_unreachable(unreachable_wandb, tiny_loaders, tmp_path, caplog):
    out = tmp_path / "ffkv"
    with caplog.at_level(logging.WARNING, logger="tl_query_lens.tracking"):
        rc = main(["ffkv", "--layers", "0,2", "--k", "8", "--n-seqs", "2", "--seq-len", "8", "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader((out / "ffkv_per_layer.csv").open()))
    assert [r["layer"] for r in rows] == ["0", "2"]
    assert (out / "layer0" / "result.json").exists() and (out / "layer2" / "result.json").exists()
    _check_warning(caplog.text, out)
    offline = list((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("*.wandb"))  # the run is kept for `wandb sync`
    assert f"wandb sync {offline[0]}" in caplog.text


def test_tracker_keeps_results_and_names_the_fix(unreachable_wandb, tmp_path, caplog):
    with (
        caplog.at_level(logging.WARNING, logger="tl_query_lens.tracking"),
        Tracker(tmp_path, name="t") as tracker,
    ):
        path = tracker.log_table("rows", ["a"], [[1], [2]])
        tracker.log_scalars("s", {"x": 1.0})
    assert path.read_text().splitlines() == ["a", "1", "2"] and (tmp_path / "s.json").exists()
    assert tracker.wandb_error.startswith("UsageError")
    _check_warning(caplog.text, tmp_path)


def test_a_failing_block_logs_nothing_to_wandb(unreachable_wandb, tmp_path, caplog):
    with pytest.raises(RuntimeError, match="stop"), Tracker(tmp_path, name="t") as tracker:
        tracker.log_scalars("s", {"x": 1.0})
        raise RuntimeError("stop")
    assert (tmp_path / "s.json").exists() and tracker.run_dir is None and tracker.wandb_error is None


@pytest.mark.slow
def test_refused_connection_with_a_key(unreachable_wandb, monkeypatch, tmp_path, caplog):
    """With an API key W&B retries the refused server until ``WANDB_INIT_TIMEOUT``; the results still stand."""
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    with (
        caplog.at_level(logging.WARNING, logger="tl_query_lens.tracking"),
        Tracker(tmp_path, name="t") as tracker,
    ):
        tracker.log_scalars("s", {"x": 1.0})
    assert (tmp_path / "s.json").exists() and tracker.wandb_error.startswith("CommError")
    assert "wandb sync" in caplog.text
