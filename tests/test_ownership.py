"""Reliability, round three: folder ownership, clean-up of a command's own files only, and content fingerprints of
the atlas shards (rows of docs/reliability.md, "Round three"). The reference for a resumed atlas is a fresh build
in an empty folder; tiny random models keep each test at a few seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.atlas import AtlasConfig, build_atlas
from tl_query_lens.cli import main
from tl_query_lens.errors import InputError
from tl_query_lens.paths import LOCK_NAME, check_owned, clear_temporaries

SEQ = 16


def _cfg(out, **kw):
    base = {"out": str(out), "dictionary": ("ffkv:1",), "n_tokens": 12 * SEQ, "seq_len": SEQ, "shard_size": 32}
    cheap = {"band_sample": 8, "features": "0-63", "signatures": False, "exports": False}  # 2 shards, no operators
    return AtlasConfig(**{**base, **cheap, **kw})


def _build(model, out, **kw):
    cfg = _cfg(out, **kw)
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=SEQ)
    ops = tiny_tokens(model, n_seqs=2, seq_len=8, seed=1)
    return build_atlas(model, None, cfg, tokens=tokens, operator_tokens=ops, progress=False)


def _shards(out: Path) -> dict[str, object]:
    """Every shard's features (the pages' data), by file."""
    return {
        str(p.relative_to(out)): json.loads(p.read_text())["features"] for p in sorted((out / "shards").rglob("*.json"))
    }


@pytest.fixture
def user_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "index.html").write_text("<p>my own page</p>")
    (folder / ".draft.tmp").write_text("my notes")
    return folder


# --- ownership ------------------------------------------------------------------------------------------------------


def test_atlas_refuses_a_users_folder_and_leaves_it_untouched(user_folder, capsys, monkeypatch):
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: pytest.fail("model loaded"))
    before = {p.name: p.read_bytes() for p in user_folder.iterdir()}
    assert main(["atlas", "--out", str(user_folder), "--no-wandb"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(user_folder) in err and "no tlql run wrote" in err
    assert {p.name: p.read_bytes() for p in user_folder.iterdir()} == before


@pytest.mark.parametrize("command", [["ffkv", "--layers", "0"], ["certify"], ["readout", "fit"], ["query-lens"]])
def test_every_command_refuses_a_users_folder(command, user_folder, capsys, monkeypatch):
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main([*command, "--out", str(user_folder), "--no-wandb"]) == 2
    assert "no tlql run wrote" in capsys.readouterr().err
    assert not (user_folder / LOCK_NAME).exists()


def test_build_atlas_from_python_refuses_a_users_folder(user_folder):
    model = tiny_model("gelu_ln")
    with pytest.raises(InputError, match="no tlql run wrote"):
        _build(model, user_folder)
    assert (user_folder / "index.html").read_text() == "<p>my own page</p>"


def test_a_folder_tlql_wrote_before_is_accepted(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "old.csv").write_text("x")
    (folder / LOCK_NAME).write_text("")  # every locked tlql run leaves its lock file: the marker
    check_owned(folder)
    check_owned(tmp_path / "new")  # missing: created by the command
    (tmp_path / "empty").mkdir()
    check_owned(tmp_path / "empty")


def test_clean_up_touches_only_the_commands_own_entries(tmp_path):
    own_top = tmp_path / ".index.html.a1b2.tmp"
    own_deep = tmp_path / "shards" / "1-ffkv" / ".32.json.x9.tmp"
    foreign = [tmp_path / ".draft.tmp", tmp_path / "notes" / ".index.html.a1b2.tmp", tmp_path / ".other.html.q.tmp"]
    for path in [own_top, own_deep, *foreign]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    assert clear_temporaries(tmp_path, ["shards", "index.html"]) == 2
    assert not own_top.exists() and not own_deep.exists()
    assert all(p.exists() for p in foreign)


# --- content fingerprints of the atlas shards -----------------------------------------------------------------------


def test_same_named_model_with_other_weights_rebuilds_every_shard(tmp_path):
    model_a, model_b = tiny_model("gelu_ln"), tiny_model("gelu_ln")
    with torch.no_grad():  # block 0 only: the FF-KV of layer 1 (the dictionary) keeps its weights
        for p in model_b.blocks[0].parameters():
            p.mul_(1.25)
    assert model_a.cfg.model_name == model_b.cfg.model_name
    out = tmp_path / "atlas"
    first = _build(model_a, out)
    second = _build(model_b, out)
    assert second.shards_reused == 0 and second.shards_built == first.shards_built
    fresh = tmp_path / "fresh"
    _build(model_b, fresh)  # the reference: model B in an empty folder
    assert _shards(out) == _shards(fresh)


def test_a_retrained_dictionary_at_the_same_path_rebuilds_its_shards(tmp_path):
    """An SAE folder saved again with other weights (the spec, a path, is unchanged)."""
    from tl_query_lens.dictionaries import FFKV

    model = tiny_model("gelu_ln")
    folder = tmp_path / "sae"
    FFKV.from_model(model, 1, "vanilla").save_model(folder)
    out = tmp_path / "atlas"
    first = _build(model, out, dictionary=(str(folder),))
    retrained = FFKV.from_model(model, 1, "vanilla")
    with torch.no_grad():
        retrained.W_dec.mul_(-1.0)
    retrained.save_model(folder)
    second = _build(model, out, dictionary=(str(folder),))
    assert second.shards_reused == 0 and second.shards_built == first.shards_built
    fresh = tmp_path / "fresh"
    _build(model, fresh, dictionary=(str(folder),))
    assert _shards(out) == _shards(fresh)


@pytest.mark.parametrize("which", ["json", "js"])
def test_a_truncated_shard_file_is_rebuilt_on_resume(which, tmp_path):
    model = tiny_model("gelu_ln")
    out = tmp_path / "atlas"
    first = _build(model, out)
    path = next((out / ("shards" if which == "json" else "data") / "1-ffkv").glob(f"*.{which}"))
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    again = _build(model, out)
    assert again.shards_built == 1 and again.shards_reused == first.shards_built - 1
    assert path.read_bytes() == good  # rebuilt byte for byte


# --- locks on the user cache's shared writes ------------------------------------------------------------------------


def test_a_second_saes_train_of_one_release_is_refused_before_work(tmp_path, monkeypatch):
    """The first writer holds the release folder's lock (a second open file description conflicts as a second
    process would); the second is refused naming its pid, before any activation is cached."""
    import os

    from tl_query_lens.errors import LockedError
    from tl_query_lens.paths import folder_lock
    from tl_query_lens.saes import train as train_mod

    monkeypatch.setattr(train_mod, "cache_activations", lambda *a, **k: pytest.fail("work started"))
    model = tiny_model("gelu_ln")
    root = tmp_path / "release"
    with folder_lock(root, "the release folder"), pytest.raises(LockedError, match=f"pid {os.getpid()}") as err:
        train_mod.train_saes(model, folder=root, layers=(1,), tokens=tiny_tokens(model, 2, 8))
    assert str(root) in str(err.value)


def test_a_second_readout_fit_of_one_id_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    import os

    from tl_query_lens.paths import folder_lock
    from tl_query_lens.readout.registry import cached_sae_path

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: pytest.fail("model loaded"))
    entry = cached_sae_path("smollm2-135m", "mine")
    with folder_lock(entry.parent, "the readout cache", name=f".{entry.name}.tlql.lock"):
        code = main(["readout", "fit", "--sae-id", "mine", "--out", str(tmp_path / "o"), "--no-wandb"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "the readout cache" in err and f"pid {os.getpid()}" in err
