"""Start-up: every command's parser is made from torch-free configs, so ``--help``, an unknown option and an
out-of-range number answer from a fresh interpreter without importing torch, TransformerLens or SAELens (and
without any parser cache). Speed itself is measured by benchmarks/bench_cli_startup.py, not asserted here."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap

import pytest

from tl_query_lens.cli import main


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["ffkv", "--k", "0"], "--k must be ≥ 1, got 0"),
        (["certify", "--delta", "1.5"], "--delta must be < 1 (range [1e-300, 1))"),
    ],
)
def test_ranges_are_checked_before_the_command_runs(argv, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert expected in err.getvalue() and len(err.getvalue().strip().splitlines()) == 2


SCRIPT = textwrap.dedent("""
    import contextlib, io, sys
    from tl_query_lens.cli import main
    for argv in (["ffkv", "--help"], ["readout", "fit", "--help"], ["ffkv", "--k", "0"], ["saes", "train", "--k", "x"],
                 ["certify", "--help"], ["atlas", "--help"], ["reproduce", "--help"], ["demo", "--help"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
        heavy = sorted(m for m in ("torch", "transformer_lens", "sae_lens") if m in sys.modules)
        print(" ".join(argv), code, ",".join(heavy) or "-")
""")


def test_help_or_argument_errors_import_no_heavy_library(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TLQL_CACHE": str(tmp_path)}  # an empty user cache
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 8, done.stderr[-2000:]
    for line in lines:
        *_argv, code, heavy = line.split(" ")
        assert code in ("0", "2") and heavy == "-", line
