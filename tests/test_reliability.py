"""Reliability, round two (docs/reliability.md): no silent wrong results, no lost work, nothing written or read outside its
folder. Each test is a row of docs/reliability.md; the comparisons are against independent computations (a fresh
operator sweep, Python's own JSON parser, the file system), never against the code under test."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sae_lens import JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.saes.sae import SAEMetadata

import tl_query_lens
from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import main
from tl_query_lens.corpus import read_documents
from tl_query_lens.dictionaries import FFKV, as_key_value
from tl_query_lens.errors import (
    CorruptFileError,
    InputError,
    InputTypeError,
    LockedError,
    NonFiniteError,
    OutOfRangeError,
    UnavailableError,
    WriteError,
    check_ids,
)
from tl_query_lens.models import weights_fingerprint
from tl_query_lens.operators import engine, value_operators
from tl_query_lens.paths import atomic_write, folder_lock, plain_name, result_name, result_names
from tl_query_lens.results import write_json, write_tensors

HOOKS = ["hook_embed", "blocks.1.hook_resid_post"]


# --- silent wrong results -------------------------------------------------------------------------------------------


def test_operator_cache_tells_apart_models_that_share_a_name(tmp_path):
    """Two models built from one config are both "custom": B must not get A's cached operators."""
    model_a, model_b = tiny_model("gelu_ln"), tiny_model("gelu_ln")
    with torch.no_grad():  # B: the same config and name, other weights (as a fine-tuned copy would have)
        for p in model_b.parameters():
            p.mul_(1.25)
    assert model_a.cfg.model_name == model_b.cfg.model_name
    tokens = tiny_tokens(model_a, n_seqs=2, seq_len=8)
    ops_a = value_operators(model_a, tokens, HOOKS, cache_dir=tmp_path, progress=False)
    ops_b = value_operators(model_b, tokens, HOOKS, cache_dir=tmp_path, progress=False)
    fresh_b = value_operators(model_b, tokens, HOOKS, progress=False)  # no cache: the independent reference
    for hook in HOOKS:
        assert torch.allclose(ops_b.sums[hook], fresh_b.sums[hook])
        assert not torch.allclose(ops_a.sums[hook], ops_b.sums[hook])
    assert len(list(tmp_path.glob("value-*.safetensors"))) == 2


def test_operator_cache_misses_after_fine_tuning_in_place(tmp_path, monkeypatch):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    value_operators(model, tokens, HOOKS, cache_dir=tmp_path, progress=False)
    before = weights_fingerprint(model)
    assert weights_fingerprint(model) == before  # stable while nothing changes
    with torch.no_grad():
        model.blocks[1].mlp.W_out[0, 0] += 1e-3  # one weight, in place
    assert weights_fingerprint(model) != before
    calls = []
    original = engine._run_sweep
    monkeypatch.setattr(engine, "_run_sweep", lambda *a, **k: calls.append(1) or original(*a, **k))
    value_operators(model, tokens, HOOKS, cache_dir=tmp_path, progress=False)
    assert calls, "the operators of the edited model came from the cache of the old one"


def jumprelu(d_in: int = 16, d_sae: int = 24) -> JumpReLUSAE:
    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae


def test_nan_threshold_of_a_jumprelu_sae_is_refused_and_named():
    sae = jumprelu()
    as_key_value(sae)  # finite: accepted
    with torch.no_grad():
        sae.threshold[3] = float("nan")
    with pytest.raises(NonFiniteError, match="threshold"):
        as_key_value(sae)


@pytest.mark.parametrize("variant,tensor", [("normalized", "act_scale"), ("vanilla", "b_post")])
def test_nan_in_an_ffkv_scale_is_blamed_on_the_dictionary(variant, tensor):
    model = tiny_model("gated_rms")
    sae = FFKV.from_model(model, 1, variant)
    with torch.no_grad():
        getattr(sae, tensor).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=rf"dictionary .*{tensor}"):
        as_key_value(sae, model)


def test_nan_in_post_norm_weights_is_named():
    model = tiny_model("gated_rms")
    sae = FFKV.from_model(model, 1, "vanilla")
    sae.post_norm_w = torch.nn.Parameter(torch.ones(model.cfg.d_model))  # as a Gemma-2 FF-KV carries
    with torch.no_grad():
        sae.post_norm_w[2] = float("inf")
    with pytest.raises(NonFiniteError, match="post_norm_w"):
        as_key_value(sae)


