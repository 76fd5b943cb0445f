"""The release that travels with the package: int8 packing, checksums, SAELens' registry, ids of unfinished fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sae_lens import SAE, HookedSAETransformer
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import releases
from tl_query_lens.errors import CorruptFileError
from tl_query_lens.paths import shipped_root
from tl_query_lens.readout.registry import READOUT_RELEASES
from tl_query_lens.saes import TopKTranscoder  # noqa: F401  (a first name used registers the releases and the class)
from tl_query_lens.saes.registry import SAES_RELEASES
from tl_query_lens.saes.release import pack_release

SID = "blocks.1.hook_resid_post"


@pytest.fixture()
def shipped(tmp_path, monkeypatch):
    """A private user cache and a private package release folder."""
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "package_release"
    monkeypatch.setattr(releases, "shipped_root", lambda: root)
    return root


def _topk_sae(model, seed: int = 0) -> TopKSAE:
    d = model.cfg.d_model
    sae = TopKSAE(TopKSAEConfig(d_in=d, d_sae=64, k=6, dtype="float32", device="cpu"))
    sae.cfg.metadata.hook_name = SID
    sae.cfg.metadata.model_name = "tiny"
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim == 2 else 0.05))
    return sae


def _pack_one(model, shipped) -> TopKSAE:
    sae = _topk_sae(model)
    sae.save_model(SAES_RELEASES.cached_path("tiny-test", SID))
    pack_release(SAES_RELEASES, "tiny-test", [SID], source={"test": True})
    # The cache copy goes: what loads now is the packed one.
    import shutil

    shutil.rmtree(SAES_RELEASES.cached_path("tiny-test", SID))
    SAES_RELEASES.register({"tiny-test": {"model": "tiny", "repo_id": None, "sae_ids": []}})
    return sae


def test_packed_dictionary_loads_through_saelens_within_the_int8_bound(shipped):
    model = tiny_model("gelu_ln")
    source = _pack_one(model, shipped)
    loaded = SAE.from_pretrained("tlql-saes-tiny-test", SID)
    assert isinstance(loaded, TopKSAE) and loaded.W_enc.dtype == torch.float32
    for name in ("W_enc", "W_dec"):
        w, got = getattr(source, name).detach(), getattr(loaded, name).detach()
        axis = 0 if w.shape[0] == 64 else 1  # the feature axis
        step = w.abs().amax(dim=1 - axis, keepdim=True) / 127  # one quantisation step per feature
        assert torch.all((got - w).abs() <= step / 2 + 1e-7), name
        assert not torch.equal(got, w)  # it really went through int8
    for name in ("b_enc", "b_dec"):
        assert torch.equal(getattr(loaded, name), getattr(source, name).detach())
    files = sorted(p.name for p in (shipped / "tlql-saes-tiny-test" / SID).iterdir())
    assert files == ["cfg.json", "sae_weights.int8.safetensors"]

    bf16 = SAE.from_pretrained("tlql-saes-tiny-test", SID, dtype="bfloat16")
    assert bf16.W_dec.dtype == torch.bfloat16
    assert torch.allclose(bf16.W_dec.float(), loaded.W_dec, rtol=1e-2, atol=1e-3)

    # Spliced into the model like any SAELens SAE: same logits as splicing the dequantised weights by hand.
    hooked = HookedSAETransformer(model.cfg)
    hooked.load_state_dict(model.state_dict(), strict=False)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    by_hand = TopKSAE(source.cfg)
    by_hand.load_state_dict(loaded.state_dict())
    assert torch.allclose(hooked.run_with_saes(tokens, saes=[loaded]), hooked.run_with_saes(tokens, saes=[by_hand]))


def test_cache_entry_shadows_the_shipped_one_except_inside_shipped_only(shipped):
    """A retrained dictionary in the cache wins by default; ``shipped_only()`` (tlql reproduce) reads the package's."""
    model = tiny_model("gelu_ln")
    packed = _pack_one(model, shipped)
    retrained = _topk_sae(model, seed=1)
    retrained.save_model(SAES_RELEASES.cached_path("tiny-test", SID))
    assert torch.equal(SAE.from_pretrained("tlql-saes-tiny-test", SID).W_dec, retrained.W_dec.detach())
    with releases.shipped_only():
        inside = SAE.from_pretrained("tlql-saes-tiny-test", SID).W_dec
    step = packed.W_dec.detach().abs().amax(dim=1, keepdim=True) / 127
    assert torch.all((inside - packed.W_dec.detach()).abs() <= step / 2 + 1e-7)
    assert torch.equal(SAE.from_pretrained("tlql-saes-tiny-test", SID).W_dec, retrained.W_dec.detach())  # reset


