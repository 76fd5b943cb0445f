"""The engine's feature basis: the requested value directions pushed forward (key directions pulled back) directly
equal the full operator applied to them, on every basis choice; the choice, its cache and the memory budget."""

import pytest
import torch

from tests.helpers import arch_model, tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens
from tl_query_lens.operators import engine, key_operators, module_operators, value_operators


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("arch", ["gpt2", "pythia", "llama"])
def test_engine_feature_basis_equals_full_operator(arch):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    gen = torch.Generator().manual_seed(1)
    V = torch.randn(5, model.cfg.d_model, generator=gen)
    hook, read = "blocks.0.hook_resid_post", "blocks.1.ln2.hook_normalized"
    full_value = value_operators(model, tokens, [hook], skip_positions=1, progress=False)[hook]
    pushed = value_operators(model, tokens, [hook], basis=V, skip_positions=1, progress=False)[hook]
    assert pushed.shape == (model.cfg.d_model, 5) and rel(pushed, full_value @ V.T) < 1e-5
    full_key = key_operators(model, tokens, [read], skip_positions=1, progress=False)[read]
    pulled = key_operators(model, tokens, [read], basis=V, skip_positions=1, progress=False)[read]
    assert pulled.shape == (5, model.cfg.d_model) and rel(pulled, V @ full_key) < 1e-5
    full_modules = module_operators(model, tokens, [1, 2], progress=False)
    pushed_modules = module_operators(model, tokens, [1, 2], basis=V, progress=False)
    for name in full_modules:
        assert rel(pushed_modules[name], full_modules[name] @ V.T) < 1e-5, name


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_query_lens_equal_on_every_basis_choice(arch):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    sae = FFKV.from_model(model, 0)
    features = [1, 4, 9]
    lenses = {b: QueryLens(model, tokens, basis=b, progress=False) for b in ("identity", "features", "auto")}
    for method in ("full", "first_order"):  # Gemma-2 FF-KV: pushed from mlp.hook_post (through ln2_post)
        ref = lenses["identity"].value_directions(sae, features, method=method)
        for basis in ("features", "auto"):
            assert rel(lenses[basis].value_directions(sae, features, method=method), ref) < 1e-5, (method, basis)
    ref = lenses["identity"].key_gradients(sae, features)
    for basis in ("features", "auto"):
        assert rel(lenses[basis].key_gradients(sae, features), ref) < 1e-5, basis


def test_auto_choice_cache_and_override(monkeypatch):
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    sae = FFKV.from_model(model, 0)  # d_sae = 64 > d_model = 32
    lens = QueryLens(model, tokens, progress=False)
    hook = "blocks.0.hook_resid_post"
    lens.value_signatures(sae, [0, 1, 2], k=3)  # 3 < 32: feature basis, no full operator
    assert hook not in lens._value and len(lens._pushed) == 1
    real = engine._run_sweep

    def boom(*args, **kwargs):
        raise AssertionError("the engine ran again")

    monkeypatch.setattr(engine, "_run_sweep", boom)
    lens.value_signatures(sae, [0, 1, 2], k=3)  # the same feature set: cached
    monkeypatch.setattr(engine, "_run_sweep", real)
    lens.value_signatures(sae, None, k=3)  # 64 ≥ 32 features: the full operator, kept
    assert hook in lens._value
    monkeypatch.setattr(engine, "_run_sweep", boom)
    lens.value_signatures(sae, [5, 6], k=3)  # auto reuses the held full operator
    with pytest.raises(AssertionError, match="ran again"):
        lens.value_signatures(sae, [5, 6], k=3, basis="features")  # the override forces the feature basis
    with pytest.raises(ValueError, match="basis must be"):
        QueryLens(model, tokens, basis="diagonal")


def test_feature_basis_files_are_cached_per_feature_set(tmp_path):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    V = torch.randn(3, model.cfg.d_model)
    hook = "blocks.1.hook_resid_post"
    for basis in (None, V, V[:2]):
        value_operators(model, tokens, [hook], basis=basis, cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("value-*.safetensors"))) == 3
    again = value_operators(model, tokens, [hook], basis=V, cache_dir=tmp_path, progress=False)
    assert again.extra["basis"] == engine.basis_fingerprint(V) and again[hook].shape == (model.cfg.d_model, 3)
    with pytest.raises(ValueError, match="basis must be"):
        value_operators(model, tokens, [hook], basis=torch.randn(3, 5), progress=False)


def test_max_memory_gb_chooses_the_chunk():
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    widths = engine._widths(model, ["blocks.0.hook_resid_post", engine.final_hook(model)])
    sweep = [
        engine._Sweep(
            "reverse",
            {"blocks.0.hook_resid_post": False},
            [engine.final_hook(model)],
            {"blocks.0.hook_resid_post": "x"},
        )
    ]
    small = engine.chunk_for_memory(model, sweep, widths, 2, 6, 0.0003)
    large = engine.chunk_for_memory(model, sweep, widths, 2, 6, 1.0)
    assert 1 <= small < large == model.cfg.d_model  # capped at the basis size
    with pytest.raises(ValueError, match="too small"):
        engine.chunk_for_memory(model, sweep, widths, 2, 6, 1e-7)
    hook = "blocks.0.hook_resid_post"
    budgeted = value_operators(model, tokens, [hook], max_memory_gb=0.0003, progress=False)
    assert budgeted.extra["chunk"] == small
    assert rel(budgeted[hook], value_operators(model, tokens, [hook], progress=False)[hook]) < 1e-6
