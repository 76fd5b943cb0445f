"""The docs say what the code does: every ``tlql ...`` command in a code block of README.md or docs/*.md parses
(argparse only, nothing runs), and the readout directory lists only ids that load."""

import re
import shlex
from pathlib import Path

import pytest

from tl_query_lens.cli import build_parser, subcommands

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[tuple[str, str]]:
    """(file:line, command) for every line of a fenced code block that starts with ``tlql`` and every inline
    ```tlql ...``` span; a continued line (trailing backslash) is joined, a trailing comment dropped, ``[--x]`` made
    ``--x``, ``a|b`` made ``a``. Commands listing alternatives (``fit | decompose``) or elisions (``…``, ``...``) are
    no single command and are left out."""
    found = []
    for path in DOCS:
        lines = iter(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
        inside = False
        for number, line in lines:
            if line.lstrip().startswith("```"):
                inside = not inside
                continue
            if not (inside and re.match(r"\s*(\$ )?tlql ", line)):
                continue
            text = line
            while text.rstrip().endswith("\\"):
                text = text.rstrip()[:-1] + " " + next(lines)[1]
            text = re.sub(r"\s#\s.*$", "", text).strip().removeprefix("$ ")
            found.append((f"{path.relative_to(ROOT)}:{number}", text))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "exit 2" not in line:  # a table row of refused input (docs/reliability.md) quotes bad commands
                found += [(f"{path.relative_to(ROOT)}:{number}", m) for m in re.findall(r"`(tlql [a-z][^`]*)`", line)]
    commands = []
    for where, text in found:
        text = re.sub(r"\[(--[^\]]+)\]", r"\1", text)  # an optional option, given
        text = re.sub(r"(\S+?)\|\S+", r"\1", text)  # 'small|paper': the first alternative
        if not re.search(r"\s\|\s|…|\.\.\.|^tlql \S+:", text):  # alternatives, elisions, a quoted message
            commands.append((where, text))
    return sorted(set(commands))


COMMANDS = _commands()


def test_the_docs_quote_commands():
    assert len(COMMANDS) > 20


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_quoted_command_parses(where, command):
    argv = shlex.split(command)[1:]
    parser = build_parser(command=argv[0])
    names = subcommands(parser)
    if len(argv) <= 2 and argv[0] in names and (len(argv) == 1 or argv[1] in subcommands(names[argv[0]])):
        return  # a command named in prose ("tlql readout decompose"), not invoked: it exists
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"{where}: `{command}` does not parse (exit {exit_.code})")
    assert getattr(args, "func", None) is not None, f"{where}: `{command}` names no runnable command"


def test_the_quoted_missing_readout_error_is_the_one_raised(tmp_path, monkeypatch):
    """docs/readout.md quotes the error of an id that is neither shipped nor cached; it must be the message raised."""
    from sae_lens import SAE

    from tl_query_lens.errors import MissingFileError

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    text = (ROOT / "docs" / "readout.md").read_text(encoding="utf-8")
    quoted = re.search(r'"(No readout SAE \'nope\'.*?)"', text, flags=re.DOTALL)
    assert quoted, "docs/readout.md no longer quotes the missing-id error"
    with pytest.raises(MissingFileError) as err:
        SAE.from_pretrained("tlql-readout-smollm2-135m", "nope")
    raised = str(err.value)
    for piece in " ".join(quoted.group(1).split()).split("(…)"):
        assert piece.strip() in raised


def test_the_readout_directory_lists_only_ids_that_load(tmp_path, monkeypatch):
    from sae_lens import SAE
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    from tl_query_lens.readout.registry import register_releases

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))  # nothing cached: the shipped ids only
    register_releases()
    listed = list(get_pretrained_saes_directory()["tlql-readout-smollm2-135m"].saes_map)
    assert listed
    for sae_id in listed:
        assert SAE.from_pretrained("tlql-readout-smollm2-135m", sae_id).cfg.d_sae > 0