def test_altered_or_missing_file_names_the_file_and_the_fix(shipped):
    _pack_one(tiny_model("gelu_ln"), shipped)
    weights = shipped / "tlql-saes-tiny-test" / SID / "sae_weights.int8.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-10])  # truncated
    with pytest.raises(CorruptFileError) as err:
        SAE.from_pretrained("tlql-saes-tiny-test", SID)
    assert str(weights) in str(err.value) and "git checkout" in str(err.value)
    altered = bytearray(good)
    altered[-5] ^= 0xFF  # same size, one byte changed
    weights.write_bytes(bytes(altered))
    with pytest.raises(CorruptFileError, match="sha256"):
        SAE.from_pretrained("tlql-saes-tiny-test", SID)
    weights.unlink()
    with pytest.raises(CorruptFileError, match="missing"):
        SAE.from_pretrained("tlql-saes-tiny-test", SID)


def test_unknown_id_lists_the_ids_that_exist(shipped):
    _pack_one(tiny_model("gelu_ln"), shipped)
    with pytest.raises(FileNotFoundError) as err:
        SAE.from_pretrained("tlql-saes-tiny-test", "blocks.2.hook_resid_post")
    assert f"shipped ids: {SID}" in str(err.value) and "tlql saes train" in str(err.value)


def test_one_dictionary_is_added_without_touching_the_shipped_files(shipped):
    """add_to_release packs one more id beside the shipped ones: their bytes (hashed here) and manifest entries stay,
    the new id loads and verifies, and adding it twice or an unfinished id is refused."""
    import hashlib

    from tl_query_lens.saes.release import add_to_release

    model = tiny_model("gelu_ln")
    _pack_one(model, shipped)
    folder = shipped / "tlql-saes-tiny-test"
    before = {
        p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }
    old_manifest = json.loads((folder / "manifest.json").read_text())
    new_id = "blocks.2.hook_resid_post"
    added = _topk_sae(model, seed=3)
    added.cfg.metadata.hook_name = new_id
    added.save_model(SAES_RELEASES.cached_path("tiny-test", new_id))
    add_to_release(SAES_RELEASES, "tiny-test", new_id, source={"trained": "here"})
    after = {
        p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }
    assert {k: v for k, v in after.items() if k.name != "manifest.json" and k in before} == {
        k: v for k, v in before.items() if k.name != "manifest.json"
    }
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {k: v for k, v in manifest["files"].items() if k in old_manifest["files"]} == old_manifest["files"]
    assert sorted(k for k in manifest["files"] if k not in old_manifest["files"]) == [
        f"{new_id}/cfg.json",
        f"{new_id}/sae_weights.int8.safetensors",
    ]
    assert manifest["test"] is True and manifest["added"] == {new_id: {"trained": "here"}}
    import shutil

    shutil.rmtree(SAES_RELEASES.cached_path("tiny-test", new_id))  # what loads now is the packed copy
    loaded = SAE.from_pretrained("tlql-saes-tiny-test", new_id)
    step = added.W_dec.detach().abs().amax(dim=1, keepdim=True) / 127
    assert torch.all((loaded.W_dec - added.W_dec.detach()).abs() <= step / 2 + 1e-7)
    assert not (shipped / "tlql-saes-tiny-test.staging").exists()
    with pytest.raises(ValueError, match="already"):
        add_to_release(SAES_RELEASES, "tiny-test", new_id, source={})
    with pytest.raises(ValueError, match="unfinished"):
        add_to_release(SAES_RELEASES, "tiny-test", new_id + ".partial", source={})


def test_unfinished_dictionaries_are_not_packed(shipped):
    with pytest.raises(ValueError, match="unfinished"):
        pack_release(SAES_RELEASES, "tiny-test", [SID + ".partial"], source={})


def test_capped_readout_fit_takes_its_own_id():
    from tl_query_lens.readout.config import ReadoutFitConfig
    from tl_query_lens.readout.fit import ReadoutFit

    cfg = ReadoutFitConfig.preset("small")
    capped = ReadoutFit(sae=None, config=cfg, seconds=1.0, final={"steps": 139})  # type: ignore[arg-type]
    full = ReadoutFit(sae=None, config=cfg, seconds=1.0, final={"steps": cfg.steps})  # type: ignore[arg-type]
    assert capped.cache_id("small") == "small-capped-s139" and not capped.complete
    assert full.cache_id("small") == "small" and full.complete
    assert ReadoutFitConfig.preset("cpu") == cfg  # the old preset name still works


