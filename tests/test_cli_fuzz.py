"""Hypothesis-generated command lines for every ``tlql`` subcommand: each run exits 0 or 2 with at most two lines on
stderr, never with a traceback, and a number outside its option's range is refused before any model is loaded.

Loading a model is replaced by a function that raises :class:`ModelLoaded`: a command line that gets that far has
passed every check (the run stops there). The options and their ranges are read from the parser and from the
``RANGES`` of the configs that added them, so new options are fuzzed without editing this file. More examples:
``TLQL_FUZZ_EXAMPLES=500 pytest tests/test_cli_fuzz.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import math
import os
import sys
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl_query_lens import demo
from tl_query_lens.cli import SUBCOMMANDS, build_parser, main, subcommands
from tl_query_lens.cli import options as cli_options
from tl_query_lens.commands import COMMANDS as RUNNER_COMMANDS
from tl_query_lens.config import in_interval

EXAMPLES = int(os.environ.get("TLQL_FUZZ_EXAMPLES", "12"))
# Where the command line gives a value another meaning than its config's range (documented in the option's help).
CLI_RANGES = {("saes train", "n_seqs"): "[0, inf)"}  # --n-seqs 0: every window of the train split


class ModelLoaded(Exception):
    """Every check passed: the command asked for its model."""


def _loaded(*args, **kwargs):
    raise ModelLoaded


def commands() -> dict[str, tuple[argparse.ArgumentParser, dict[str, str]]]:
    """``"readout fit"`` → (its parser, option dest → interval of the config that added the option)."""
    originals = cli_options.add_options
    added: dict[int, dict[str, str]] = {}

    def recording(parser, cls, **kwargs):
        before = set(parser._option_string_actions)
        taken = originals(parser, cls, **kwargs)
        ranges = getattr(cls, "RANGES", {})
        for flag in set(parser._option_string_actions) - before:
            dest = parser._option_string_actions[flag].dest
            if dest in ranges:
                added.setdefault(id(parser), {})[dest] = ranges[dest]
        return taken

    for module_name in SUBCOMMANDS:  # imported first, so that their `add_options` can be wrapped
        __import__(f"tl_query_lens.cli.{module_name}")
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("tl_query_lens.cli") and m is not None]
    patched = [m for m in modules if getattr(m, "add_options", None) is originals]
    for module in patched:
        module.add_options = recording
    try:
        parser = build_parser()
    finally:
        for module in patched:
            module.add_options = originals
    on_runner = {command.name: config_ranges(command.config_class()) for command in RUNNER_COMMANDS}
    found = {}
    for name, sub in subcommands(parser).items():
        actions = subcommands(sub)
        for full, p in ({f"{name} {a}": q for a, q in actions.items()} if actions else {name: sub}).items():
            ranges = dict(added.get(id(p), {}))
            dests = {a.dest for a in p._actions}
            ranges.update({dest: r for dest, r in on_runner.get(full, {}).items() if dest in dests})
            ranges.update({dest: r for (cmd, dest), r in CLI_RANGES.items() if cmd == full})
            found[full] = (p, ranges)
    return found


def config_ranges(cls: type) -> dict[str, str]:
    """Field → range of a command's config and the configs it nests (the first config that names a field wins, as
    the option it makes does)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            for name, interval in config_ranges(hints[f.name]).items():
                out.setdefault(name, interval)
        elif f.name in getattr(cls, "RANGES", {}):
            out.setdefault(f.name, cls.RANGES[f.name])
    return out


COMMANDS = commands()
TRICKY_TEXT = [
    "", " ", "0", "-1", "1.5", "0-3", "3-", "5-3", "1,,2", "all", "nan", "inf", "ffkv", "ffkv:99", "ffkv:1:topk:0",
    "../../x", "x/a-b,y/a_b", "a" * 300, "/proc/tlql", "/dev/zero", "embedded", "blocks.3.hook_resid_post", "é",
]  # fmt: skip


def value_for(action: argparse.Action) -> st.SearchStrategy:
    junk = st.sampled_from(TRICKY_TEXT)
    if action.choices:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), junk)
    if action.type is int:
        return st.one_of(st.integers(-3, 70_000).map(str), st.sampled_from(["-1", "0", "2", "99999999999"]), junk)
    if action.type is float:
        numbers = st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr)
        return st.one_of(numbers, st.sampled_from(["0", "1", "-0.5", "0.5", "1e9"]), junk)
    return junk