@pytest.mark.parametrize(
    "ids,error",
    [
        ([1.9, 2.2], InputTypeError),
        (torch.tensor([1.9, 2.2]), InputTypeError),
        (torch.tensor([True, False, True]), InputTypeError),
        ([True, False], InputTypeError),
        (["3"], InputTypeError),
        ([0, 24], OutOfRangeError),
        ([-1], OutOfRangeError),
    ],
    ids=["floats", "float_tensor", "bool_mask", "bool_list", "strings", "too_large", "negative"],
)
def test_feature_ids_must_be_integers_in_range(ids, error):
    view = as_key_value(jumprelu())
    with pytest.raises(error):
        view.feature_ids(ids)


def test_integer_feature_ids_of_every_kind_are_accepted():
    import numpy as np

    view = as_key_value(jumprelu())
    expected = torch.tensor([1, 5])
    for ids in ([1, 5], (1, 5), range(1, 6, 4), torch.tensor([1, 5]), np.array([1, 5]), [np.int64(1), 5]):
        assert torch.equal(view.feature_ids(ids), expected)
    assert check_ids(7, 8) == [7]


@pytest.mark.parametrize("line", ['{"text": null}', '{"text": 12345}', '{"text": ["a"]}', '{"text": {"a": 1}}'])
def test_jsonl_texts_that_are_not_strings_are_refused(tmp_path, line):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(CorruptFileError, match=r"c\.jsonl:2.*not a string"):
        read_documents(corpus)


def test_texts_given_directly_must_be_strings():
    assert read_documents(["a", "b"]) == ["a", "b"]
    with pytest.raises(InputError, match="not a string"):
        read_documents(["a", None])


def test_a_fifo_as_corpus_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(target=lambda: done.append(_raises(read_documents, fifo)), daemon=True)
    worker.start()
    worker.join(10)
    assert done == ["InputError"], "reading a FIFO blocked or did not refuse"


def _raises(fn, *args) -> str:
    try:
        fn(*args)
    except InputError:
        return "InputError"
    return "returned"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_as_corpus_is_refused():
    with pytest.raises(InputError, match="not a regular file"):
        read_documents("/dev/zero")


def test_corpus_files_are_read_up_to_a_bound(tmp_path, monkeypatch):
    from tl_query_lens import corpus

    big = tmp_path / "big.txt"
    big.write_text("word " * 100)
    monkeypatch.setattr(corpus, "MAX_FILE_BYTES", 64)
    with pytest.raises(InputError, match="larger than"):
        read_documents(big)


# --- names and folders ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "..", ".", "../x", "a/b", "a\\b", "x\x00y", "line\nbreak", "a" * 201])
def test_plain_names_refuse_paths(name):
    with pytest.raises(InputError):
        plain_name(name, "--sae-id")


def test_plain_names_accept_sae_ids():
    for name in ("blocks.12.hook_resid_post", "small", "layer_3-width_16k", "é"):
        assert plain_name(name) == name


def test_the_issue_labels_get_two_folders():
    names = result_names(["sae L12 a-b", "sae L12 a_b"])
    assert len(set(names)) == 2
    assert result_names(["x/a-b", "y/a_b"])[0] != result_names(["x/a-b", "y/a_b"])[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=30), min_size=2, max_size=6, unique=True))
def test_result_names_are_one_to_one_or_refused(labels):
    try:
        names = result_names(labels)
    except InputError as err:
        assert "same folder" in str(err)  # only a case-insensitive clash of kept labels is refused
        return
    assert len({n.casefold() for n in names}) == len(labels)
    for name in names:
        plain_name(name)  # every folder name is one path component
        assert name not in (".", "..")


def test_result_names_refuse_case_clashes_and_repeats():
    with pytest.raises(InputError, match="same folder"):
        result_names(["Layer", "layer"])
    with pytest.raises(InputError, match="more than once"):
        result_names(["a", "a"])
    assert result_name("blocks.3") == "blocks.3"


def test_cached_paths_refuse_ids_that_leave_the_cache():
    from tl_query_lens.readout.registry import cached_sae_path

    with pytest.raises(InputError, match="sae_id"):
        cached_sae_path("smollm2-135m", "../../../x")
    assert cached_sae_path("smollm2-135m", "small").name == "small"


