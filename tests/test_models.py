from pathlib import Path

import pytest
import torch

from tl_query_lens import load_model
from tl_query_lens.errors import CorruptFileError
from tl_query_lens.models import embedded_gguf_path

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return", "Sparse autoencoders decompose activations"]


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(RuntimeError, match="embedded model"):
        load_model("definitely-not-a-model-name-xyz", device="cpu")


def test_embedded_weights_are_shipped():
    path = embedded_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_embedded_logits_match_transformers(embedded_model):
    """Independent reference: the transformers model dequantised from the same GGUF."""
    from tl_query_lens.models import load_hf_from_gguf

    hf_model, tokenizer = load_hf_from_gguf()
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf_model(ids).logits
            ours = embedded_model(ids)
        assert (ours - ref).abs().max().item() < 1e-4, prompt
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    assert tokenizer.decode(embedded_model(ids)[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_embedded_model_is_a_hooked_sae_transformer(embedded_model):
    from sae_lens import HookedSAETransformer

    assert isinstance(embedded_model, HookedSAETransformer)
    assert embedded_model.cfg.n_layers == 30 and embedded_model.cfg.d_vocab == 49152
    assert "blocks.29.hook_resid_post" in embedded_model.hook_dict


def _fake_conversion(monkeypatch, tmp_path):
    """Stand-ins for the ~30 s GGUF conversion: the cache logic is under test, not the weights."""
    from types import SimpleNamespace

    from tl_query_lens import models

    class Tokenizer:
        def save_pretrained(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "tokenizer.json").write_text("{}")

    hf = SimpleNamespace(config=SimpleNamespace(rms_norm_eps=1e-5))
    monkeypatch.setattr(models, "load_hf_from_gguf", lambda name: (hf, Tokenizer()))
    monkeypatch.setattr(models, "convert_llama_weights", lambda hf_model, cfg: {"w": torch.zeros(2)})
    monkeypatch.setattr(models, "embedded_gguf_path", lambda name: tmp_path / "model.gguf")
    return models


def test_two_processes_converting_the_embedded_model_at_once_keep_one_copy(monkeypatch, tmp_path):
    """Two torchrun ranks on a fresh machine both convert; the one that stores second must not fail."""
    models = _fake_conversion(monkeypatch, tmp_path)
    target = tmp_path / "smollm2-135m-v1"
    models._build_embedded_cache("smollm2-135m", target)  # the other rank, first
    models._build_embedded_cache("smollm2-135m", target)  # this rank, second: its replace meets a full folder
    assert (target / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-v1"]  # no temporary folder left behind


def test_an_incomplete_embedded_cache_folder_is_not_taken_for_a_conversion(monkeypatch, tmp_path):
    models = _fake_conversion(monkeypatch, tmp_path)
    target = tmp_path / "smollm2-135m-v1"
    target.mkdir()
    (target / "stray").write_text("")
    with pytest.raises(CorruptFileError, match=r"smollm2-135m-v1: .*Delete that folder"):
        models._build_embedded_cache("smollm2-135m", target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-v1"]  # the conversion is not left behind
