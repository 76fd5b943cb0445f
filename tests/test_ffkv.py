import pytest
import torch
from sae_lens import SAE

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, FFKVSAE, as_key_value
from tl_query_lens.dictionaries.splice import splice_metrics


@pytest.mark.parametrize("variant", ["vanilla", "normalized"])
def test_dense_splice_reproduces_clean_logits(style, variant):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    clean = model(tokens)
    for layer in range(model.cfg.n_layers):
        sae = FFKV.from_model(model, layer, variant)
        spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
        assert (spliced - clean).abs().max().item() < 1e-4


def test_activations_equal_mlp_hook_post(style):
    """FF-KV activations are the MLP's own hidden activations (independent reference: the TL cache)."""
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    sae = FFKV.from_model(model, 1)
    _, cache = model.run_with_cache(tokens)
    acts = sae.encode(cache[sae.cfg.metadata.hook_name])
    torch.testing.assert_close(acts, cache["blocks.1.mlp.hook_post"], atol=1e-5, rtol=1e-5)


def test_normalized_has_unit_values_and_scaled_acts(style):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    plain, normed = FFKV.from_model(model, 0), FFKV.from_model(model, 0, "normalized")
    torch.testing.assert_close(normed.W_dec.norm(dim=1), torch.ones(model.cfg.d_mlp))
    _, cache = model.run_with_cache(tokens)
    x = cache[plain.cfg.metadata.hook_name]
    norms = model.blocks[0].mlp.W_out.norm(dim=1)
    torch.testing.assert_close(normed.encode(x), plain.encode(x) * norms, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("topk_by", ["magnitude", "value"])
def test_topk_keeps_k(style, topk_by):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    sae = FFKV.from_model(model, 2, "topk", k=5, topk_by=topk_by)
    _, cache = model.run_with_cache(tokens)
    dense = FFKV.from_model(model, 2).encode(cache[sae.cfg.metadata.hook_name])
    acts = sae.encode(cache[sae.cfg.metadata.hook_name])
    assert ((acts != 0).sum(-1) <= 5).all()
    score = dense.abs() if topk_by == "magnitude" else dense
    kth = score.topk(5, dim=-1).values[..., -1:]
    kept = acts != 0
    assert torch.equal(acts[kept], dense[kept])  # kept values are unchanged
    assert (score[kept] >= kth.expand_as(score)[kept] - 1e-6).all()
    metrics = splice_metrics(model, sae, tokens)
    assert metrics.mean_l0 <= 5 and 0 < metrics.alive_rate <= 1
    assert metrics.explained_variance < 1.0  # TopK-5 of 64 cannot be exact


def test_vanilla_splice_metrics_are_exact(style):
    model = tiny_model(style)
    m = splice_metrics(model, FFKV.from_model(model, 1), tiny_tokens(model))
    assert m.explained_variance == pytest.approx(1.0, abs=1e-5)
    assert abs(m.ce_delta) < 1e-5 and m.kl < 1e-6


@pytest.mark.parametrize("variant,k", [("vanilla", None), ("topk", 7), ("normalized", None)])
def test_save_load_round_trip(tmp_path, style, variant, k):
    model = tiny_model(style)
    sae = FFKV.from_model(model, 1, variant, k=k)
    sae.save_model(tmp_path / "sae")
    loaded = SAE.load_from_disk(tmp_path / "sae")
    assert isinstance(loaded, FFKVSAE)
    assert loaded.cfg.to_dict() == sae.cfg.to_dict()
    for name, tensor in sae.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    tokens = tiny_tokens(model)
    assert torch.equal(model.run_with_saes(tokens, saes=[loaded]), model.run_with_saes(tokens, saes=[sae]))


def test_key_value_view_of_ffkv(style):
    model = tiny_model(style)
    sae = FFKV.from_model(model, 2)
    view = as_key_value(sae, model)
    assert view.read_hook.endswith("ln2.hook_normalized") and view.write_hook == "blocks.2.hook_mlp_out"
    assert view.value_hook == "blocks.2.hook_resid_post" and view.layer == 2
    torch.testing.assert_close(view.values, model.blocks[2].mlp.W_out)


def test_bad_input():
    model = tiny_model("gelu_ln")
    with pytest.raises(IndexError, match="layers 0..2"):
        FFKV.from_model(model, 3)
    with pytest.raises(ValueError, match="needs k"):
        FFKV.from_model(model, 0, "topk")
    with pytest.raises(ValueError, match="k must be in"):
        FFKV.from_model(model, 0, "topk", k=10_000)


@pytest.mark.slow
def test_embedded_dense_splice_exact(embedded_model):
    tokens = torch.tensor([[504, 3575, 282, 4649, 314, 253, 1345, 28, 357]])
    clean = embedded_model(tokens)
    for layer in (0, 15, 29):
        for variant in ("vanilla", "normalized"):
            sae = FFKV.from_model(embedded_model, layer, variant)
            spliced = embedded_model.run_with_saes(tokens, saes=[sae], use_error_term=False)
            assert (spliced - clean).abs().max().item() < 1e-4, (layer, variant)
