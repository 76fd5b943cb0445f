"""Reliability, round three: the command line's one error boundary and the JSON-shape checks of every reader.

Each test is a row of docs/reliability.md ("Round three"). Bad input is refused before any model loads
(``load_model`` fails the test if it is called), so these tests are cheap. Where a machine condition cannot be made
here (a full disk), the exception the library raises under it is raised at the same call, with the same type and
message shape as the real one, and the test says so.
"""

from __future__ import annotations

import errno
import json
import pickle
from types import SimpleNamespace

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from tl_query_lens import paths
from tl_query_lens.broad_corpus import main as broad_main
from tl_query_lens.cli import main
from tl_query_lens.errors import CorruptFileError, InputError, WriteError, boundary_error
from tl_query_lens.releases import verify_shipped
from tl_query_lens.reproduce.run import load_documented
from tl_query_lens.results import read_json

SAFETENSORS_FULL_DISK = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr("tl_query_lens.models.load_model", refuse)


def one_line_error(capsys, argv, runner=main) -> str:
    """Run ``argv``; assert exit 2, no traceback, one message line (plus the --debug hint); return that line."""
    assert runner(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    return lines[0]


# --- dictionary specs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("ffkv:99", "layer 99 is out of range; the model has layers 0..29"),
        ("ffkv:20:topk:0", "k must be ≥ 1"),
        ("ffkv:²", "is not an FF-KV spec"),  # '²'.isdigit() is True, int('²') fails
        ("ffkv:1:topk:³", "is not an FF-KV spec"),
        ("ffkv:-1", "is not an FF-KV spec"),
    ],
)
def test_bad_ffkv_specs_are_refused_before_loading(spec, expected, no_model, capsys, tmp_path):
    line = one_line_error(capsys, ["certify", "--dictionary", spec, "--out", str(tmp_path / "o"), "--no-wandb"])
    assert expected in line and "--dictionary" in line


def test_ffkv_layer_is_checked_against_a_loaded_model_too():
    """A model not known before loading: the layer is checked when the dictionary is built."""
    from tests.helpers import tiny_model
    from tl_query_lens.errors import OutOfRangeError
    from tl_query_lens.sources import load_dictionary

    model = tiny_model("gelu_ln")
    with pytest.raises(OutOfRangeError, match=f"layers 0..{model.cfg.n_layers - 1}"):
        load_dictionary("ffkv:7", model)


# --- environment variables ------------------------------------------------------------------------------------------


def _wandb_dir_cases(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "deeper")
    return {
        "file": (str(a_file), "is a file"),
        "dangling": (str(dangling), "is not a folder"),
        "proc": ("/proc/x", "/proc"),
    }