def test_nested_result_entries_cannot_point_outside(tmp_path):
    from tl_query_lens.dictionaries.splice import FFKVSummary, SpliceMetrics

    names = ("alive_rate", "mean_l0", "explained_variance", "ce_clean", "ce_spliced", "ce_delta", "kl")
    metrics = SpliceMetrics(**dict.fromkeys(names, 0.5), n_tokens=16)
    FFKVSummary(k=4, sparse={2: metrics}, dense={}).save(tmp_path / "r")
    record = json.loads((tmp_path / "r" / "result.json").read_text())
    (tmp_path / "elsewhere").mkdir()
    for bad in ("../elsewhere", str(tmp_path / "elsewhere"), "sparse/../../elsewhere"):
        record["nested"]["sparse"]["entries"][0][1] = bad
        (tmp_path / "r" / "result.json").write_text(json.dumps(record))
        with pytest.raises(InputError, match="outside|not a folder inside"):
            FFKVSummary.load(tmp_path / "r")


# --- writes ---------------------------------------------------------------------------------------------------------


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_full_disk_leaves_no_tmp_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    write_json(target, {"old": 1})
    with pytest.raises(WriteError, match=r"r\.json.*disk is full"), atomic_write(target) as handle:
        handle.write('{"new": ')
        raise OSError(errno.ENOSPC, "No space left on device")
    assert json.loads(target.read_text()) == {"old": 1}
    assert _leftovers(tmp_path) == []


def test_an_interrupt_during_a_write_leaves_no_tmp(tmp_path):
    target = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt), atomic_write(target) as handle:
        handle.write("{")
        raise KeyboardInterrupt
    assert not target.exists() and _leftovers(tmp_path) == []


def test_a_failing_tensor_write_leaves_no_tmp(tmp_path, monkeypatch):
    from tl_query_lens import results

    def full(tensors, path, metadata=None):
        with open(path, "wb") as handle:
            handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "save_file", full)
    with pytest.raises(WriteError, match="t.safetensors"):
        write_tensors(tmp_path / "t.safetensors", {"x": torch.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_a_full_cache_dir_keeps_the_finished_operator_batches(tmp_path, monkeypatch):
    """ENOSPC while the cache is written: the error names the file; the minibatches saved before it remain."""
    from tl_query_lens.operators import store

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=4)
    original, calls = store.write_tensors, []

    def fill_up(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise WriteError(errno.ENOSPC, f"Could not write {path}: the disk is full")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(store, "write_tensors", fill_up)
    with pytest.raises(WriteError, match="disk is full"):
        value_operators(model, tokens, HOOKS, batch_size=1, cache_dir=tmp_path, progress=False)
    files = list(tmp_path.glob("value-*.safetensors"))
    assert len(files) == 1 and _leftovers(tmp_path) == []
    from tl_query_lens.operators import OperatorSet

    assert OperatorSet.load(files[0]).batches_done == 1  # the finished minibatch is kept for the rerun


def test_a_second_writer_of_one_folder_is_refused(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from tl_query_lens.paths import folder_lock
            with folder_lock({str(tmp_path / "out")!r}):
                print("locked", flush=True)
                time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError, match=f"pid {holder.pid}"), folder_lock(tmp_path / "out"):
            pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path / "out"):  # the holder died (even by SIGKILL): the folder is free again
        pass


# --- devices --------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_loading_an_sae_onto_missing_cuda_says_so(tmp_path):
    from tl_query_lens.dictionaries.saved import load_sae

    jumprelu().save_model(tmp_path / "sae")
    with pytest.raises(UnavailableError, match="CUDA is not available"):
        load_sae(tmp_path / "sae", device="cuda")
    with pytest.raises(UnavailableError, match="not a torch device"):
        load_sae(tmp_path / "sae", device="gpu0")
    assert load_sae(tmp_path / "sae", device="cpu").cfg.d_sae == 24


# --- the command line: interrupts, locks, environment --------------------------------------------------------------


@pytest.fixture
def tiny_loaders(monkeypatch):
    model = tiny_model("gated_rms")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)

    def tokens(*a, n_seqs, seq_len, **kw):
        return tiny_tokens(model, n_seqs, seq_len)

    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", tokens)
    return model


