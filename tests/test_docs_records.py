"""The figures of the docs against their records, and no machine path in what the repository ships to readers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tl_query_lens.paths import relative_command

ROOT = Path(__file__).resolve().parent.parent
# An absolute path of a machine: a home, scratch or work folder, or an interpreter inside a virtual environment.
TEXT = {".md", ".py", ".json", ".jsonl", ".csv", ".txt", ".html", ".toml", ".yaml", ".yml", ".sh", ".cfg", ".ini"}
MACHINE_PATH = re.compile(r"(?<![\w.<])/(?:work|tmp|home|root|scratch|mnt|Users)/|/\.?venv/bin/")


def _tracked(*folders: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", *folders], cwd=ROOT, capture_output=True, check=False, text=True
    ).stdout
    files = [ROOT / f for f in out.split("\0") if f]
    if not files:  # not a git checkout (an sdist): every file under the folders
        files = [p for f in folders for p in (ROOT / f).rglob("*") if p.is_file()]
    return files


def test_no_machine_path_in_docs_or_benchmarks() -> None:
    """docs/ (prose and records), the package, the scripts and their usage lines name paths relative to the
    repository only. (.ci/run and pyproject.toml keep their scratch folders under /tmp: where a run writes on the CI
    machine, not a path a reader is told to use.)"""
    hits = []
    for path in _tracked("docs", "benchmarks", "scripts", "tl_query_lens", "README.md"):
        if path.suffix not in TEXT:  # weights, images, compiled files
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "machine paths (write them relative to the repository):\n" + "\n".join(hits)


# A citation of the project's issue tracker, which readers cannot open: cite the doc section or the paper instead.
ISSUE_CITATION = re.compile(r"\b[Ii]ssues?\s+#?\d+|\bissue\s+#\d+")


def test_no_issue_citations_in_the_repository() -> None:
    """Nothing a user reads (docs, package, tests, scripts, configuration) points at an issue number."""
    hits = []
    for path in _tracked("."):
        if path.suffix not in TEXT or path.name == "test_docs_records.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if ISSUE_CITATION.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "issue citations (name the doc section or the paper instead):\n" + "\n".join(hits)


def test_issue_citation_pattern() -> None:
    for bad in ("(issue 28)", "## Issue 26: lost work", "issues 10 and 11", "issue #4"):
        assert ISSUE_CITATION.search(bad), bad
    for good in ("a known issue", "issues with tokens", "docs/reliability.md §3", "tissue 5"):
        assert not ISSUE_CITATION.search(good), good


def test_machine_path_pattern_catches_what_records_held() -> None:
    for bad in ("/work/main/.venv/bin/python x", "--out /work/runs/t", "TLQL_CACHE=/tmp/fresh", "a/.venv/bin/torchrun"):
        assert MACHINE_PATH.search(bad), bad
    for good in ("python benchmarks/x.py --out results/x", "TLQL_CACHE=<empty>", "/usr/bin/time -v", "docs/work/x"):
        assert not MACHINE_PATH.search(good), good


def test_relative_command(tmp_path: Path) -> None:
    """Interpreters become ``python``, console scripts their name, paths in (another checkout of) the repository
    relative ones, other absolute paths ``results/<name>``."""
    (tmp_path / "benchmarks").mkdir()
    argv = [
        sys.executable,
        "/elsewhere/.venv/bin/torchrun",
        str(tmp_path / "benchmarks" / "x.py"),
        "/other/checkout/benchmarks/y.py",
        "--out",
        "/scratch/runs/sweep",
        "--records=/scratch/r.json",
        "--cells",
        "a b",
    ]
    assert relative_command(argv, root=tmp_path) == (
        "python torchrun benchmarks/x.py benchmarks/y.py --out results/sweep --records=results/r.json --cells 'a b'"
    )
    assert not MACHINE_PATH.search(relative_command(argv, root=tmp_path))


@pytest.mark.parametrize("name", ["table1_sweep.json", "certify_large_n.json"])
def test_cell_records_name_relative_commands(name: str) -> None:
    import json

    records = json.loads((ROOT / "docs" / "reproduction" / name).read_text(encoding="utf-8"))
    for cell, record in records.items():
        command = record["command"]
        assert command.split()[0] in {"python", "torchrun"}, (cell, command)
        assert "benchmarks/" in command and not MACHINE_PATH.search(command), (cell, command)


def _doc_records():
    """docs/scripts/doc_records.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_records", ROOT / "docs" / "scripts" / "doc_records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_tables_and_headlines_match_records() -> None:
    """Every marked table renders from its records to what the docs hold, and every listed headline is there."""
    problems = _doc_records().problems()
    assert not problems, "\n".join(problems) + "\n(fix the prose, or run python docs/scripts/doc_records.py --write)"


