"""Resumable cells for the long benchmark runs (readout_fit_spread.py, table1_sweep.py, certify_large_n.py).

A run is a list of named cells. Each cell runs in its own Python process (``<script> --run-cell NAME <options>``),
so its peak memory is its own (``ru_maxrss`` of that process) and a crash or a kill loses only that cell. A cell is
done when ``<out>/cells/<NAME>/cell.json`` exists: it is written atomically at the end, with the cell's settings,
result, the exact command, wall time, peak RSS, thread count and the machine's load average at start and end.
Running the script again skips the done cells, so an interrupted run resumes where it stopped. A report can merge
the records of cells measured elsewhere (``load_cells(records=...)``: the JSON a report wrote, kept in docs/), so
re-measuring one cell on a new machine does not mean re-measuring all of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CELL_FILE = "cell.json"


def cell_dir(out: str | Path, name: str) -> Path:
    return Path(out) / "cells" / name


def is_done(out: str | Path, name: str) -> bool:
    return (cell_dir(out, name) / CELL_FILE).is_file()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)


def _launcher(nproc: int) -> list[str]:
    """How a cell's process starts: python, or torchrun with ``nproc`` ranks on this machine."""
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


ROOT = Path(__file__).resolve().parents[1]  # the repository


def shown_command(launcher: list[str], argv: Sequence[str]) -> str:
    """The command as a record shows it: ``python`` for this interpreter and paths inside the repository relative to
    it (the records are read on other machines, from the repository root)."""

    def shown(arg: str) -> str:
        if arg == sys.executable:
            return "python"
        path = Path(arg)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            return str(path.resolve().relative_to(ROOT))
        return arg

    return shlex.join([shown(a) for a in [*launcher, *argv]])