FFKV_ARGV = ["ffkv", "--model", "gpt2", "--layers", "0", "--n-seqs", "2", "--seq-len", "8", "--k", "4", "--no-wandb"]


def test_ctrl_c_in_ffkv_saves_the_finished_layers(tmp_path, tiny_loaders, monkeypatch, capsys):
    from tl_query_lens.dictionaries import splice
    from tl_query_lens.dictionaries.splice import FFKVSummary

    original = splice.ffkv_summary

    def interrupted_at_layer_2(model, layers, *args, **kwargs):
        if 2 in layers:
            raise KeyboardInterrupt
        return original(model, layers, *args, **kwargs)

    monkeypatch.setattr(splice, "ffkv_summary", interrupted_at_layer_2)
    out = tmp_path / "out"
    argv = [*FFKV_ARGV, "--out", str(out), "--layers", "1-2"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tlql ")]  # the rest: progress bars
    assert len(lines) == 1 and "interrupted (SIGINT)" in lines[0] and "--layers 2" in lines[0], err
    assert "Traceback" not in err
    saved = FFKVSummary.load(out)
    assert sorted(saved.sparse) == [1]
    reference = original(tiny_loaders, [1], tl_query_lens.corpus.load_corpus(n_seqs=2, seq_len=8), k=4)
    assert saved.sparse[1].ce_spliced == pytest.approx(reference.sparse[1].ce_spliced)


def test_sigterm_exits_143_with_one_line(tmp_path, monkeypatch, capsys):
    from tl_query_lens.dictionaries import splice

    def killed(model, cfg):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
        return 0

    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: None)  # the run is the stand-in
    monkeypatch.setattr(splice, "run_ffkv", killed)
    previous = signal.getsignal(signal.SIGTERM)
    assert main([*FFKV_ARGV, "--out", str(tmp_path / "o")]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted (SIGTERM)" in err[0] and "rerun" in err[0]
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back


def test_two_runs_into_one_out_folder(tmp_path, tiny_loaders, capsys):
    out = tmp_path / "out"
    with folder_lock(out):
        assert main([*FFKV_ARGV, "--out", str(out)]) == 2
    line = capsys.readouterr().err.splitlines()[0]
    assert "is being written by pid" in line
    assert main([*FFKV_ARGV, "--out", str(out)]) == 0  # once the first run has finished


@pytest.mark.parametrize(
    "out,expected",
    [("/proc/tlql-out", "under /proc"), ("{tmp}/" + "d" * 300, "255"), ("{tmp}/file.txt/sub", "not a folder")],
    ids=["proc", "long_name", "under_a_file"],
)
def test_unusable_out_folders_exit_2(tmp_path, out, expected, capsys, monkeypatch):
    monkeypatch.setattr("tl_query_lens.models.load_model", _no_model)
    (tmp_path / "file.txt").write_text("x")
    assert main([*FFKV_ARGV, "--out", out.format(tmp=tmp_path)]) == 2
    assert expected in capsys.readouterr().err


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the arguments were checked")


def test_a_bad_wandb_mode_exits_2_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tl_query_lens.models.load_model", _no_model)
    monkeypatch.setenv("WANDB_MODE", "garbage")
    argv = [a for a in FFKV_ARGV if a != "--no-wandb"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "WANDB_MODE='garbage'" in err[0] and len(err) <= 2
    assert not (tmp_path / "o").exists()  # the folder this run would have made is not left behind


def test_non_finite_values_round_trip_through_standard_json(tmp_path):
    values = {"a": math.inf, "b": [-math.inf, 1.5], "c": {"d": math.nan}}
    path = write_json(tmp_path / "x.json", values)
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    from tl_query_lens.results import read_json

    back = read_json(path)
    assert back["a"] == math.inf and back["b"] == [-math.inf, 1.5] and math.isnan(back["c"]["d"])


# --- every subcommand ------------------------------------------------------------------------------------------------

from tests.test_cli_fuzz import COMMANDS  # the parsers of every subcommand, read once


def _has(name: str, dest: str) -> bool:
    return any(a.dest == dest for a in COMMANDS[name][0]._actions)


CASES = {
    "out_under_proc": ("out", lambda tmp, paths: ["--out", "/proc/tlql-out"], "under /proc"),
    "out_name_too_long": ("out", lambda tmp, paths: ["--out", str(tmp / ("d" * 300))], "255"),
    "out_locked": ("out", lambda tmp, paths: ["--out", str(tmp / "locked")], "being written by"),
    "wandb_mode_garbage": ("wandb", lambda tmp, paths: ["--out", str(tmp / "o")], "WANDB_MODE='garbage'"),
    "corpus_fifo": ("corpus", lambda tmp, paths: ["--corpus", paths["fifo"]], "not a regular file"),
    "corpus_dev_zero": ("corpus", lambda tmp, paths: ["--corpus", "/dev/zero"], "not a regular file"),
    "corpus_null_text": ("corpus", lambda tmp, paths: ["--corpus", paths["null"]], "not a string"),
    "corpus_number_text": ("corpus", lambda tmp, paths: ["--corpus", paths["number"]], "not a string"),
    "seed_negative": ("seed", lambda tmp, paths: ["--seed", "-1"], "--seed must be ≥ 0"),
}
EVERY = [(case, name) for case, (dest, _, _) in CASES.items() for name in sorted(COMMANDS) if _has(name, dest)]


@pytest.fixture
def bad_corpora(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    (tmp_path / "null.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    (tmp_path / "number.jsonl").write_text('{"text": 12345}\n')
    return {"fifo": str(fifo), "null": str(tmp_path / "null.jsonl"), "number": str(tmp_path / "number.jsonl")}


@pytest.mark.parametrize("case,name", EVERY, ids=[f"{c}-{n.replace(' ', '_')}" for c, n in EVERY])
def test_every_subcommand_refuses_before_loading_a_model(case, name, tmp_path, bad_corpora, monkeypatch, capsys):
    import tl_query_lens.models
    from tl_query_lens import demo

    for module in (tl_query_lens, tl_query_lens.models, demo):
        monkeypatch.setattr(module, "load_model", _no_model)
    _dest, extra, expected = CASES[case]
    argv = [*name.split(), *extra(tmp_path, bad_corpora)]
    if case == "wandb_mode_garbage":
        monkeypatch.setenv("WANDB_MODE", "garbage")
    elif _has(name, "wandb"):
        argv.append("--no-wandb")
    if _has(name, "out") and "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    if _has(name, "prompt"):
        argv.append("The capital of France is")
    with folder_lock(tmp_path / "locked") if case == "out_locked" else contextlib.nullcontext():
        assert main(argv) == 2, argv
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert expected in lines[0] and len(lines) <= 2 and "Traceback" not in err, (argv, err)


POST_LOAD = [
    ("ffkv_k", ["ffkv", "--k", "5000", "--layers", "0"], "--k 5000 is too large for gpt2: it has 64 MLP"),
    ("query_lens_k", ["query-lens", "--k", "60000", "--layers", "0", "--features", "0-2"], "it has 61 vocabulary"),
    (
        "ql_evaluate_features_per_layer",
        ["ql-evaluate", "--features-per-layer", "5000", "--layers", "0", "--n-seqs", "20"],
        "exceeds the 64 features",
    ),
    ("ql_channels_one_destination", ["ql-channels", "--sources", "1"], "to block 2 only"),
    ("ql_channels_last_layer", ["ql-channels", "--sources", "2"], "no block after them"),
    ("certify_k", ["certify", "--k", "5000", "--layers", "0", "--n-eval", "100"], "exceeds the 64 features"),
    (
        "saes_compare_k",
        ["saes", "compare", "--k", "5000", "--release", "", "--layers", "0"],
        "--k 5000 is too large for gpt2",
    ),
]


@pytest.mark.parametrize("case,argv,expected", POST_LOAD, ids=[c[0] for c in POST_LOAD])
def test_model_size_limits_after_loading_another_model(case, argv, expected, tmp_path, monkeypatch, capsys):
    """Sizes of a model known only once loaded ("gpt2" here is a tiny random model): checked before any corpus."""
    model = tiny_model("gated_rms")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)

    def no_corpus(*args, **kwargs):
        raise AssertionError("the corpus was loaded before the sizes were checked")

    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", no_corpus)
    assert main([*argv, "--model", "gpt2", "--out", str(tmp_path / "o"), "--no-wandb"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_a_trailing_newline_is_not_a_plain_name():
    """``$`` matches before a final newline: ``"0\\n"`` must get a hashed folder name, not itself (Hypothesis found it)."""
    assert result_name("0\n") != "0\n"
    plain_name(result_name("0\n"))
