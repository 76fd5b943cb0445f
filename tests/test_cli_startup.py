"""The options cache (tl_query_lens/cli/options_cache.py): a cached subcommand parser behaves as a fresh one, and a
warm ``--help`` or argument error imports neither torch nor any config. Speed itself is measured by
benchmarks/bench_cli_startup.py, not asserted here."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap

import pytest

from tl_query_lens.cli import build_parser, main, options_cache, subcommands
from tl_query_lens.commands import COMMANDS

NAMES = sorted(set(subcommands(build_parser(command=""))) - {c.words[0] for c in COMMANDS})  # runner: no cache


def help_texts(parser) -> dict[str, str]:
    """Help of a subcommand parser and of its actions (readout fit, saes train, ...)."""
    texts = {"": parser.format_help()}
    for action, sub in subcommands(parser).items():
        texts[action] = sub.format_help()
    return texts


@pytest.mark.parametrize("name", NAMES)
def test_a_cached_parser_is_the_configured_one(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path))
    monkeypatch.delenv("TLQL_NO_OPTIONS_CACHE", raising=False)
    fresh = options_cache.configure_cached(build_parser(command=""), name)  # configured, then stored
    assert list((tmp_path / "cli").glob(f"{name}-*.pickle"))
    cached = options_cache.configure_cached(build_parser(command=""), name)  # loaded
    assert cached is not fresh and "tlql_configure" not in cached.__dict__
    assert help_texts(cached) == help_texts(fresh)
    assert getattr(cached, "tlql_ranges", None) == getattr(fresh, "tlql_ranges", None)
    assert cached.get_default("func") == fresh.get_default("func") or subcommands(cached)


def test_a_corrupt_cache_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path))
    options_cache.configure_cached(build_parser(command=""), "ffkv")
    (file,) = (tmp_path / "cli").glob("ffkv-*.pickle")
    file.write_bytes(b"not a pickle")
    parser = options_cache.configure_cached(build_parser(command=""), "ffkv")
    assert "--k" in parser.format_help()


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
    for argv in (["ffkv", "--help"], ["readout", "fit", "--help"], ["ffkv", "--k", "0"], ["saes", "train", "--k", "x"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
        heavy = sorted(m for m in ("torch", "transformer_lens", "sae_lens", "tl_query_lens.dictionaries") if m in sys.modules)
        print(" ".join(argv), code, ",".join(heavy) or "-")
""")


def test_a_warm_help_or_argument_error_imports_no_heavy_library(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TLQL_CACHE": str(tmp_path)}
    env.pop("TLQL_NO_OPTIONS_CACHE", None)
    run = lambda: subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900, check=True
    ).stdout.splitlines()
    run()  # the first run configures the parsers (importing torch) and caches them
    lines = run()
    assert len(lines) == 4
    for line in lines:
        *_argv, code, heavy = line.split(" ")
        assert code in ("0", "2") and heavy == "-", line
