"""The docs say what the code does: every ``tlql ...`` command in a code block of README.md or docs/*.md parses
(argparse only, nothing runs), every error message they quote is one the code can produce, and the readout directory
lists only ids that load."""

import argparse
import ast
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


# A quote right after one of these is a message the code prints (a refusal, an error or a warning).
_SAYS = re.compile(
    r"(exit 2:|exits 2:|says|refused with|refuses with|fails with|stops with|Error`?:|message:|warning:|warns)\s*\**\s*$"
)
_QUOTE = re.compile(r'``(.+?)``|`([^`]+)`|"([^"]+)"|\*([^*]+)\*', flags=re.DOTALL)


def _quoted_messages() -> list[tuple[str, str]]:
    """(file, message) for every code span, double-quoted or italic text of 4+ words that follows ``_SAYS``."""
    found = []
    for path in DOCS:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            for m in _QUOTE.finditer(paragraph):
                text = (
                    " ".join(next(g for g in m.groups() if g is not None).split()).replace("\\|", "|").replace("`", "")
                )
                if len(text.split()) >= 4 and _SAYS.search(paragraph[max(0, m.start() - 30) : m.start()]):
                    found.append((path.name, text))
    return sorted(set(found))


def _templates() -> list[list[str]]:
    """The literal pieces of every string in the package's source (and argparse's, whose usage errors the CLI prints),
    split where a value is filled in: f-string fields, %-style and {}-style placeholders. Backticks are dropped (a
    code span in the docs cannot hold one)."""
    found = []
    for file in [*sorted((ROOT / "tl_query_lens").rglob("*.py")), Path(argparse.__file__)]:
        tree = ast.parse(file.read_text(encoding="utf-8"))
        constants = {  # module-level NAME = "text": filled in where an f-string uses it
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                pieces = [""]
                for value in node.values:
                    if isinstance(value, ast.Constant):
                        pieces[-1] += str(value.value)
                    elif isinstance(value, ast.FormattedValue) and getattr(value.value, "id", None) in constants:
                        pieces[-1] += constants[value.value.id]  # type: ignore[attr-defined]
                    else:
                        pieces.append("")
                found.append([p.replace("`", "") for p in pieces])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) >= 8:
                pieces = re.split(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgi]|\{[^{}]*\}", node.value)
                found.append([p.replace("`", "") for p in pieces])
    return found


def _fits(fragment: str, pieces: list[str]) -> bool:
    """Whether ``fragment`` is a substring of some string the template ``pieces`` (literal text between filled-in
    values) can produce, with at least 30 % of its characters (and 5) literal."""
    if any(fragment in p for p in pieces):
        return True
    for i in range(len(pieces)):
        for j in range(i + 1, len(pieces)):
            middle = ".*".join(re.escape(p) for p in pieces[i + 1 : j])
            pattern = f".*{middle}.*" if middle else ".*"
            literal = sum(len(p) for p in pieces[i + 1 : j])
            for a in range(min(len(pieces[i]), len(fragment)) + 1):
                if a and not pieces[i].endswith(fragment[:a]):
                    continue
                rest = fragment[a:]
                for b in range(min(len(pieces[j]), len(rest)) + 1):
                    if b and not pieces[j].startswith(rest[len(rest) - b :]):
                        continue
                    if a + b + literal >= max(min(5, len(fragment)), 0.3 * len(fragment)) and re.fullmatch(
                        pattern, rest[: len(rest) - b], flags=re.DOTALL
                    ):
                        return True
    return False


# A word a caller fills in before a message of the code: an option, a file or a field name, or the "must" after it.
_NAME = re.compile(r"--[\w-]+|\S*[._/:'\d]\S*|must")


def _unmatched(message: str, templates: list[list[str]]) -> list[str]:
    """The parts of a quoted message that no template produces. The message is cut at the docs' elisions (…, ...,
    <placeholders>) and sentence ends (one message can join several strings of the code); a part may begin with up to
    3 words the caller filled in: a file or option name, and its "must" (``--delta must`` + the range's text)."""
    parts = re.split(r"…|\.\.\.|<[^<>]*>|(?<=[.?!])\s+(?=[A-Z])", message)
    bad = []
    for part in (p.strip(" ,;.()") for p in parts):
        if len(part) < 6:
            continue
        words = part.split(" ")
        named = next((k for k, w in enumerate(words) if not _NAME.fullmatch(w)), len(words))
        tails = [" ".join(words[k:]) for k in range(min(named, 3) + 1)]
        if not any(_fits(tail, t) for tail in tails if len(tail) >= 6 for t in templates if _near(tail, t)):
            bad.append(part)
    return bad


def _near(fragment: str, pieces: list[str]) -> bool:
    """A cheap filter before :func:`_fits`: the start or end of some piece of 6+ characters lies inside the fragment, or a piece holds it."""
    cores = [p.strip(" ().,;:") for p in pieces]
    return any(fragment in p for p in pieces) or any(
        len(c) >= 6 and (c[:12] in fragment or c[-12:] in fragment) for c in cores
    )


def test_every_quoted_error_message_is_one_the_code_produces():
    """Every refusal, error or warning the docs quote (after "exit 2:", "says", "refused with", "…Error:" and the like)
    occurs in the package source as a template: its literal text in the same order, values and elisions aside."""
    messages = _quoted_messages()
    assert len(messages) > 20, "the quoted messages are no longer found: update _SAYS"
    templates = _templates()
    wrong = {f"{name}: {text}": bad for name, text in messages if (bad := _unmatched(text, templates))}
    assert not wrong, f"quoted messages the code does not produce: {wrong}"