@pytest.mark.parametrize("case", ["file", "dangling", "proc"])
def test_broken_wandb_dir_is_named_before_work(case, no_model, capsys, tmp_path, monkeypatch):
    value, expected = _wandb_dir_cases(tmp_path)[case]
    monkeypatch.setenv("WANDB_DIR", value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    line = one_line_error(capsys, ["ffkv", "--layers", "0", "--out", str(tmp_path / "o")])
    assert "WANDB_DIR" in line and expected in line
    assert "WANDB_MODE=offline" not in line  # already set: not the advice


@pytest.mark.parametrize("value", ["abc", "-5", "nan", "inf"])
def test_bad_wandb_init_timeout_is_named(value, no_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", value)
    line = one_line_error(capsys, ["ffkv", "--layers", "0", "--out", str(tmp_path / "o")])
    assert f"WANDB_INIT_TIMEOUT={value!r}" in line


def test_tracker_names_a_broken_wandb_dir_without_offline_advice(tmp_path, monkeypatch, caplog):
    """Python API: the results are written, the warning names WANDB_DIR, and does not say to go offline."""
    from tl_query_lens.tracking import Tracker

    (tmp_path / "a_file").write_text("x")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "a_file"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with caplog.at_level("WARNING", logger="tl_query_lens.tracking"), Tracker(tmp_path / "out", name="t") as track:
        track.log_scalars("s", {"x": 1.0})
    assert track.wandb_error and "WANDB_DIR" in track.wandb_error
    assert "Rerun with WANDB_MODE=offline" not in caplog.text


# --- numbers that overflow ------------------------------------------------------------------------------------------


def test_subnormal_delta_is_refused(no_model, capsys, tmp_path):
    line = one_line_error(capsys, ["certify", "--delta", "1e-320", "--out", str(tmp_path / "o"), "--no-wandb"])
    assert "--delta must be ≥ 1e-300" in line


# --- JSON files: every reader checks the shape ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body,expected", [("[1, 2]", "holds a JSON list"), ('"x"', "holds a JSON string"), ("3", "holds a JSON int")]
)
def test_read_json_checks_the_shape(body, expected, tmp_path):
    path = tmp_path / "x.json"
    path.write_text(body)
    with pytest.raises(CorruptFileError, match=expected) as err:
        read_json(path, fix="Fix it.")
    assert str(path) in str(err.value) and "Fix it." in str(err.value)
    assert read_json(path, shape=None) == json.loads(body)  # shape=None: anything (Python's own parser agrees)


def _release(tmp_path, manifest):
    release = tmp_path / "rel"
    (release / "sid").mkdir(parents=True)
    (release / "sid" / "cfg.json").write_text("{}")
    (release / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return release


@pytest.mark.parametrize(
    "manifest,expected",
    [
        ([1, 2], "holds a JSON list"),
        ('"files"', "holds a JSON string"),
        ({"files": []}, "holds a JSON list"),
        ({"nofiles": {}}, "lacks the fields ['files']"),
        ({"files": {"sid/cfg.json": {"bytes": 2, "sha256": "x"}}}, "lists no checksum of ['sid/sae_weights"),
        ({"files": {"sid/cfg.json": 3, "sid/sae_weights.int8.safetensors": 3}}, "lacks 'bytes' and 'sha256'"),
    ],
)
def test_release_manifest_shapes_are_refused(manifest, expected, tmp_path):
    """A manifest that is a list or string, and one that leaves out the weights file the loader always reads."""
    with pytest.raises(CorruptFileError, match=expected.replace("[", r"\[")):
        verify_shipped(_release(tmp_path, manifest), "sid")


@pytest.mark.parametrize(
    "body,expected",
    [
        ("[]", "holds a JSON list"),
        ('{"small": []}', "holds a JSON list"),
        ('{"small": {"row": {"value": 1}}}', "lacks the fields"),
        ('{"small": {"row": {"value": 1, "lo": "a", "hi": 2}}}', "are not numbers"),
        ('{"small": {', "is not valid JSON"),
    ],
)
def test_corrupted_documented_json_is_named(body, expected, tmp_path):
    path = tmp_path / "documented.json"
    path.write_text(body)
    with pytest.raises(CorruptFileError, match=expected) as err:
        load_documented(path)
    assert "documented.json" in str(err.value) and "--record" in str(err.value)


@pytest.fixture
def broad_cache(tmp_path, monkeypatch):
    from tl_query_lens.broad_corpus import broad_dir

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    folder = broad_dir()
    folder.mkdir(parents=True)
    (folder / "documents.jsonl").write_text('{"text": "a", "source": "p"}\n')
    return folder


@pytest.mark.parametrize(
    "body",
    ["{}", "[]", '{"version": 1, "n_documents": 1, "n_characters": 1, "documents_sha256": "x", "packages": "p"}'],
)
def test_broad_corpus_info_on_a_misshapen_manifest(body, broad_cache, capsys):
    (broad_cache / "manifest.json").write_text(body)
    line = one_line_error(capsys, ["info"], runner=broad_main)
    assert "manifest.json" in line and "Reinstall" in line


@pytest.mark.parametrize("mirror", ["garbage", "ftp://x/debian", "http://", ""])
def test_install_refuses_a_mirror_that_is_not_a_url(mirror, broad_cache, capsys, monkeypatch):
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("a download was attempted"))
    line = one_line_error(capsys, ["install", "--mirror", mirror, "--target", str(broad_cache / "t")], broad_main)
    assert "--mirror" in line and "is not a mirror URL" in line


# --- pickles, safetensors, full disks -------------------------------------------------------------------------------


class _Payload:
    def __reduce__(self):
        import os

        return (os.mkdir, (str(_Payload.target),))


def test_malicious_trainer_state_is_refused_and_not_run(tmp_path):
    """torch.load(weights_only=True) refuses the pickle; the resume names the checkpoint instead of a raw
    UnpicklingError, and the payload never runs."""
    from tl_query_lens.saes.train import _resume

    _Payload.target = tmp_path / "pwned"
    checkpoint = tmp_path / "checkpoints" / "100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(pickle.dumps({"optimizer": _Payload()}))
    trainer = SimpleNamespace(load_checkpoint=lambda folder: torch.load(folder / "trainer_state.pt"))
    with pytest.raises(CorruptFileError, match="UnpicklingError") as err:
        _resume(trainer, SimpleNamespace(position=0), tmp_path / "checkpoints")  # type: ignore[arg-type]
    assert str(checkpoint) in str(err.value) and "--restart" in str(err.value)
    assert not _Payload.target.exists()


def test_boundary_maps_library_errors_to_one_line(tmp_path):
    """What reaches the top without a file named still becomes one line naming the kind of file and the fix."""
    garbage = tmp_path / "x.safetensors"
    garbage.write_bytes(b"not safetensors")
    with pytest.raises(SafetensorError) as raised:
        from safetensors import safe_open

        safe_open(str(garbage), "pt")
    assert "safetensors" in str(boundary_error(raised.value))
    assert "UnpicklingError" not in str(boundary_error(pickle.UnpicklingError("Weights only load failed")))
    full = boundary_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f")))
    assert isinstance(full, WriteError) and "disk is full" in str(full) and str(tmp_path / "f") in str(full)
    cuda = boundary_error(AssertionError("Torch not compiled with CUDA enabled"))
    assert cuda is not None and "--device cpu" in str(cuda)
    assert boundary_error(RuntimeError("internal bug")) is None  # bugs keep their traceback
    assert boundary_error(KeyError("x")) is None


def test_a_library_error_in_a_command_is_one_line(monkeypatch, capsys, tmp_path):
    """A SafetensorError raised inside a command (here by loading a truncated file) exits 2 with one line."""
    broken = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(4)}, str(broken))
    broken.write_bytes(broken.read_bytes()[:20])

    def load(*args, **kwargs):
        from safetensors.torch import load_file

        return load_file(str(broken))

    monkeypatch.setattr("tl_query_lens.models.load_model", load)
    line = one_line_error(capsys, ["ffkv", "--layers", "0", "--out", str(tmp_path / "o"), "--no-wandb"])
    assert "safetensors" in line and "--debug" in line


