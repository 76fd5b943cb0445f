"""Readout fits record how they were made (seed, threads, versions) in cfg.json, and readers say which fit they read."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json

import pytest
import torch
from sae_lens import SAE

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.readout import cached_sae_path, fit_readout
from tl_query_lens.readout.registry import describe_fit_source, fit_source

FIT = {"width": 64, "k": 4, "steps": 6, "batch_rows": 32, "batch_pairs": 16, "log_every": 3, "progress": False}


@pytest.fixture(scope="module")
def model():
    return tiny_model("gelu_ln")


def test_fit_records_seed_threads_and_versions_in_cfg_json(model, tmp_path):
    tokens = tiny_tokens(model, 4, 10)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        fit = fit_readout(model, tokens, seed=5, **FIT)
    finally:
        torch.set_num_threads(threads)
    fit.sae.save_model(tmp_path / "sae")
    saved = json.loads((tmp_path / "sae" / "cfg.json").read_text())["metadata"]["readout_fit"]
    assert saved["seed"] == 5 and saved["config"]["seed"] == 5
    assert saved["torch_threads"] == 1
    assert saved["versions"]["torch"] == str(torch.__version__)
    assert saved["versions"]["sae-lens"] == importlib.metadata.version("sae-lens")
    assert saved["steps_done"] == 6 and saved["config"]["steps"] == 6
    expected = hashlib.sha256(tokens.to(torch.int64).numpy().tobytes() + str(tuple(tokens.shape)).encode())
    assert saved["corpus_fingerprint"] == expected.hexdigest()[:16]
    assert fit.provenance == saved
    # SAELens keeps the extra metadata key on load.
    loaded = SAE.load_from_disk(tmp_path / "sae")
    assert loaded.cfg.metadata.readout_fit["seed"] == 5


def test_fit_source_names_the_cached_fit_and_its_provenance(model, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    assert fit_source("tiny-test", "small")["where"] == "not found"
    fit = fit_readout(model, tiny_tokens(model, 4, 10), seed=3, **FIT)
    folder = cached_sae_path("tiny-test", "small")
    fit.sae.save_model(folder)
    source = fit_source("tiny-test", "small")
    assert source["where"] == "user cache" and source["path"] == str(folder)
    assert source["weights_sha256"] == hashlib.sha256((folder / "sae_weights.safetensors").read_bytes()).hexdigest()
    assert source["readout_fit"]["seed"] == 3
    line = describe_fit_source(source, "tlql-readout-tiny-test:small")
    assert str(folder) in line and "seed 3" in line and f"{torch.get_num_threads()} torch thread(s)" in line
    assert source["weights_sha256"][:12] in line
    # A folder given directly, fitted before provenance was kept (metadata without readout_fit).
    cfg_path = folder / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["metadata"]["readout_fit"]
    cfg_path.write_text(json.dumps(cfg))
    old = fit_source("tiny-test", sae_path=folder)
    assert old["where"] == "folder" and old["readout_fit"] == {}
    assert "no fit provenance recorded" in describe_fit_source(old, str(folder))


def test_readout_eval_prints_which_fit_it_read(model, tmp_path, monkeypatch, capsys):
    from tl_query_lens.cli import main

    fit_readout(model, tiny_tokens(model, 4, 10), seed=2, **FIT).sae.save_model(tmp_path / "sae")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus",
        lambda src, tok, n_seqs, seq_len, split, seed=0: tiny_tokens(model, n_seqs, seq_len, seed=7),
    )
    argv = ["readout", "eval", "--protocol", "paper", "--sae-path", str(tmp_path / "sae"), "--n-seqs", "3"]
    argv += ["--seq-len", "8", "--baselines", "nearest_row_ridge", "--no-wandb", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(line for line in lines if line.startswith("Readout SAE "))
    assert first.startswith(f"Readout SAE {tmp_path / 'sae'}: folder") and "seed 2" in first
    record = json.loads((tmp_path / "out" / "result.json").read_text())  # the run's result names the fit it read
    assert record["fields"]["source"]["readout_fit"]["seed"] == 2