@st.composite
def command_lines(draw, name: str, folder: str, paths: dict[str, str]):
    parser, _ = COMMANDS[name]
    optional = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "out")]
    chosen = draw(st.lists(st.sampled_from(optional), max_size=3, unique_by=lambda a: a.dest)) if optional else []
    argv = name.split()
    for action in chosen:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        elif action.dest == "corpus":
            argv += [flag, draw(st.sampled_from([*paths.values(), "embedded", "stdlib", "/dev/zero"]))]
        else:
            argv += [flag, draw(value_for(action))]
    if any(a.dest == "prompt" for a in parser._actions):
        argv.append("The capital of France is")
    return [*argv, "--out", folder, "--no-wandb"] if "--no-wandb" in parser._option_string_actions else argv


def out_of_range(argv: list[str], name: str) -> list[str]:
    """The options of ``argv`` whose number lies outside the range of the config that made the option."""
    parser, ranges = COMMANDS[name]
    bad = []
    for flag, value in itertools.pairwise(argv):
        action = parser._option_string_actions.get(flag)
        if action is None or action.dest not in ranges or action.type not in (int, float):
            continue
        try:
            number = action.type(value)
        except ValueError:
            continue  # argparse refuses it (exit 2) before any config
        if not (math.isfinite(number) and in_interval(number, ranges[action.dest])):
            bad.append(f"{flag} {value}")
    return bad


@pytest.fixture
def paths(tmp_path):
    """Corpora that must be refused: a pipe, texts that are not strings, an empty file."""
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    null = tmp_path / "null.jsonl"
    null.write_text('{"text": "fine"}\n{"text": null}\n')
    number = tmp_path / "number.jsonl"
    number.write_text('{"text": 12345}\n')
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    return {"fifo": str(fifo), "null": str(null), "number": str(number), "empty": str(empty)}


@pytest.fixture
def no_model(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path_factory.mktemp("cache")))  # locks taken before loading stay here
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))  # relative paths a command line names stay here too
    monkeypatch.setattr("tl_query_lens.load_model", _loaded)
    monkeypatch.setattr("tl_query_lens.models.load_model", _loaded)
    monkeypatch.setattr(demo, "load_model", _loaded)