def test_safetensors_write_on_a_full_disk_names_the_file(tmp_path):
    """safetensors raises SafetensorError (not OSError) on a full disk; the write names the file and the fix, and
    leaves no temporary file. (No full disk here: the writer raises the message safetensors gives for ENOSPC.)"""
    target = tmp_path / "t.safetensors"

    def write(tmp):
        save_file({"a": torch.zeros(4)}, tmp)
        raise SafetensorError(SAFETENSORS_FULL_DISK)

    with pytest.raises(WriteError, match="the disk is full") as err:
        paths.atomic_write_with(target, write)
    assert str(target) in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_full_disk_in_the_folder_lock_is_named(tmp_path, monkeypatch):
    """Writing the holder's pid into the lock file fails with ENOSPC: a WriteError naming the lock file, and the
    lock is released (a second try succeeds). (No full disk here: the lock file's flush raises ENOSPC.)"""
    real_open = open

    class FullHandle:
        def __init__(self, handle):
            self.handle = handle

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(paths, "open", lambda *a, **k: FullHandle(real_open(*a, **k)), raising=False)
    with pytest.raises(WriteError, match="the disk is full") as err, paths.folder_lock(tmp_path / "out"):
        pass
    assert paths.LOCK_NAME in str(err.value)
    monkeypatch.undo()
    with paths.folder_lock(tmp_path / "out"):
        pass


