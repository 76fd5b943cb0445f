"""The key–value view is built once per dictionary and passed down (docs/design.md §3): an atlas build on a tiny model
builds and probes each dictionary's view once; a view ``as_key_value`` returned comes back without a second check."""

import dataclasses
from collections import Counter

import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV
from tl_query_lens.atlas import AtlasConfig, build_atlas
from tl_query_lens.dictionaries import key_value
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import InputError


def _count(monkeypatch) -> tuple[Counter, list[int]]:
    """Count view constructions per dictionary (``_view_of_sae``) and one-token probes of the model (``hook_dims``)."""
    built: Counter = Counter()
    probes: list[int] = []
    view_of_sae, hook_dims = key_value._view_of_sae, key_value.hook_dims

    def counted_view(sae):
        built[id(sae)] += 1
        return view_of_sae(sae)

    def counted_dims(model, names):
        probes.append(1)
        return hook_dims(model, names)

    monkeypatch.setattr(key_value, "_view_of_sae", counted_view)
    monkeypatch.setattr(key_value, "hook_dims", counted_dims)
    return built, probes


def test_an_atlas_build_builds_each_view_once(tmp_path, monkeypatch):
    model = tiny_model("gelu_ln")
    cfg = AtlasConfig(out=tmp_path, dictionary=("ffkv:1",), n_tokens=8 * 16, seq_len=16, shard_size=32, band_sample=4)
    tokens, ops = tiny_tokens(model, n_seqs=8, seq_len=16), tiny_tokens(model, n_seqs=2, seq_len=8, seed=1)
    built, probes = _count(monkeypatch)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=ops, progress=False)
    n_shards = len(list((tmp_path / "shards" / "1-ffkv").glob("*.json")))
    assert n_shards >= 2 and (tmp_path / "shards" / "1-ffkv").is_dir()  # several shards, each with signatures
    assert list(built.values()) == [1]  # one dictionary, one view
    assert len(probes) == 1  # one one-token probe of the model for it


def test_a_returned_view_comes_back_unchecked_and_a_changed_one_is_checked(monkeypatch):
    model = tiny_model("gelu_ln")
    view = as_key_value(FFKV.from_model(model, 1), model)
    built, probes = _count(monkeypatch)
    assert as_key_value(view, model) is view and as_key_value(view) is view
    assert not built and not probes
    other = tiny_model("gelu_ln")
    assert as_key_value(view, other) is view and len(probes) == 1  # another model: its hooks are probed
    broken = dataclasses.replace(view, values=view.values.clone().fill_(float("nan")))
    try:
        as_key_value(broken, model)
    except InputError as err:  # a replaced view is a new view: checked again
        assert "values" in str(err)
    else:
        raise AssertionError("a non-finite replaced view passed")
    assert torch.isfinite(view.values).all()