SHIPPED_SUITE = shipped_root() / "tlql-saes-smollm2-135m"


@pytest.mark.skipif(not SHIPPED_SUITE.is_dir(), reason="no release packed in this checkout")
def test_the_shipped_release_loads_offline_and_verifies():
    """All ten shipped dictionaries load through SAELens' registry, with their checksums verified."""
    suite_ids = SAES_RELEASES.shipped_ids("smollm2-135m")
    assert (
        len(suite_ids) == 9
        and "blocks.28.hook_resid_post" in suite_ids
        and not [s for s in suite_ids if s.endswith(".partial")]
    )
    for sid in suite_ids:
        sae = SAE.from_pretrained("tlql-saes-smollm2-135m", sid)
        assert sae.cfg.d_in == 576 and torch.isfinite(sae.W_dec).all()
    readout = SAE.from_pretrained("tlql-readout-smollm2-135m", "small")
    assert readout.cfg.d_in == 576
    manifest = json.loads((SHIPPED_SUITE / "manifest.json").read_text())
    total = sum(p.stat().st_size for p in Path(shipped_root()).rglob("*") if p.is_file())  # the whole release
    assert total <= 56_000_000 and all(e["bytes"] <= 25_000_000 for e in manifest["files"].values())
    assert READOUT_RELEASES.shipped_ids("smollm2-135m") == ["small"]


def test_readout_sae_ships_without_codes_and_recomputes_them_on_bind(shipped):
    """The packed readout SAE leaves its row codes out; binding it to the model recomputes them, and the exact
    identity exact = bias + Σ contributions + residual holds against the clean score h·(α W_U rows)."""
    from tl_query_lens.readout import bind, decompose
    from tl_query_lens.readout.fit import fit_readout
    from tl_query_lens.readout.sae import unembedding_rows

    model = tiny_model("gelu_ln")
    source = fit_readout(model, tiny_tokens(model, n_seqs=4, seq_len=8), width=32, k=4, steps=30, progress=False).sae
    source.save_model(READOUT_RELEASES.cached_path("tiny-test", "small"))
    pack_release(READOUT_RELEASES, "tiny-test", ["small"], source={"test": True})
    import shutil

    shutil.rmtree(READOUT_RELEASES.cached_path("tiny-test", "small"))
    from safetensors.torch import load_file

    stored = set(load_file(str(shipped / "tlql-readout-tiny-test" / "small" / "sae_weights.int8.safetensors")))
    READOUT_RELEASES.register({"tiny-test": {"model": "tiny", "repo_id": None, "sae_ids": []}})
    loaded = SAE.from_pretrained("tlql-readout-tiny-test", "small")
    assert loaded.codes_pending
    with pytest.raises(RuntimeError, match="bind"):
        loaded.row_codes()
    bind(model, loaded)
    assert not loaded.codes_pending
    # The recomputed codes are the dequantised encoder's TopK of the normalised rows (independent reference here).
    rows = unembedding_rows(model).to(loaded.W_enc)
    x = (rows - loaded.b_dec) / (rows - loaded.b_dec).norm(dim=-1, keepdim=True)
    ref = torch.relu(x @ loaded.W_enc + loaded.b_enc).topk(4, dim=-1).indices.sort(-1).values
    assert torch.equal(loaded.code_indices.sort(-1).values, ref)
    # Most rows keep the source's support through int8 (the fidelity script measures it on the real dictionary).
    same = (source.code_indices.sort(-1).values == loaded.code_indices.sort(-1).values).all(-1).float().mean()
    assert same > 0.8
    h = torch.randn(3, model.cfg.d_model, dtype=torch.float64)
    alpha = torch.zeros(model.cfg.d_vocab)
    alpha[[1, 5]] = torch.tensor([1.0, -1.0])
    dec = decompose(loaded, h, alpha)
    exact = h @ (alpha.double() @ rows.double())
    assert torch.allclose(dec.bias + dec.contributions.sum(-1) + dec.residual, exact, atol=1e-8)
    assert "row_norms" in stored and not {"code_values", "code_indices_base256", "code_indices"} & stored
