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
    """docs/ (prose and records) and the scripts' usage lines name paths relative to the repository only."""
    hits = []
    for path in _tracked("docs", "benchmarks", "README.md"):
        if path.suffix in {".png", ".svg"}:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "machine paths (write them relative to the repository):\n" + "\n".join(hits)


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
