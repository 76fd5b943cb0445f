"""One definition of alive: the atlas's quality row counts a feature alive when its code is nonzero, as ``tlql ffkv``
and ``tlql saes report`` do (``SpliceStats``), so a signed FF-KV neuron that fires only negatively is alive."""

import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.atlas import AtlasConfig, DictionaryQuality, build_atlas
from tl_query_lens.dictionaries.splice import SpliceStats

SKIP = 1  # AtlasConfig's default exclude_first_positions


def test_a_neuron_that_fires_only_negatively_is_alive_in_the_atlas(tmp_path):
    model = tiny_model("gelu_ln")
    with torch.no_grad():  # neurons 0..9 of layer 1: pre-activation −1 everywhere, GELU(−1) ≈ −0.16 < 0
        model.blocks[1].mlp.W_in[:, :10] = 0.0
        model.blocks[1].mlp.b_in[:10] = -1.0
    tokens = tiny_tokens(model, n_seqs=4, seq_len=16)
    cfg = AtlasConfig(out=tmp_path, dictionary=("ffkv:1",), n_tokens=4 * 16, seq_len=16, signatures=False)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=tokens[:1], progress=False)
    row = DictionaryQuality.load(tmp_path / "results" / "1-ffkv")

    _, cache = model.run_with_cache(tokens, names_filter=["blocks.1.mlp.hook_post"])
    codes = cache["blocks.1.mlp.hook_post"][:, SKIP:]
    assert (codes[..., :10] < 0).all()  # they fire, and only negatively
    assert (codes > 0).flatten(0, 1).any(0).float().mean() <= 1 - 10 / codes.shape[-1]  # `> 0` would call them dead
    assert row.alive == (codes != 0).flatten(0, 1).any(0).float().mean().item()
    assert row.l0 == (codes != 0).sum().item() / (codes.shape[0] * codes.shape[1])
    stats = SpliceStats(codes.shape[-1])  # the accumulator of tlql ffkv / tlql saes report gives the same row
    stats.update_codes(codes)
    assert row.alive == stats.metrics()["alive_rate"]
