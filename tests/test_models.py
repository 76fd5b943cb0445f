import pytest
import torch

from tl_query_lens import load_model
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
