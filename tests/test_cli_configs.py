"""The CLI is made from the configs: options, defaults, choices and help; it starts without the heavy libraries; one
dictionary source parser; the query-lens command asks the engine for the features' basis, as the API does."""

import dataclasses
import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.cli import build_parser, main, subcommands
from tl_query_lens.cli.options import NOT_GIVEN, option
from tl_query_lens.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _options(parser):
    """(command path, action) of every option of every subcommand."""
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            yield parser.prog, action
    for sub in subcommands(parser).values():
        yield from _options(sub)


def test_every_option_has_help_from_a_docstring():
    fallback = re.compile(r"\w+\.\w+")  # what an option without a docstring entry shows: "Config.field"
    options = list(_options(build_parser()))
    missing = [(prog, a.option_strings) for prog, a in options if fallback.fullmatch((a.help or "x.y").split(" (")[0])]
    assert missing == []
    parsers = [build_parser()]
    while parsers:  # every help page renders
        parser = parsers.pop()
        assert parser.format_help()
        parsers += subcommands(parser).values()


@pytest.mark.parametrize(
    "argv,module,cls",
    [
        (["certify"], "tl_query_lens.certify.protocol", "ProtocolCertifyConfig"),
        (["saes", "train"], "tl_query_lens.saes.train", "SAESuiteConfig"),
        (["ql-evaluate"], "tl_query_lens.query_lens.table1", "Table1Config"),
        (["ffkv"], "tl_query_lens.dictionaries.splice", "FFKVSummaryConfig"),
        (["ql-channels"], "tl_query_lens.query_lens.channels", "SubspaceChannelsConfig"),
        (["atlas"], "tl_query_lens.atlas.config", "AtlasConfig"),
    ],
)
def test_defaults_and_choices_are_the_configs(argv, module, cls):
    """Reference: the dataclass itself (a field the CLI shows with another default is named by the subcommand)."""
    config = getattr(importlib.import_module(module), cls)
    parser = build_parser()
    for word in argv:
        parser = subcommands(parser)[word]
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    shown_otherwise = {"protocol", "seed"}  # certify's own protocol; the run's seed (a RunConfig option)
    checked = 0
    for f in dataclasses.fields(config):
        action, default = actions.get(f.name), f.default
        if action is None or f.name in shown_otherwise or default is dataclasses.MISSING:
            continue
        if isinstance(default, bool):
            assert action.option_strings == [option(("no_" if default else "") + f.name)], f.name
        elif isinstance(default, (int, float, str)) or default is None:
            assert option(f.name) in action.option_strings, f.name
            if action.default is NOT_GIVEN:  # the preset's value applies: the help shows it
                assert default is None or f"default: {default}" in action.help, (f.name, action.help)
            else:
                assert action.default == default, f.name
        if isinstance(default, str) and action.choices:
            assert list(action.choices) == list(typing.get_args(typing.get_type_hints(config)[f.name]))
        checked += 1
    assert checked >= 3


def test_no_option_given_builds_the_commands_default_config():
    """Reference: each command's config class called with no arguments."""
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS

    for command in COMMANDS:
        parser = build_parser()
        for word in command.words:
            parser = subcommands(parser)[word]
        assert config_of(command, parser.parse_args([])) == command.config_class()(), command.name


