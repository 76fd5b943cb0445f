"""Faithfulness matching (identical → 1, rotated → null level) and the comparison on tiny random models."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.dictionaries import FFKV, KeyValueView
from tl_query_lens.dictionaries.compare import (
    DictionaryComparison,
    compare_dictionaries,
    dictionary_kind,
    random_model_like,
)
from tl_query_lens.dictionaries.faithfulness import random_rotation, transcoder_faithfulness


def _view(keys: torch.Tensor, values: torch.Tensor) -> KeyValueView:
    return KeyValueView(
        keys=keys,
        values=values,
        b_enc=torch.zeros(len(keys)),
        b_dec=torch.zeros(values.shape[1]),
        activation="relu",
        read_hook="blocks.0.ln2.hook_normalized",
        write_hook="blocks.0.hook_mlp_out",
    )


def _ff(d: int = 24, n: int = 400, seed: int = 0) -> KeyValueView:
    gen = torch.Generator().manual_seed(seed)
    return _view(torch.randn(n, d, generator=gen), torch.randn(n, d, generator=gen))


def test_identical_directions_match_every_feature():
    ff = _ff()
    scaled = _view(-3.0 * ff.keys[:150], 0.5 * ff.values[:150])  # sign and scale do not matter
    result = transcoder_faithfulness(scaled, ff)
    assert result.share_matched == result.share_matched_same == 1.0
    assert result.mean_max_cos_enc == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(result.best_neuron_enc, torch.arange(150))


def test_rotated_directions_sit_at_the_null_level():
    ff = _ff(n=400)
    gen = torch.Generator().manual_seed(7)
    rot = random_rotation(24, gen).float()
    tc = _view(ff.keys @ rot, ff.values @ rot)  # same geometry, no alignment with the FF basis
    result = transcoder_faithfulness(tc, ff, quantile=0.95, n_rotations=8)
    # each side exceeds its null 95% quantile for ~5% of features (binomial sd over 400 features ≈ 1.1%)
    assert result.share_matched_enc == pytest.approx(0.05, abs=0.035)
    assert result.share_matched_dec == pytest.approx(0.05, abs=0.035)
    assert result.share_matched <= 0.02
    assert result.null_share_matched <= 0.01


def test_half_copied_half_random_matches_half():
    ff = _ff(n=400)
    gen = torch.Generator().manual_seed(3)
    keys = torch.cat([ff.keys[:100], torch.randn(100, 24, generator=gen)])
    values = torch.cat([ff.values[:100], torch.randn(100, 24, generator=gen)])
    result = transcoder_faithfulness(_view(keys, values), ff)
    assert 0.5 <= result.share_matched <= 0.52


def test_width_mismatch_names_the_fix():
    with pytest.raises(ValueError, match="same layer's MLP"):
        transcoder_faithfulness(_view(torch.randn(5, 8), torch.randn(5, 8)), _ff())


def test_random_model_keeps_config_and_global_rng(style):
    model = tiny_model(style)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = random_model_like(model, seed=5)
    assert torch.equal(torch.rand(3), expected)
    b = random_model_like(model, seed=5)
    assert a.cfg.to_dict() == {**model.cfg.to_dict(), "seed": None, "init_weights": True}
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.blocks[0].mlp.W_in, model.blocks[0].mlp.W_in)


def test_compare_on_tiny_models_saves_and_loads(style, tmp_path):
    model = tiny_model(style)
    tokens = tiny_tokens(model, n_seqs=4, seq_len=10)
    dictionaries = {
        "FF-KV L1": FFKV.from_model(model, 1, "vanilla"),
        "FF-KV TopK-8 L1": FFKV.from_model(model, 1, "topk", k=8),
        "TC L1": FFKV.from_model(model, 1, "normalized"),  # a "transcoder" with the MLP's own directions
    }
    result = compare_dictionaries(model, dictionaries, tokens, absorption=None)
    by_label = {r["label"]: r for r in result.rows}
    assert by_label["FF-KV L1"]["explained_variance"] == pytest.approx(1.0, abs=1e-4)
    assert by_label["FF-KV TopK-8 L1"]["mean_l0"] == pytest.approx(8.0)
    assert by_label["random FF-KV topk8 L1"]["model"] == "random"
    assert by_label["random FF-KV vanilla L1"]["explained_variance"] == pytest.approx(1.0, abs=1e-4)
    assert dictionary_kind(dictionaries["FF-KV TopK-8 L1"]) == "ffkv:topk8"
    faith = {f["label"]: f for f in result.faithfulness}
    assert set(faith) == {"random FF-KV vanilla L1"}  # FF-KV rows are not transcoders
    loaded = DictionaryComparison.load(result.save(tmp_path / "cmp"))
    assert loaded.rows == result.rows and loaded.faithfulness == result.faithfulness


def test_saes_compare_command_on_a_tiny_model(monkeypatch, tmp_path):
    """`tlql saes compare` with a saved SAELens Transcoder: one table, FF-KV variants, the random control."""
    import csv

    from sae_lens import Transcoder, TranscoderConfig
    from sae_lens.saes.sae import SAEMetadata

    from tl_query_lens.cli import main

    model = tiny_model("gated_rms")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", lambda *a, **k: tiny_tokens(model, n_seqs=3, seq_len=8))
    torch.manual_seed(0)
    tc = Transcoder(
        TranscoderConfig(
            d_in=32,
            d_sae=48,
            d_out=32,
            dtype="float32",
            device="cpu",
            apply_b_dec_to_input=False,
            metadata=SAEMetadata(hook_name="blocks.1.ln2.hook_normalized", hook_name_out="blocks.1.hook_mlp_out"),
        )
    )
    with torch.no_grad():
        for p in tc.parameters():
            p.normal_(0, 0.3)
    tc.save_model(tmp_path / "tc1")
    out = tmp_path / "cmp"
    argv = [
        "saes",
        "compare",
        "--layers",
        "1",
        "--release",
        "",
        "--dictionaries",
        str(tmp_path / "tc1"),
        "--k",
        "4",
        "--no-absorption",
        "--no-wandb",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "saes_compare_comparison.csv").open()))
    assert [r["label"] for r in rows] == [
        "FF-KV vanilla L1",
        "FF-KV TopK-4 L1",
        "FF-KV normalized L1",
        "transcoder L1 tc1",
        "random FF-KV vanilla L1",
        "random FF-KV topk4 L1",
    ]
    assert [r["kind"] for r in rows][3] == "transcoder"
    faith = [r["label"] for r in csv.DictReader((out / "saes_compare_faithfulness.csv").open())]
    assert faith == ["transcoder L1 tc1", "random FF-KV vanilla L1"]
    assert DictionaryComparison.load(out).rows[1]["mean_l0"] == pytest.approx(4.0)