def test_rendered_sweep_row_reads_the_record() -> None:
    """The base row of the sweep table carries the record's QL_KEY input mean and interval, read here directly."""
    import json

    rows = json.loads((ROOT / "docs" / "reproduction" / "table1_sweep.json").read_text(encoding="utf-8"))["base"]
    ql_key = next(r for r in rows["result"]["rows"] if r["method"] == "QL_KEY")
    want = f"{ql_key['input']:.2f} [{ql_key['input_lo']:.2f}, {ql_key['input_hi']:.2f}]"
    rendered = _doc_records().TABLES["table1-sweep"]()
    base = next(line for line in rendered.splitlines() if line.startswith("| `base` |"))
    assert want in base, (want, base)
    assert want in (ROOT / "docs" / "reproduction.md").read_text(encoding="utf-8")


def test_check_fails_when_a_record_or_the_prose_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed record makes its table and its headlines differ; a changed prose number is caught too."""
    import json
    import shutil

    mod = _doc_records()
    docs = tmp_path / "docs"
    for folder in ("reproduction", "certification", "benchmarks"):
        shutil.copytree(ROOT / "docs" / folder, docs / folder)
    for path in (ROOT / "docs").glob("*.md"):
        shutil.copy(path, docs / path.name)
    monkeypatch.setattr(mod, "DOCS", docs)
    monkeypatch.setattr(mod, "RECORDS", docs / "reproduction")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    (tmp_path / "tl_query_lens" / "reproduce").mkdir(parents=True)
    shutil.copy(ROOT / "tl_query_lens" / "reproduce" / "documented.json", tmp_path / "tl_query_lens" / "reproduce")
    assert mod.problems() == []

    sweep = docs / "reproduction" / "table1_sweep_summary_only.json"
    cells = json.loads(sweep.read_text(encoding="utf-8"))
    next(r for r in cells["maxact-broad-262k"]["result"]["rows"] if r["method"] == "QL_KEY")["input"] = 29.5
    sweep.write_text(json.dumps(cells), encoding="utf-8")
    found = mod.problems()
    assert any("table 'table1-sweep' differs" in p for p in found), found
    assert any("table 'table1-sweep-summary-only' differs" in p for p in found), found
    assert any("**29.50 % [20.77, 41.25]" in p for p in found), found

    shutil.copy(ROOT / "docs" / "reproduction" / "table1_sweep_summary_only.json", sweep)
    prose = docs / "query_lens_evaluation.md"
    prose.write_text(prose.read_text(encoding="utf-8").replace("+7.31 pts [5.15, 9.69]", "+1.38 pts"), encoding="utf-8")
    assert [p for p in mod.problems() if "query_lens_evaluation.md" in p]


def test_summary_only_certificates_agree_with_the_documented_values() -> None:
    """The recovered N = 5,000 certification rows (report table, two decimals) against the full-precision values
    `tlql reproduce --record` stored for the same cells (documented.json, cert_broad.*): two records, one result."""
    import json

    summary = json.loads((ROOT / "docs" / "reproduction" / "certify_large_n_summary_only.json").read_text("utf-8"))
    documented = json.loads((ROOT / "tl_query_lens" / "reproduce" / "documented.json").read_text("utf-8"))["full"]
    for cell, kind in (("saes-N5000-cal512", "saes"), ("ffkv-N5000-cal512", "ffkv")):
        for row, layer in zip(summary[cell]["rows"], (6, 12, 18, 24), strict=True):
            assert row["bound_occam"] == round(documented[f"cert_broad.{kind}{layer}.occam"]["value"], 2)
            assert row["eta_hat"] == round(documented[f"cert_broad.{kind}{layer}.eta"]["value"], 3)


def test_records_read_back_name_relative_commands(tmp_path: Path) -> None:
    """A report merging earlier records (``--records``) stores their commands without machine paths, whatever the
    machine that wrote them stored."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("cells_for_test", ROOT / "benchmarks" / "_cells.py")
    assert spec is not None and spec.loader is not None
    cells = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cells)
    old = "/opt/venv/bin/python /elsewhere/benchmarks/table1_sweep.py --run-cell base --out /data/runs/table1_sweep"
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"base": {"command": old, "settings": {}}}), encoding="utf-8")
    assert cells.read_records(path)["base"]["command"] == (
        "python benchmarks/table1_sweep.py --run-cell base --out results/table1_sweep"
    )
