"""QueryLens: engine signatures vs the independent per-feature reference, decompositions, results, bad input."""

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens, query_lens_reference
from tl_query_lens.query_lens import Signatures, downstream_modules

FEATURES = [0, 17]
CASES = [("value", "full"), ("value", "first_order"), ("key", "full")]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def standard_sae(model, hook: str) -> StandardSAE:
    torch.manual_seed(3)
    sae = StandardSAE(StandardSAEConfig(d_in=model.cfg.d_model, d_sae=24, metadata=SAEMetadata(hook_name=hook)))
    with torch.no_grad():
        for param in sae.parameters():
            param.normal_(0, 0.3)
    return sae


def dictionaries(model):
    return {
        "ffkv": FFKV.from_model(model, 0),
        "sae_resid_post": standard_sae(model, "blocks.1.hook_resid_post"),
        "sae_resid_pre": standard_sae(model, "blocks.1.hook_resid_pre"),
    }


@pytest.mark.parametrize("name", ["ffkv", "sae_resid_post", "sae_resid_pre"])
def test_engine_matches_per_feature_reference(style, name):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    dictionary = dictionaries(model)[name]
    lens = QueryLens(model, tokens, skip_positions=1, progress=False)
    for side, method in CASES:
        call = lens.value_signatures if side == "value" else lens.key_signatures
        sig = call(dictionary, FEATURES, k=7, method=method)
        assert sig.top_ids.shape == (len(FEATURES), 7)
        for i, feature in enumerate(FEATURES):
            ref = query_lens_reference(model, tokens, dictionary, feature, side, method=method, skip_positions=1)
            assert rel_err(sig.scores(i), ref) < 1e-4, (side, method, feature)
            assert torch.allclose(sig.top_scores[i], ref.topk(7).values, rtol=1e-4, atol=1e-5)
            assert torch.allclose(sig.bottom_scores[i], ref.topk(7, largest=False).values, rtol=1e-4, atol=1e-5)


def test_logit_lens_baselines(style):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    sae = FFKV.from_model(model, 1)
    lens = QueryLens(model, tokens, progress=False)
    value = lens.value_signatures(sae, [2, 3], k=4, method="logit_lens")
    v = sae.W_dec[3].detach()
    expected = model.ln_final(v[None, None])[0, 0] @ model.W_U  # W_U·LN_f(v), no b_U
    assert rel_err(value.scores(1), expected) < 1e-5
    key = lens.key_signatures(sae, [3], k=4, method="logit_lens")
    assert rel_err(key.scores(0), model.W_E @ sae.W_enc[:, 3].detach()) < 1e-5  # E·k raw


def test_first_order_contributions_sum_to_the_signature(style):
    """Per-module contributions (logit units over the top-k) add up to the first-order top-k scores minus W_U·b."""
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    sae = FFKV.from_model(model, 0)
    sig = QueryLens(model, tokens, progress=False).value_signatures(sae, FEATURES, k=5, method="first_order")
    assert sig.module_names == ["direct", *downstream_modules("blocks.0.hook_resid_post", 3)]
    assert sig.module_shares.shape == (len(FEATURES), 5)
    norm_bias = model.ln_final(torch.zeros(1, 1, model.cfg.d_model))[0, 0] @ model.W_U  # LN_f(0) = b
    for i in range(len(FEATURES)):
        feature_part = (sig.top_scores[i] - norm_bias[sig.top_ids[i]]).sum()
        assert torch.allclose(sig.module_contributions[i].sum(), feature_part.detach(), rtol=1e-4, atol=1e-5)
    assert torch.allclose(sig.module_shares.sum(1), torch.ones(len(FEATURES)), atol=1e-5)


def test_downstream_modules():
    assert downstream_modules("blocks.1.hook_resid_post", 3) == ["blocks.2.attn", "blocks.2.mlp"]
    assert downstream_modules("blocks.2.hook_resid_mid", 3) == ["blocks.2.mlp"]
    assert downstream_modules("blocks.2.hook_resid_pre", 3) == ["blocks.2.attn", "blocks.2.mlp"]
    with pytest.raises(ValueError, match="residual hooks"):
        downstream_modules("blocks.1.hook_mlp_out", 3)


def test_result_save_load_table_and_streaming(tmp_path):
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model)
    sae = FFKV.from_model(model, 1)
    lens = QueryLens(model, tokens, progress=False, feature_chunk=5)  # several feature chunks
    sig = lens.key_signatures(sae, k=3)
    assert len(sig) == sae.cfg.d_sae and torch.equal(sig.feature_ids, torch.arange(sae.cfg.d_sae))
    for i in (0, 7, len(sig) - 1):
        full = sig.scores(i)
        assert full.shape == (model.cfg.d_vocab,)
        assert torch.equal(sig.top_ids[i], full.topk(3).indices.cpu())
    sig.save(tmp_path / "sig")
    loaded = Signatures.load(tmp_path / "sig")
    assert torch.equal(loaded.top_ids, sig.top_ids) and loaded.method == "full" and loaded.readout == "embed_centred"
    with pytest.raises(RuntimeError, match="attach"):
        loaded.scores(0)
    assert torch.allclose(loaded.attach(model).scores(4), sig.scores(4))
    with pytest.raises(IndexError, match="position in feature_ids"):
        sig.scores(len(sig))
    columns, rows = sig.to_table(2)
    assert columns[0] == "feature" and len(rows) == len(sig) and len(rows[0]) == len(columns)


def test_bad_input_is_rejected():
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)
    lens = QueryLens(model, tokens, progress=False)
    sae = FFKV.from_model(model, 0)
    with pytest.raises(IndexError, match="out of range"):
        lens.value_signatures(sae, [0, sae.cfg.d_sae])
    with pytest.raises(KeyError, match="Unknown hook"):
        lens.key_signatures(standard_sae(model, "blocks.7.hook_resid_post"), [0])
    with pytest.raises(ValueError, match="another tokenizer"):
        QueryLens(model, torch.full((2, 4), model.cfg.d_vocab + 100))
    with pytest.raises(ValueError, match="method"):
        lens.value_signatures(sae, [0], method="fast")
    with pytest.raises(ValueError, match="k must be"):
        lens.key_signatures(sae, [0], k=0)
    with torch.no_grad():
        model.blocks[2].attn.W_O[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        QueryLens(model, tokens, progress=False).value_signatures(sae, [0])


@pytest.mark.slow
@pytest.mark.parametrize("side, method", CASES)
def test_embedded_model_matches_reference(embedded_model, side, method):
    """≥ 20 FF-KV features over 3 layers of SmolLM2-135M, on a 2×8-token corpus (one slow test per case)."""
    from tl_query_lens import load_corpus

    model = embedded_model
    tokens = load_corpus("embedded", model, n_seqs=2, seq_len=8, split="train")
    lens = QueryLens(model, tokens, progress=False)
    layers = [3, 15, 27]
    gen = torch.Generator().manual_seed(0)
    n_checked = 0
    for layer in layers:
        sae = FFKV.from_model(model, layer)
        features = torch.randperm(sae.cfg.d_sae, generator=gen)[:7].tolist()
        call = lens.value_signatures if side == "value" else lens.key_signatures
        sig = call(sae, features, k=25, method=method)
        for i, feature in enumerate(features):
            ref = query_lens_reference(model, tokens, sae, feature, side, method=method)
            assert rel_err(sig.scores(i), ref) < 1e-4, (layer, feature)
            n_checked += 1
    assert n_checked >= 20
