"""``tlql readout fit | decompose | eval`` through the one runner, on a tiny model: what ``--preset`` gives, and each
command's result against the library's own functions called directly."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import build_parser, main, subcommands
from tl_query_lens.readout.commands import ReadoutDecomposition, ReadoutEvalRun
from tl_query_lens.readout.decompose import decompose, margin
from tl_query_lens.readout.fit import ReadoutFitConfig
from tl_query_lens.readout.states import logit_lens

FIT = ["--width", "64", "--k", "4", "--steps", "3", "--batch-rows", "32", "--batch-pairs", "16", "--log-every", "3"]


def fit_config(argv: list[str]) -> ReadoutFitConfig:
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS

    command = next(c for c in COMMANDS if c.name == "readout fit")
    parser = subcommands(subcommands(build_parser())["readout"])["fit"]
    return config_of(command, parser.parse_args(argv)).fit


def test_preset_gives_its_values_and_options_given_win_even_at_the_default():
    """Reference: ReadoutFitConfig.preset, the method's own preset."""
    assert fit_config([]) == ReadoutFitConfig.preset("small")
    assert fit_config(["--preset", "paper"]) == ReadoutFitConfig.preset("paper")
    # --k 128 is the small preset's value: given explicitly it still overrides the paper preset's 256
    assert fit_config(["--preset", "paper", "--k", "128"]) == ReadoutFitConfig.preset("paper", k=128)
    assert fit_config(["--k", "64"]) == ReadoutFitConfig.preset("small", k=64)


@pytest.fixture
def tiny(monkeypatch):
    model = tiny_model("gelu_ln")

    def to_tokens(text, prepend_bos=True, **kwargs):  # one id per word, no tokenizer needed
        ids = [5 + sum(map(ord, word)) % 50 for word in str(text).split()]
        return torch.tensor([[0] * bool(prepend_bos) + ids])

    monkeypatch.setattr(model, "to_tokens", to_tokens)
    monkeypatch.setattr(model, "tokenizer", SimpleNamespace(padding_side="right", decode=lambda ids: f"t{ids[0]}"))
    monkeypatch.setattr(model, "to_string", lambda ids: " ".join(f"t{i}" for i in ids))
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    corpus = lambda src, tok, n_seqs, seq_len, split, seed=0: tiny_tokens(model, n_seqs, seq_len, seed=3)
    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", corpus)
    monkeypatch.setattr("tl_query_lens.readout.fit.load_corpus", corpus)
    return model


def test_fit_then_decompose_then_eval(tiny, tmp_path, capsys):
    sae_dir, out = tmp_path / "sae", tmp_path / "out"
    argv = ["readout", "fit", *FIT, "--n-seqs", "4", "--seq-len", "10", "--save", str(sae_dir), "--no-wandb"]
    assert main([*argv, "--out", str(out / "fit")]) == 0
    assert (sae_dir / "cfg.json").is_file() and (out / "fit" / "sae" / "cfg.json").is_file()
    history = list(csv.DictReader((out / "fit" / "readout_fit_history.csv").open()))
    assert [float(r["step"]) for r in history] == [3.0]
    assert f"Readout SAE saved to {sae_dir}" in capsys.readouterr().out

    argv = ["readout", "decompose", "the cat sat", "--sae-path", str(sae_dir), "--margin", " dog", " cat"]
    assert main([*argv, "--no-wandb", "--out", str(out / "dec")]) == 0
    saved = ReadoutDecomposition.load(out / "dec")
    from tl_query_lens.sources import load_dictionary

    sae = load_dictionary(str(sae_dir))  # reference: the API on the same state and score
    hook = f"blocks.{tiny.cfg.n_layers - 1}.hook_resid_post"
    _, cache = tiny.run_with_cache("the cat sat", names_filter=[hook])
    h = logit_lens(tiny)(cache[hook][0, -1]).float()
    alpha = margin(
        int(tiny.to_tokens(" dog", prepend_bos=False)[0, 0]), int(tiny.to_tokens(" cat", False)[0, 0]), tiny.cfg.d_vocab
    )
    want = decompose(sae, h, alpha, model=tiny)
    for name in ("exact", "bias", "residual", "contributions"):
        torch.testing.assert_close(getattr(saved, name), getattr(want, name))
    assert f"margin ' dog' − ' cat' at {hook}[-1]: exact" in capsys.readouterr().out

    argv = ["readout", "eval", "--sae-path", str(sae_dir), "--baselines", "", "--ablation-states", "0"]
    assert (
        main([*argv, "--n-boot", "10", "--n-seqs", "3", "--seq-len", "8", "--no-wandb", "--out", str(out / "ev")]) == 0
    )
    rows = list(csv.DictReader((out / "ev" / "readout_eval_readout_vs_baselines.csv").open()))
    assert [r["method"] for r in rows] == ["srp"]
    record = json.loads((out / "ev" / "protocol_mixed_layers" / "result.json").read_text())
    assert record["type"] == "ReadoutReport"
    loaded = ReadoutEvalRun.load(out / "ev")
    assert loaded.paper is None and [r["method"] for r in loaded.tables()["readout_vs_baselines"].records()] == ["srp"]
    assert capsys.readouterr().out.count(f"Readout SAE {sae_dir}: folder") == 1


def test_eval_baselines_option_is_the_commands_not_the_protocols():
    """``--baselines`` is one comma list checked against the protocol chosen; the nested configs keep their own
    defaults until the run picks one. Reference: the protocol configs' defaults."""
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS
    from tl_query_lens.readout.evaluate import ReadoutEvalConfig
    from tl_query_lens.readout.protocols.paper import PaperReadoutConfig

    command = next(c for c in COMMANDS if c.name == "readout eval")
    parser = subcommands(subcommands(build_parser())["readout"])["eval"]
    cfg = config_of(command, parser.parse_args(["--baselines", "pca256", "--n-boot", "5"]))
    assert cfg.baselines == "pca256" and cfg.readout.n_boot == 5
    assert (
        cfg.readout.baselines == ReadoutEvalConfig().baselines and cfg.paper.baselines == PaperReadoutConfig().baselines
    )