def record_cell(
    out: str | Path, name: str, settings: dict[str, Any], compute: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """Run ``compute(folder)`` for one cell in this process and write its record (see the module docstring).

    Under torchrun (the process group initialised) every rank computes and rank 0 writes the record, with the peak
    RSS of each rank (``peak_rss_mb`` is their maximum) and the CPU time of all."""
    import torch

    from tl_query_lens.operators.distributed import all_ranks, rank_and_world

    folder = cell_dir(out, name)
    folder.mkdir(parents=True, exist_ok=True)
    started, load_start, start = _now(), os.getloadavg(), time.perf_counter()
    result = compute(folder)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ranks = all_ranks((usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime))  # Linux: KiB
    if rank_and_world()[0] != 0:
        return {}
    record = {
        "name": name,
        "settings": settings,
        "result": result,
        "command": shown_command(_launcher(len(ranks)), sys.argv),
        "started_utc": started,
        "finished_utc": _now(),
        "wall_s": time.perf_counter() - start,
        "peak_rss_mb": max(rss for rss, _ in ranks),
        "cpu_s": sum(cpu for _, cpu in ranks),
        "ranks": len(ranks),
        "peak_rss_mb_by_rank": [rss for rss, _ in ranks],
        "torch_threads": torch.get_num_threads(),
        "nice": os.nice(0),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
    }
    _write_json(folder / CELL_FILE, record)
    return record


def run_cells(
    script: str | Path,
    out: str | Path,
    names: Sequence[str],
    argv: Sequence[str],
    *,
    env: Callable[[str], dict[str, str]] | None = None,
    log: Callable[[str], None] = print,
    nproc: int = 1,
) -> list[str]:
    """Run each cell not yet done, one at a time, each as ``python script --run-cell NAME *argv``; returns the names
    of the cells that failed (the others are done). ``env(name)``: extra environment of a cell's process.
    ``nproc`` > 1 launches each cell with ``torchrun --standalone --nproc_per_node nproc`` instead of python."""
    failed = []
    Path(out).mkdir(parents=True, exist_ok=True)
    _write_json(Path(out) / "run.json", {"command": shlex.join([sys.executable, *sys.argv]), "started_utc": _now()})
    for name in names:
        if is_done(out, name):
            log(f"{name}: done before, skipped")
            continue
        command = [*_launcher(nproc), str(script), "--run-cell", name, *argv]
        log(f"{name}: {shlex.join(command)}")
        # ranks share the cores: one thread each unless the caller's environment says otherwise
        child_env = {**({"OMP_NUM_THREADS": "1"} if nproc > 1 else {}), **os.environ, **(env(name) if env else {})}
        start = time.perf_counter()
        code = subprocess.run(command, env=child_env, check=False).returncode
        if code != 0 or not is_done(out, name):
            log(f"{name}: FAILED (exit {code}) after {time.perf_counter() - start:.0f} s; rerun to retry it")
            failed.append(name)
        else:
            log(f"{name}: done in {time.perf_counter() - start:.0f} s")
    return failed


def read_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """The records of a JSON file an earlier report wrote (``{name: record}``), each with ``"records_file"`` set."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--records {path}: no such file (give the JSON an earlier --report wrote)")
    return {n: {"records_file": str(path), **r} for n, r in json.loads(path.read_text("utf-8")).items()}


def load_cells(
    out: str | Path,
    names: Sequence[str] | None = None,
    records: str | Path | None = None,
    expected: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """The records of the done cells (all, or those of ``names`` in that order).

    ``records``: a JSON file of earlier records (``{name: record}``, as a report writes them, e.g. one kept in docs/)
    read for the cells not done under ``out``, so a report can be rebuilt on a machine where only some cells were
    (re)measured. Those records get ``"records_file"`` set; their cell folders (saved results) are not here.
    ``expected``: each cell's settings under this run's options; a record from ``records`` measured with other
    values of them is refused (SystemExit naming the cell and the options), so unlike runs are never mixed.
    """
    root = Path(out) / "cells"
    earlier = read_records(records) if records is not None else {}
    for name, want in (expected or {}).items():
        have = earlier.get(name, {}).get("settings")
        if have is None or is_done(out, name):
            continue
        want = json.loads(json.dumps(want, default=str))  # as the record stored it (tuples as lists)
        differ = {k: (have[k], v) for k, v in want.items() if k in have and have[k] != v}
        if differ:
            shown = "; ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in differ.items())
            raise SystemExit(
                f"--records {records}: cell {name} was measured with other settings ({shown}); "
                "run the report with the options it was measured with, or leave --records out."
            )
    if names is None:
        here = sorted(p.name for p in root.iterdir() if (p / CELL_FILE).is_file()) if root.is_dir() else []
        names = here + sorted(set(earlier) - set(here))
    cells = {}
    for n in names:
        if is_done(out, n):
            cells[n] = json.loads((root / n / CELL_FILE).read_text(encoding="utf-8"))
        elif n in earlier:
            cells[n] = earlier[n]
    return cells


def add_run_options(
    parser: argparse.ArgumentParser, cells: Sequence[str], out: str, records: str, *, writes: str = "report"
) -> None:
    """The options every cell script shares: which cells, where, the model and seed, report only, earlier records
    (``records``: the JSON file its report writes; ``writes``: what ``--report`` writes), and the hidden
    ``--run-cell`` of a cell's own process."""
    parser.add_argument("--cells", default=",".join(cells), help="comma list (default: every cell)")
    parser.add_argument("--out", default=out)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report", action="store_true", help=f"only write the {writes} of the done cells")
    parser.add_argument(
        "--records",
        type=Path,
        help=f"the {records} of an earlier report: its cells are reported beside those done under --out, which take "
        "precedence",
    )
    parser.add_argument("--run-cell", help=argparse.SUPPRESS)


def run_then_report(
    script: str | Path,
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    check: Callable[[list[str]], None],
    report: Callable[[], str],
    *,
    nproc: int = 1,
) -> int:
    """A cell script's main run: check the named cells' settings (``check`` raises on a bad one), run those not done
    (unless ``--report``), then print ``report()``; the exit status is 1 when a cell failed."""
    names = [n.strip() for n in args.cells.split(",") if n.strip()]
    failed: list[str] = []
    if not args.report:
        check(names)
        failed = run_cells(script, args.out, names, argv if argv is not None else sys.argv[1:], nproc=nproc)
    print(report())
    return 1 if failed else 0


def merged_note(cells: dict[str, dict[str, Any]], records: str | Path | None, out: str | Path) -> str:
    """The report's line naming the cells read from ``records`` (none: empty)."""
    merged = [n for n, c in cells.items() if "records_file" in c]
    return f"\n\nRead from {records} (measured earlier, not under {out}): {', '.join(merged)}" if merged else ""
