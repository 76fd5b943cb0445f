"""``tlql atlas --quick`` on the embedded SmolLM2-135M (slow: one layer, 256 features, a few minutes at most)."""

import json
from pathlib import Path

import pytest
import torch

from tl_query_lens.cli import main


@pytest.mark.slow
def test_quick_atlas_of_the_embedded_model(tmp_path, embedded_model):
    from tl_query_lens import FFKV, load_corpus
    from tl_query_lens.atlas import AtlasConfig
    from tl_query_lens.atlas.config import QUICK_LAYER

    out = tmp_path / "atlas"
    assert main(["atlas", "--quick", "--out", str(out), "--no-wandb", "--device", "cpu"]) == 0
    cfg = AtlasConfig.preset_quick(out=out)
    index = (out / "data" / "index.js").read_text()
    assert index.startswith("ATLAS.index(") and f'"slug":"{QUICK_LAYER}-ffkv"' in index
    shards = sorted((out / "shards" / f"{QUICK_LAYER}-ffkv").glob("*.json"))
    features = {f["i"]: (f, s["strings"]) for p in shards for s in [json.loads(p.read_text())] for f in s["features"]}
    assert sorted(features) == list(range(256))
    # the top contexts of a few features against a direct pass over the same corpus windows
    tokens = load_corpus("embedded", embedded_model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, split=cfg.split)
    sae = FFKV.from_model(embedded_model, QUICK_LAYER)
    hook = sae.cfg.metadata.hook_name
    with torch.no_grad():
        _, cache = embedded_model.run_with_cache(tokens[:, :], names_filter=[hook], stop_at_layer=QUICK_LAYER + 1)
        acts = sae.encode(cache[hook])[:, cfg.exclude_first_positions :, :8].amax(1)  # [seq, 8]
    for i in range(8):
        f, strings = features[i]
        top = acts[:, i].topk(cfg.n_top)
        assert [c["s"] for c in f["top"]][:5] == top.indices.tolist()[:5]
        assert f["sig"]["QL_VALUE"]["top"] and f["sig"]["QL_KEY"]["top"] and f["shares"]
        assert all("\ufffd" not in strings[t] for c in f["top"] for t in c["t"])  # byte tokens readable
    assert (out / "exports" / "neuronpedia" / "v1" / "smollm2-135m" / f"{QUICK_LAYER}-ffkv" / "source.jsonl").is_file()
    assert len(list((out / "exports" / "circuit-tracer" / "ffkv").glob("*.json"))) == 256
    assert Path(out / "index.html").is_file()


@pytest.mark.slow
def test_the_default_corpus_split_holds_the_atlas_tokens(embedded_model):
    """The default atlas reads 102,400 tokens, more than the embedded evaluation split holds (49k): it reads the
    train split (155k) unless told otherwise (it once stopped at the corpus with the defaults)."""
    from tl_query_lens import load_corpus
    from tl_query_lens.atlas import AtlasConfig

    cfg = AtlasConfig()
    assert cfg.n_tokens >= 100_000
    tokens = load_corpus(cfg.corpus, embedded_model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, split=cfg.split)
    assert tokens.shape == (cfg.n_seqs, cfg.seq_len) and tokens.numel() >= 100_000
    with pytest.raises(ValueError, match="split"):
        AtlasConfig(split="test")  # type: ignore[arg-type]
