"""Offline SAE training through SAELens' LanguageModelSAETrainingRunner (tiny model, in-memory dataset)."""

import pytest
import torch
from sae_lens import SAE

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.certify.train_sae import SAETrainSpec, train_sae


def test_runner_trains_a_topk_sae_offline_and_it_loads_back(tmp_path):
    model = tiny_model("gated_rms")
    spec = SAETrainSpec(layer=1, d_sae=64, k=4, training_tokens=2048, context_size=16, batch_size_tokens=256)
    path = train_sae(model, spec, tokens=tiny_tokens(model, 64, 16), out_dir=tmp_path / "sae")
    sae = SAE.load_from_disk(path)
    assert sae.cfg.architecture() == "topk" and sae.cfg.metadata.hook_name == "blocks.1.hook_resid_post"
    _, cache = model.run_with_cache(tiny_tokens(model, 2, 16, seed=5), names_filter=["blocks.1.hook_resid_post"])
    codes = sae.encode(cache["blocks.1.hook_resid_post"])
    assert ((codes != 0).sum(-1) <= 4).all() and torch.isfinite(sae.W_dec).all()


def test_spec_validation():
    with pytest.raises(ValueError, match="k must be in"):
        SAETrainSpec(layer=0, d_sae=8, k=9)
    model = tiny_model("gelu_ln")
    with pytest.raises(KeyError, match="Unknown hook"):
        train_sae(model, SAETrainSpec(layer=9, d_sae=8, k=2, training_tokens=2048), tokens=tiny_tokens(model, 4, 32))
