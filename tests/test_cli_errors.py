"""Every user error of ``tlql`` exits with status 2 and at most two lines naming the fix, before a model is loaded.

``load_model`` is replaced by a function that fails the test, so each case also shows that the check ran first.
The case ids are the rows of docs/reliability.md.
"""

import json
import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from tl_query_lens.cli import main
from tl_query_lens.errors import InputError


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr("tl_query_lens.models.load_model", refuse)


def run_error(capsys, argv):
    """Run ``tlql argv``; return stderr after asserting status 2, no traceback, at most two lines."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    assert lines[0].startswith("tlql ") and "error:" in lines[0]
    return lines[0]


def _sae_folder(path, cfg=None, weights=True):
    path.mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        (path / "cfg.json").write_text(json.dumps(cfg))
    if weights:
        save_file({"W_dec": torch.zeros(4, 8), "W_enc": torch.zeros(8, 4)}, str(path / "sae_weights.safetensors"))
    return path


@pytest.fixture
def files(tmp_path):
    """Bad inputs of every kind, on disk."""
    f = {}
    f["empty_txt"] = tmp_path / "empty.txt"
    f["empty_txt"].write_text("\n\n   \n")
    f["bad_jsonl"] = tmp_path / "bad.jsonl"
    f["bad_jsonl"].write_text('{"text": "fine"}\n{"text": oops}\n')
    f["no_text_jsonl"] = tmp_path / "notext.jsonl"
    f["no_text_jsonl"].write_text('{"text": "fine"}\n{"body": "x"}\n')
    f["latin1_txt"] = tmp_path / "latin1.txt"
    f["latin1_txt"].write_bytes("caf\xe9 au lait".encode("latin-1"))
    f["csv"] = tmp_path / "corpus.csv"
    f["csv"].write_text("a,b\n1,2\n")
    f["empty_dir"] = tmp_path / "empty_dir"
    f["empty_dir"].mkdir()
    f["a_file"] = tmp_path / "a_file"
    f["a_file"].write_text("x")
    f["not_sae"] = tmp_path / "not_sae"
    f["not_sae"].mkdir()
    (f["not_sae"] / "notes.txt").write_text("hello")
    f["no_dtype_sae"] = _sae_folder(tmp_path / "no_dtype", {"d_in": 8, "d_sae": 4, "architecture": "standard"})
    f["truncated_sae"] = _sae_folder(tmp_path / "truncated", {"d_in": 8, "d_sae": 4, "dtype": "float32"})
    data = (f["truncated_sae"] / "sae_weights.safetensors").read_bytes()
    (f["truncated_sae"] / "sae_weights.safetensors").write_bytes(data[: len(data) // 3])
    f["unknown_arch_sae"] = _sae_folder(
        tmp_path / "unknown_arch", {"d_in": 8, "d_sae": 4, "dtype": "float32", "architecture": "mystery"}
    )
    f["bad_json_sae"] = _sae_folder(tmp_path / "bad_json", None)
    (f["bad_json_sae"] / "cfg.json").write_text("{'d_in': 8")
    return f


def _read_only_dir(tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if not os.access(folder, os.W_OK):
        return folder
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):  # root: a read-only file system
        return "/proc/sys"
    pytest.skip("no read-only folder available for this user")


# (case id, argv with {placeholders}, text the message must contain)
CASES = [
    ("layers_open_range", ["ffkv", "--layers", "3-"], "'3-' is not an id or a range"),
    ("layers_reversed", ["ffkv", "--layers", "5-3"], "is empty (start after end); did you mean '3-5'"),
    ("layers_empty", ["ffkv", "--layers", ""], "--layers is empty"),
    ("layers_empty_item", ["ffkv", "--layers", "1,,2"], "'' is not an id"),
    ("layers_words", ["ffkv", "--layers", "first"], "'first' is not an id"),
    ("layers_out_of_range", ["ffkv", "--layers", "0-40"], "--layers 0-40 out of range; valid: 0..29"),
    (
        "features_out_of_range",
        ["query-lens", "--features", "0-5000"],
        "--features 0-5000 out of range; valid: 0..1535",
    ),
    ("features_negative", ["query-lens", "--features", "-1"], "'-1' is not an id"),
    ("sources_out_of_range", ["ql-channels", "--sources", "30"], "--sources 30 out of range"),
    ("corpus_missing", ["ffkv", "--corpus", "/nonexistent.txt"], "/nonexistent.txt: no such file or folder"),
    ("corpus_empty_txt", ["ffkv", "--corpus", "{empty_txt}"], "holds no documents"),
    ("corpus_bad_jsonl_line", ["ffkv", "--corpus", "{bad_jsonl}"], "bad.jsonl:2: line 2 is not valid JSON"),
    (
        "corpus_jsonl_no_text",
        ["ffkv", "--corpus", "{no_text_jsonl}"],
        "notext.jsonl:2: line 2 has no 'text' field",
    ),
    ("corpus_not_utf8", ["ffkv", "--corpus", "{latin1_txt}"], "is not UTF-8 text"),
    ("corpus_wrong_suffix", ["ffkv", "--corpus", "{csv}"], "corpus files are .txt"),
    ("corpus_empty_folder", ["ffkv", "--corpus", "{empty_dir}"], "holds no .txt or .jsonl files"),
    ("out_is_file", ["ffkv", "--out", "{a_file}"], "is a file, not a folder"),
    ("out_under_file", ["query-lens", "--out", "{a_file}/sub"], "cannot be created"),
    ("cache_dir_is_file", ["query-lens", "--cache-dir", "{a_file}"], "--cache-dir"),
    (
        "certify_not_an_sae",
        ["certify", "--dictionary", "{not_sae}"],
        "holds no cfg.json, so it is not a saved SAE",
    ),
    ("certify_empty_folder", ["certify", "--dictionary", "{empty_dir}"], "holds no cfg.json"),
    ("certify_cfg_without_dtype", ["certify", "--dictionary", "{no_dtype_sae}"], "lacks ['dtype']"),
    (
        "certify_truncated_weights",
        ["certify", "--dictionary", "{truncated_sae}"],
        "is not a readable safetensors",
    ),
    (
        "certify_unknown_architecture",
        ["certify", "--dictionary", "{unknown_arch_sae}"],
        "architecture 'mystery'",
    ),
    ("certify_cfg_not_json", ["certify", "--dictionary", "{bad_json_sae}"], "cfg.json: is not valid JSON"),
    (
        "certify_missing_folder",
        ["certify", "--dictionary", "ffkv,/no/such/sae"],
        "neither 'ffkv' nor an existing",
    ),
    (
        "certify_unknown_release",
        ["certify", "--dictionary", "no-such-release:blocks.6.hook_resid_post"],
        "is not a SAELens release known here",
    ),
    (
        "ql_evaluate_missing_folder",
        ["ql-evaluate", "--dictionary", "ffkv", "--dictionary", "/no/such/sae"],
        "neither 'ffkv' nor an existing",
    ),
    ("certify_too_few_sequences", ["certify", "--n-eval", "10"], "the minimum is N ="),
    ("certify_delta", ["certify", "--delta", "1.5"], "--delta must be < 1 (range [1e-300, 1))"),
    ("certify_delta_subnormal", ["certify", "--delta", "1e-320"], "--delta must be ≥ 1e-300"),
    ("n_seqs_zero", ["ffkv", "--n-seqs", "0"], "--n-seqs must be ≥ 1"),
    ("seed_negative", ["ffkv", "--seed", "-1"], "--seed must be ≥ 0"),
    ("seq_len_beyond_context", ["ffkv", "--seq-len", "5000"], "exceeds the model context 2048"),
    ("skip_all_positions", ["query-lens", "--seq-len", "8", "--skip-positions", "8"], "leaves no position"),
    ("unknown_model", ["ffkv", "--model", "no-such-model-xyz"], "neither the embedded model"),
    ("bad_device", ["ffkv", "--device", "gpu0"], "is not a torch device"),
    ("kl_targets_not_numbers", ["ql-evaluate", "--kl-targets", "0.25,x"], "'x' is not a number"),
    ("too_many_prompts", ["ql-evaluate", "--n-prompts", "99"], "neutral prompts exist"),
    ("unknown_fit", ["ql-channels", "--fits", "closed_form,lbfgs"], "use 'closed_form', 'adam'"),
    ("unknown_baseline", ["readout", "eval", "--baselines", "pca256,nope"], "['nope'] unknown"),
    (
        "paper_baseline_under_own_protocol",
        ["readout", "eval", "--baselines", "nearest_row_ridge_excl_contrast"],
        "unknown for --protocol mixed-layers",
    ),
    (
        "own_baseline_not_in_paper_protocol",
        ["readout", "eval", "--protocol", "paper", "--baselines", "nearest_row_ridge,shuffled_codes"],
        "['shuffled_codes'] unknown for --protocol paper",
    ),
    (
        "readout_id_not_cached",
        ["readout", "decompose", "hello", "--sae-id", "never-fitted"],
        "No readout SAE 'never-fitted'",
    ),
    ("readout_path_not_sae", ["readout", "eval", "--sae-path", "{not_sae}"], "holds no cfg.json"),
    # numbers checked against the (embedded) model before it loads, names kept inside their folders
    ("query_lens_k_beyond_vocab", ["query-lens", "--k", "60000"], "--k must be ≤ 49152"),
    ("ffkv_k_beyond_width", ["ffkv", "--k", "5000"], "--k must be ≤ 1536"),
    ("certify_k_beyond_width", ["certify", "--k", "5000"], "--k must be ≤ 1536"),
    ("saes_compare_k_beyond_width", ["saes", "compare", "--k", "5000"], "--k must be ≤ 1536"),
    ("ql_evaluate_k_beyond_vocab", ["ql-evaluate", "--k", "60000"], "--k must be ≤ 49152"),
    ("ql_evaluate_features_per_layer", ["ql-evaluate", "--features-per-layer", "5000"], "must be ≤ 1536"),
    ("ql_evaluate_too_few_sequences", ["ql-evaluate", "--n-seqs", "2"], "Raise --n-seqs to ≥ 20"),
    (
        "ql_channels_one_destination",
        ["ql-channels", "--sources", "28", "--fits", "closed_form"],
        "to block 29 only",
    ),
    ("ql_channels_module_one_source", ["ql-channels", "--sources", "3", "--destination", "module"], "share no block"),
    ("ql_channels_no_block_after", ["ql-channels", "--sources", "29"], "no block after them"),
    ("readout_fit_width_below_k", ["readout", "fit", "--width", "8", "--k", "128"], "width=8 must be at least k=128"),
    ("readout_fit_sae_id_outside", ["readout", "fit", "--sae-id", "../../../x"], "would leave its folder"),
    ("readout_decompose_sae_id_outside", ["readout", "decompose", "hi", "--sae-id", "../../x"], "would leave its"),
    ("readout_decompose_empty_prompt", ["readout", "decompose", ""], "the prompt is empty"),
    ("readout_decompose_empty_token", ["readout", "decompose", "hi", "--token", ""], "--token got an empty string"),
    ("readout_decompose_empty_contrast", ["readout", "decompose", "hi", "--vocab-contrast", ""], "empty string"),
    ("readout_decompose_empty_group_item", ["readout", "decompose", "hi", "--group", " a", ""], "--group got an"),
    ("readout_decompose_margin_self", ["readout", "decompose", "hi", "--margin", " a", " a"], "against itself is 0"),
    ("readout_eval_sae_id_outside", ["readout", "eval", "--sae-id", "a/b"], "contains a path separator"),
    ("saes_train_d_sae_zero", ["saes", "train", "--d-sae", "0"], "--d-sae must be ≥ 1"),
    ("saes_train_unknown_kind", ["saes", "train", "--kinds", "foo"], "kinds must be a non-empty subset"),
    ("saes_train_k_beyond_d_sae", ["saes", "train", "--d-sae", "64", "--k", "65"], "k must be in 1..d_sae=64"),
    ("demo_layer_beyond_model", ["demo", "--ql-layer", "40"], "--ql-layer must be < 30"),
    ("demo_k_beyond_width", ["demo", "--k", "99999"], "--k must be ≤ 1536"),
    ("demo_seq_len_beyond_context", ["demo", "--quick", "--seq-len", "5000"], "--seq-len must be ≤ 2048"),
    ("saes_train_lr_nan", ["saes", "train", "--lr", "nan"], "--lr must be > 0"),
]


@pytest.mark.parametrize("case,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_user_error_exits_2_before_loading_a_model(case, argv, expected, files, no_model, capsys, tmp_path):
    argv = [a.format(**files) for a in argv]
    train = argv[:2] == ["saes", "train"]  # no --out, no W&B
    if "--out" not in argv and argv[0] != "readout" and not train:
        argv += ["--out", str(tmp_path / "out")]
    line = run_error(capsys, argv + ["--no-wandb"] * (not train))
    assert expected in line


def test_out_read_only_folder(no_model, capsys, tmp_path):
    folder = _read_only_dir(tmp_path)
    line = run_error(capsys, ["ffkv", "--out", f"{folder}/results", "--no-wandb"])
    assert "cannot be written" in line and "read-only" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_device_without_cuda(no_model, capsys, tmp_path):
    line = run_error(capsys, ["ffkv", "--device", "cuda", "--out", str(tmp_path), "--no-wandb"])
    assert "CUDA is not available here; use --device cpu" in line


def test_debug_shows_the_traceback(no_model, tmp_path):
    with pytest.raises(InputError, match="did you mean '3-5'"):
        main(["ffkv", "--layers", "5-3", "--out", str(tmp_path), "--debug"])


def test_argparse_errors_also_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["ffkv", "--k", "many"])
    assert info.value.code == 2 and "invalid int value" in capsys.readouterr().err


def test_bugs_keep_their_traceback(monkeypatch, tmp_path):
    """Errors that are not the user's (here a RuntimeError inside the command) are not swallowed."""

    def broken(*args, **kwargs):
        raise RuntimeError("internal bug")

    monkeypatch.setattr("tl_query_lens.models.load_model", broken)
    with pytest.raises(RuntimeError, match="internal bug"):
        main(["ffkv", "--layers", "0", "--out", str(tmp_path), "--no-wandb"])
