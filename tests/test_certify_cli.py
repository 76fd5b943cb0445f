"""``tlql certify`` end to end on a tiny model (load_model / load_corpus patched: no embedded model in fast tests)."""

import csv
import json

import pytest

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import main
from tl_query_lens.paths import result_name


@pytest.fixture()
def tiny_env(monkeypatch):
    model = tiny_model("gelu_ln")
    seeds = {"calibration": 1, "evaluation": 2}
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus",
        lambda src, tok, n_seqs, seq_len, split, seed=0: tiny_tokens(model, n_seqs, seq_len, seed=seeds[split]),
    )
    return model


def test_cli_ffkv_sweep_with_shuffle_writes_table_plots_and_certificates(tiny_env, tmp_path):
    out = tmp_path / "cert"
    rc = main(
        [
            "certify",
            "--layers",
            "0,2",
            "--n-cal",
            "4",
            "--n-eval",
            "24",
            "--seq-len",
            "8",
            "--k",
            "5",
            "--shuffle",
            "--no-wandb",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = list(csv.DictReader((out / "certify_certificates.csv").read_text().splitlines()))
    assert [(r["label"], r["proxy"]) for r in rows] == [
        ("ffkv L0", "real"),
        ("ffkv L2", "real"),
        ("ffkv L0", "shuffled"),
        ("ffkv L2", "shuffled"),
    ]
    assert rows[1]["hook"] == "blocks.2.hook_mlp_out"
    assert all(int(r["N"]) == 24 and int(r["m"]) == 64 for r in rows)
    for name in ("certify_bound_vs_N.html", "certify_gap_real_vs_shuffled.html", "report.html"):
        assert (out / name).exists()
    scalars = json.loads((out / "certify.json").read_text())  # the time split of the shared pass among them
    assert {"times/clean_s", "times/proxy_s", "times/restricted_s", "times/pool_s"} <= set(scalars)
    saved = json.loads((out / result_name("ffkv L2") / "result.json").read_text())["fields"]
    assert saved["N"] == 24 and saved["config"]["k"] == 5


def test_cli_saved_sae_path(tiny_env, tmp_path):
    from tl_query_lens import FFKV

    FFKV.from_model(tiny_env, 1, "vanilla").save_model(tmp_path / "sae")
    out = tmp_path / "cert"
    assert (
        main(
            [
                "certify",
                "--dictionary",
                f"ffkv,{tmp_path / 'sae'}",
                "--layers",
                "2",
                "--shuffle",
                "ffkv L2",
                "--n-cal",
                "4",
                "--n-eval",
                "20",
                "--seq-len",
                "8",
                "--k",
                "5",
                "--no-wandb",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = list(csv.DictReader((out / "certify_certificates.csv").read_text().splitlines()))
    assert [(r["label"], r["proxy"]) for r in rows] == [
        ("ffkv L2", "real"),
        ("sae L1 sae", "real"),
        ("ffkv L2", "shuffled"),
    ]
    assert rows[1]["hook"] == "blocks.1.hook_mlp_out" and rows[0]["N"] == rows[1]["N"] == "20"


def test_cli_too_few_sequences_says_the_minimum(tiny_env, tmp_path, capsys):
    # The tiny model's vocabulary (61) allows N = 20; the check after loading names that minimum.
    assert (
        main(
            [
                "certify",
                "--model",
                "gpt2",
                "--layers",
                "0",
                "--n-cal",
                "4",
                "--n-eval",
                "10",
                "--seq-len",
                "8",
                "--no-wandb",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "the minimum is n = 20" in err.lower() and "Traceback" not in err


def test_cli_unknown_shuffle_label_is_refused_before_any_pass(tiny_env, tmp_path, capsys, monkeypatch):
    import importlib

    certify_module = importlib.import_module("tl_query_lens.certify.certify")

    def no_pass(*args, **kwargs):
        raise AssertionError("a certification pass ran before the labels were checked")

    monkeypatch.setattr(certify_module, "first_firing", no_pass)
    assert (
        main(
            [
                "certify",
                "--layers",
                "0",
                "--shuffle",
                "ffkv L9",
                "--n-cal",
                "4",
                "--n-eval",
                "24",
                "--seq-len",
                "8",
                "--no-wandb",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "shuffle names labels ['ffkv L9'] that are not among the proxies ['ffkv L0']" in err
    assert "Traceback" not in err


def _certify_argv(out, *extra):
    return ["certify", "--layers", "2", "--n-cal", "4", "--n-eval", "24", "--seq-len", "8", "--k", "5", *extra,
            "--no-wandb", "--out", str(out)]  # fmt: skip


def test_cli_exclude_first_positions_reaches_the_certificate(tiny_env, tmp_path):
    import tl_query_lens as tq
    from tl_query_lens import FFKV

    out = tmp_path / "cert"
    assert main(_certify_argv(out, "--exclude-first-positions", "2")) == 0
    saved = json.loads((out / result_name("ffkv L2") / "result.json").read_text())["fields"]
    assert saved["config"]["exclude_first_positions"] == 2 and saved["config"]["predictions_per_window"] == 5
    assert json.loads((out / "config.json").read_text())["protocol"]["exclude_first_positions"] == 2
    cal, ev = tiny_tokens(tiny_env, 4, 8, seed=1), tiny_tokens(tiny_env, 24, 8, seed=2)
    api = tq.certify(tiny_env, FFKV.from_model(tiny_env, 2, "vanilla"), cal, ev, k=5, exclude_first_positions=2)
    full = tq.certify(tiny_env, FFKV.from_model(tiny_env, 2, "vanilla"), cal, ev, k=5)
    assert saved["bound"] == pytest.approx(api.bound, abs=1e-6) and saved["N"] == 24
    assert saved["eps_hat"] == pytest.approx(api.eps_hat, abs=1e-6) and saved["eps_hat"] != pytest.approx(full.eps_hat)


def test_cli_paper_protocol_gets_exclude_first_positions(tiny_env, tmp_path, monkeypatch):
    import importlib

    protocol = importlib.import_module("tl_query_lens.certify.protocol")
    seen = {}

    class Stop(Exception):
        pass

    def capture(model, saes, corpus, *, cfg):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(protocol, "certify_protocol", capture)
    with pytest.raises(Stop):
        main(_certify_argv(tmp_path, "--protocol", "paper", "--exclude-first-positions", "1"))
    assert seen["cfg"].protocol == "paper" and seen["cfg"].exclude_first_positions == 1


def test_cli_exclude_first_positions_beyond_the_window_names_the_fix(tiny_env, tmp_path, capsys):
    assert main(_certify_argv(tmp_path, "--exclude-first-positions", "7")) == 2
    err = capsys.readouterr().err
    assert "exclude_first_positions=7 leaves no position of the 8-token windows to score" in err
    assert "longer windows" in err and "Traceback" not in err


def test_cli_estimate_comes_first_and_counts_the_passes_run(tiny_env, tmp_path, monkeypatch, caplog):
    """The one-line estimate is logged right after the run's own first batch (timed, no extra batch) and before the
    second, and the forward batches it scales by equal the passes the run makes, counted here by wrapping the model's
    ``run_with_cache`` (calibration and clean passes) and the proxy forward."""
    import importlib
    import re

    losses = importlib.import_module("tl_query_lens.certify.losses")

    passes: dict = {"n": 0, "estimated_at": []}

    def counting(fn, proxy_only=False):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            passes["estimated_at"].append(any("estimated wall time" in r.getMessage() for r in caplog.records))
            if not (proxy_only and "rows" in kwargs):  # a restricted re-run of a few rows is not a batch
                passes["n"] += 1
            return out

        return wrapped

    monkeypatch.setattr(tiny_env, "run_with_cache", counting(tiny_env.run_with_cache))
    monkeypatch.setattr(losses, "run_from_residual", counting(losses.run_from_residual, proxy_only=True))
    argv = ["certify", "--layers", "0,2", "--n-cal", "5", "--n-eval", "20", "--seq-len", "8", "--k", "5"]
    argv += ["--batch-size", "3", "--shuffle", "--no-wandb", "--out", str(tmp_path / "cert")]
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    line = next(r.getMessage() for r in caplog.records if "estimated wall time" in r.getMessage())
    assert passes["estimated_at"][:2] == [False, True]  # timed on the first batch, logged as the second runs
    assert int(re.search(r"\((\d+) forward batches", line).group(1)) == passes["n"]
    assert passes["n"] == 2 + 7 * (1 + 4)  # ceil(5/3) calibration, ceil(20/3) x (clean + 2 real + 2 shuffled)
    assert "--n-eval" in line