# --- shipped ids and the user cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["no_weights", "truncated"])
def test_broken_user_cache_copy_of_a_shipped_id_is_named(damage, tmp_path, monkeypatch):
    from tl_query_lens.saes.registry import SAES_RELEASES

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    model, sid = "smollm2-135m", SAES_RELEASES.shipped_ids("smollm2-135m")[0]
    copy = SAES_RELEASES.cached_path(model, sid)
    copy.mkdir(parents=True)
    (copy / "cfg.json").write_text((SAES_RELEASES.shipped_dir(model) / sid / "cfg.json").read_text())
    if damage == "truncated":
        (copy / "sae_weights.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(CorruptFileError) as err:
        SAES_RELEASES.loader("local/x", f"{model}/{sid}")
    text = str(err.value)
    assert str(copy) in text and f"rm -r {copy}" in text and "shadows the dictionary shipped" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_through_the_shipped_path_without_cuda(monkeypatch, tmp_path):
    from tl_query_lens.saes.registry import SAES_RELEASES

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    sid = SAES_RELEASES.shipped_ids("smollm2-135m")[0]
    with pytest.raises(InputError, match="CUDA is not available here"):
        SAES_RELEASES.loader("local/x", f"smollm2-135m/{sid}", device="cuda")


# --- the memory budget ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["atlas", "--k-tokens", "60000"], "--k-tokens must be ≤ 49152"),
        (["atlas", "--operator-seq-len", "5000"], "--operator-seq-len 5000 exceeds the model context 2048"),
        (["certify", "--bins", "10000000000"], "(--bins 10000000000: "),
        (["readout", "fit", "--width", "100000000"], "(--width 100000000: "),
        (["readout", "fit", "--batch-rows", "1000000000"], "(--batch-rows 1000000000: "),
    ],
)
def test_sizes_beyond_memory_are_refused_before_loading(argv, expected, no_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_MAX_MEMORY", "16G")  # the same budget on every machine
    line = one_line_error(capsys, [*argv, "--out", str(tmp_path / "o"), "--no-wandb"])
    assert expected in line


def test_saes_train_d_sae_beyond_memory(no_model, capsys, monkeypatch):
    monkeypatch.setenv("TLQL_MAX_MEMORY", "16G")
    line = one_line_error(capsys, ["saes", "train", "--d-sae", "100000000"])
    assert "(--d-sae 100000000: " in line and "lower --d-sae" in line


def test_max_memory_option_sets_the_budget(no_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_MAX_MEMORY", "16G")  # restored after the test (the option sets it for the run)
    line = one_line_error(capsys, ["readout", "fit", "--max-memory", "1M", "--out", str(tmp_path / "o"), "--no-wandb"])
    assert "more than the 1.0 MiB of TLQL_MAX_MEMORY / --max-memory" in line
    line = one_line_error(capsys, ["--max-memory=lots", "readout", "fit", "--out", str(tmp_path / "o")])
    assert "--max-memory='lots' is not a size" in line


def test_atlas_estimate_matches_the_collectors_bytes(tmp_path, monkeypatch):
    """The atlas' estimate against the bytes its collectors really allocate (counted from their tensors), and the
    refusal before the corpus pass when the budget is below it."""
    from tests.helpers import tiny_model, tiny_tokens
    from tl_query_lens.atlas import AtlasConfig, build_atlas
    from tl_query_lens.atlas import build as build_mod
    from tl_query_lens.atlas.collect import StatsCollector

    model = tiny_model("gelu_ln")
    n, seq, n_top, band = 64, 16, 40, 30
    collector = StatsCollector(torch.arange(n), seq, n_top=n_top, n_sample=band, seed=0, slug="x")
    real = sum(t.numel() * t.element_size() for t in vars(collector.stats).values() if isinstance(t, torch.Tensor))
    needs = {}
    monkeypatch.setattr(build_mod, "check_memory", lambda need, what: needs.update(need))
    cfg = AtlasConfig(
        out=tmp_path / "a",
        dictionary=("ffkv:1",),
        features=f"0-{n - 1}",
        n_tokens=4 * seq,
        seq_len=seq,
        n_top=n_top,
        band_sample=band,
        signatures=False,
        exports=False,
    )
    monkeypatch.setattr(build_mod, "_forward_pass", lambda *a, **k: pytest.fail("the corpus pass ran"))
    monkeypatch.setattr(build_mod, "_build_units", lambda *a, **k: None)
    monkeypatch.setattr(build_mod, "_assemble", lambda *a, **k: None)
    build_atlas(model, None, cfg, tokens=tiny_tokens(model, 4, seq), progress=False)
    assert 0.8 * real <= sum(needs.values()) <= 1.5 * real
    monkeypatch.undo()
    monkeypatch.setenv("TLQL_MAX_MEMORY", str(int(real // 2)))
    monkeypatch.setattr(build_mod, "_forward_pass", lambda *a, **k: pytest.fail("the corpus pass ran"))
    with pytest.raises(InputError, match="--n-top 40"):
        build_atlas(
            model,
            None,
            AtlasConfig(**{**vars(cfg), "out": tmp_path / "b"}),
            tokens=tiny_tokens(model, 4, seq),
            progress=False,
        )


def test_a_log_handler_on_a_full_disk_prints_no_traceback_flood(tmp_path, monkeypatch, capfd):
    """W&B's own log handlers on a full disk: each failed record printed a traceback ('--- Logging error ---').
    While the Tracker runs W&B, such records are dropped; the results and the one warning remain. (No full disk
    here: the handler's stream raises ENOSPC on every write.)"""
    import logging

    from tl_query_lens.tracking import Tracker

    class FullStream:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    handler = logging.StreamHandler(FullStream())
    noisy = logging.getLogger("wandb.fake")
    noisy.addHandler(handler)
    monkeypatch.setenv("WANDB_MODE", "offline")

    def log_run(self, wandb, mode):
        for i in range(50):
            noisy.error("record %d", i)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Tracker, "_log_run", log_run)
    try:
        with Tracker(tmp_path / "out", name="t") as track:
            track.log_scalars("s", {"x": 1.0})
    finally:
        noisy.removeHandler(handler)
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    assert track.wandb_error and "No space left" in track.wandb_error
    assert logging.raiseExceptions  # restored


def test_boundary_names_the_file_of_a_permission_error_without_guessing_read_or_write(tmp_path):
    denied = boundary_error(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "f")))
    assert denied is not None and str(tmp_path / "f") in str(denied) and "Could not write" not in str(denied)