def test_help_and_argument_errors_import_no_heavy_library():
    code = (
        "import sys\nfrom tl_query_lens.cli import main\n"
        "for argv in (['--help'], ['nonsense']):\n"
        "    try:\n        main(argv)\n    except SystemExit as err:\n        assert err.code in (0, 2), err.code\n"
        "heavy = [m for m in ('torch', 'transformer_lens', 'sae_lens') if m in sys.modules]\n"
        "assert not heavy, heavy\nprint('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_config_errors_name_the_option_and_exit_2_before_the_model(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["ffkv", "--batch-size", "0", "--no-wandb", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "Traceback" not in err and len(err.strip().splitlines()) == 2


def test_sources_forms_and_errors(tmp_path):
    from tl_query_lens import FFKV
    from tl_query_lens.sources import FORMS, load_dictionary, parse_source

    model = tiny_model("gelu_ln")
    topk = load_dictionary("ffkv:1:topk:4", model)
    want = FFKV.from_model(model, 1, "topk", 4)
    assert torch.equal(topk.W_enc, want.W_enc) and topk.cfg.k == want.cfg.k == 4
    assert parse_source("ffkv:2:normalized").variant == "normalized" and parse_source("ffkv").layer is None
    want.save_model(tmp_path / "sae")
    assert torch.equal(load_dictionary(str(tmp_path / "sae")).W_dec, want.W_dec)
    assert parse_source("org/repo:blocks.3.hook_resid_post").kind == "pretrained"  # a hub id: checked when loaded
    for bad in ("ffkv:x", "ffkv:1:wide", "ffkv:1:vanilla:4", "./missing"):
        with pytest.raises(InputError, match="accepted forms") as err:
            parse_source(bad)
        assert FORMS in str(err.value)
    with pytest.raises(InputError, match="needs the model and a layer"):
        load_dictionary("ffkv", model)


def test_query_lens_command_pushes_the_features_not_the_identity(tmp_path, monkeypatch):
    """4 features < d_model: as the API, the engine gets the 4 key directions, never the full key operator."""
    from tl_query_lens.query_lens import lens

    model = tiny_model("gated_rms")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: model)
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus", lambda *a, n_seqs, seq_len, **k: tiny_tokens(model, n_seqs, seq_len)
    )
    bases = []
    real = lens.key_operators

    def spy(*args, basis=None, **kwargs):
        bases.append(None if basis is None else tuple(basis.shape))
        return real(*args, basis=basis, **kwargs)

    monkeypatch.setattr(lens, "key_operators", spy)
    argv = ["query-lens", "--layers", "1", "--features", "0-3", "--side", "key", "--k", "3", "--n-seqs", "2"]
    assert main([*argv, "--seq-len", "8", "--no-wandb", "--out", str(tmp_path)]) == 0
    assert bases == [(4, model.cfg.d_model)]


def test_single_state_decomposition_has_no_state_axis():
    from tl_query_lens.readout import decompose, fit_readout, token_logit

    model = tiny_model("gelu_ln")
    sae = fit_readout(
        model, tiny_tokens(model, 4, 8), width=64, k=4, steps=3, batch_rows=32, batch_pairs=8, progress=False
    ).sae
    h = torch.randn(3, model.cfg.d_model)
    alpha = token_logit(5, model.cfg.d_vocab)
    one, many = decompose(sae, h[1], alpha, model=model), decompose(sae, h, alpha, model=model)
    assert one.contributions.shape == (sae.cfg.d_sae,) and one.exact.shape == ()
    assert torch.allclose(one.contributions, many.contributions[1]) and torch.allclose(one.exact, many.exact[1])


def test_aliases_and_none_spellings_of_the_saes_commands():
    """Reference: the spellings the old options had (``--icl``, ``--batch-size``, ``--n-seqs 0`` = every window)."""
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS

    def parsed(*argv: str):
        command = next(c for c in COMMANDS if c.words == list(argv[:2]))
        parser = subcommands(subcommands(build_parser())[argv[0]])[argv[1]]
        return config_of(command, parser.parse_args(list(argv[2:])))

    train = parsed("saes", "train", "--n-seqs", "0", "--batch-size", "512", "--model", "gpt2")
    assert train.suite.n_seqs is None and train.suite.batch_size_tokens == 512
    assert train.suite.model == train.run.model == "gpt2"  # one option feeds both fields
    assert parsed("saes", "train", "--n-seqs", "7").suite.n_seqs == 7
    compare = parsed("saes", "compare", "--icl", "2", "--no-absorption")
    assert compare.compare.absorption.n_icl_examples == 2 and compare.absorption is False