def run(argv: list[str]) -> tuple[int | str, str]:
    """(exit status, or "model" when the checks passed; stderr) of ``tlql argv``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status: int | str = main(argv)
        except SystemExit as exit_:  # argparse: bad syntax, unknown option, --help
            status = int(exit_.code or 0)
        except ModelLoaded:
            status = "model"
    return status, err.getvalue()


def test_every_subcommand_is_fuzzed():
    assert {"ffkv", "query-lens", "ql-evaluate", "ql-channels", "certify", "demo"} <= set(COMMANDS)
    assert {"readout fit", "readout decompose", "readout eval", "saes train", "saes report", "saes compare"} <= set(
        COMMANDS
    )
    assert sum(len(r) for _, r in COMMANDS.values()) > 100  # ranged options, found through the configs


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_generated_command_lines_exit_0_or_2_without_a_traceback(name, tmp_path, paths, no_model):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(argv=command_lines(name, str(tmp_path / "out"), paths))
    def check(argv):
        status, err = run(argv)
        assert "Traceback" not in err, (argv, err)
        assert status in (0, 2, "model"), (argv, status, err)
        if status == 2:
            lines = err.strip().splitlines()
            assert lines and (len(lines) <= 2 or lines[-1].startswith("tlql")), (argv, err)  # argparse: usage + 1
        bad = out_of_range(argv, name)
        if bad:
            assert status == 2, f"{argv}: {bad} out of range, yet the command went on ({status})"

    check()


# --- what users feed us besides options: dictionary specs, JSON files, corpus files, environment variables ----------

JSON_KEYS = st.sampled_from(
    ["files", "version", "packages", "n_documents", "n_characters", "documents_sha256", "sid/cfg.json",
     "sid/sae_weights.int8.safetensors", "bytes", "sha256", "value", "lo", "hi", "small", "name", "text", "source"]
)  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_KEYS | st.text(max_size=3), inner, max_size=4),
    max_leaves=10,
)
SPEC_PARTS = st.sampled_from(["ffkv", "1", "99", "0", "²", "٣", "topk", "vanilla", "normalized", "", "-1", "x", " "])
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@SETTINGS
@given(parts=st.lists(SPEC_PARTS, min_size=1, max_size=4))
def test_fuzzed_dictionary_specs_parse_or_name_the_fix(parts):
    from tl_query_lens.errors import InputError
    from tl_query_lens.sources import parse_sources

    spec = ":".join(parts)
    try:
        sources = parse_sources(spec)
    except InputError as err:
        assert "\n" not in str(err).strip() and "--dictionary" in str(err)
        return
    for source in sources:  # accepted: the numbers in it are ASCII integers, a top-k keeps at least one feature
        assert source.kind != "ffkv" or source.k is None or source.k >= 1


@pytest.mark.parametrize("spec", ["ffkv:99", "ffkv:20:topk:0", "ffkv:²", "ffkv:1:topk:٣", "ffkv::"])
def test_bad_specs_on_the_command_line_exit_2(spec, tmp_path, no_model):
    status, err = run(["certify", "--dictionary", spec, "--out", str(tmp_path / "o"), "--no-wandb"])
    assert status == 2 and "Traceback" not in err and "--dictionary" in err


@SETTINGS
@given(record=JSON)
def test_fuzzed_release_manifests_are_refused_by_name(record, tmp_path_factory):
    import json

    from tl_query_lens.errors import CorruptFileError
    from tl_query_lens.releases import verify_shipped

    release = tmp_path_factory.mktemp("release")
    (release / "sid").mkdir()
    (release / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(CorruptFileError, match="manifest.json|sid"):  # never a valid manifest: no file matches
        verify_shipped(release, "sid")


@SETTINGS
@given(record=JSON)
def test_fuzzed_documented_json_loads_or_is_refused_by_name(record, tmp_path_factory):
    import json

    from tl_query_lens.errors import CorruptFileError
    from tl_query_lens.reproduce.run import load_documented

    path = tmp_path_factory.mktemp("doc") / "documented.json"
    path.write_text(json.dumps(record))
    try:
        documented = load_documented(path)
    except CorruptFileError as err:
        assert "documented.json" in str(err)
        return
    for rows in documented.values():  # accepted: what the reproduction reads of each row is there
        for entry in rows.values():
            assert {"value", "lo", "hi"} <= entry.keys() and all(
                isinstance(entry[k], (int, float)) for k in ("lo", "hi")
            )


@SETTINGS
@given(record=JSON)
def test_fuzzed_broad_corpus_manifest_info_exits_0_or_2(record, tmp_path_factory, monkeypatch):
    import json

    from tl_query_lens.broad_corpus import broad_dir
    from tl_query_lens.broad_corpus import main as broad_main

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path_factory.mktemp("cache")))
    folder = broad_dir()
    folder.mkdir(parents=True)
    (folder / "documents.jsonl").write_text("")
    (folder / "manifest.json").write_text(json.dumps(record))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = broad_main(["info"])
    assert status in (0, 2) and "Traceback" not in err.getvalue()


@SETTINGS
@given(
    body=st.binary(max_size=60) | st.text(max_size=60).map(lambda t: t.encode()),
    suffix=st.sampled_from([".txt", ".jsonl"]),
)
def test_fuzzed_corpus_files_are_read_or_refused_by_name(body, suffix, tmp_path_factory):
    from tl_query_lens.checks import check_corpus
    from tl_query_lens.errors import InputError

    path = tmp_path_factory.mktemp("corpus") / f"c{suffix}"
    path.write_bytes(body)
    try:
        check_corpus(str(path))
    except InputError as err:
        assert str(path.name) in str(err)


ENV_VALUES = st.sampled_from(["", "abc", "-1", "0", "nan", "inf", "1e309", "90", "offline", "online", "disabled",
                              "/proc/x", "/dev/null", "../x", "é", "8G", "1K", "0.5M"])  # fmt: skip


@SETTINGS
@given(env=st.dictionaries(
    st.sampled_from(["WANDB_MODE", "WANDB_INIT_TIMEOUT", "WANDB_DIR", "TLQL_CACHE", "TLQL_MAX_MEMORY"]),
    ENV_VALUES, max_size=3,
))  # fmt: skip
def test_fuzzed_environment_variables_exit_2_naming_the_variable_or_go_on(env, tmp_path_factory, no_model):
    out = tmp_path_factory.mktemp("env") / "out"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        status, err = run(["ffkv", "--layers", "0", "--out", str(out)])
    assert "Traceback" not in err
    assert status in (2, "model"), (env, status, err)
    if status == 2:
        assert any(name in err for name in env), (env, err)
