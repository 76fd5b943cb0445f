"""``tlql query-lens`` end to end on a tiny model (the loaders are swapped for offline tiny ones)."""

import csv

import pytest

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import main
from tl_query_lens.query_lens import Signatures


@pytest.fixture
def tiny_loaders(monkeypatch):
    model = tiny_model("gated_rms")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus", lambda *a, n_seqs, seq_len, **kw: tiny_tokens(model, n_seqs, seq_len)
    )
    return model


@pytest.mark.parametrize("method", ["full", "first_order"])
def test_query_lens_command(tmp_path, tiny_loaders, method):
    out = tmp_path / "ql"
    argv = [
        "query-lens",
        "--layers",
        "0,2",
        "--features",
        "0-4,9",
        "--k",
        "3",
        "--n-seqs",
        "2",
        "--seq-len",
        "8",
        "--method",
        method,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    for layer in (0, 2):
        for side in ("value", "key"):
            sig = Signatures.load(out / f"layer{layer}_{side}")
            assert sig.feature_ids.tolist() == [0, 1, 2, 3, 4, 9] and sig.top_ids.shape == (6, 3)
            rows = list(csv.DictReader((out / f"signatures_layer{layer}_{side}.csv").open()))
            assert [int(r["feature"]) for r in rows] == [0, 1, 2, 3, 4, 9]
    assert Signatures.load(out / "layer0_value").method == method
    assert list((out / "wandb").glob("offline-run-*"))


def test_query_lens_command_rejects_bad_features_before_any_operator(tmp_path, tiny_loaders, monkeypatch, capsys):
    from tl_query_lens.query_lens import QueryLens

    def no_operators(*args, **kwargs):
        raise AssertionError("operators computed before the features were checked")

    monkeypatch.setattr(QueryLens, "precompute", no_operators)
    assert main(["query-lens", "--layers", "1", "--features", "0,64", "--no-wandb", "--out", str(tmp_path)]) == 2
    assert "--features 64 out of range; valid: 0..63" in capsys.readouterr().err


def test_ql_evaluate_features_option_is_the_runs_and_all_is_accepted():
    """``--features`` is the run's id list ('all' included); the run, not the option, sets Table1Config.features
    (against each dictionary's width) and the prompts (from --n-prompts). Reference: the configs' own defaults."""
    from tl_query_lens.cli import build_parser, subcommands
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS
    from tl_query_lens.query_lens.table1 import Table1Config

    command = next(c for c in COMMANDS if c.name == "ql-evaluate")
    parser = subcommands(build_parser())["ql-evaluate"]
    for features in ("all", "0-4,9"):
        cfg = config_of(command, parser.parse_args(["--features", features, "--n-prompts", "2", "--k", "7"]))
        assert cfg.run.features == features and cfg.n_prompts == 2 and cfg.table1.k == 7
        assert (cfg.table1.features, cfg.table1.prompts) == (Table1Config().features, Table1Config().prompts)
    assert "--prompts" not in parser.format_help()
