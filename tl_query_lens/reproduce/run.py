"""``reproduce``: re-measure every row of docs/reproduction.md and the FF-KV comparison table from the shipped
dictionaries, resumable experiment by experiment, and set each figure beside the paper's and the documented one.

Each experiment's result is saved under ``<out>/experiments/<name>`` as soon as it finishes; a rerun with the same
size loads it instead of measuring again (delete the folder to re-measure); the Table-1 experiments also keep each
layer's scores as they finish (``Table1Config.checkpoint_dir``), so a stopped one resumes layer by layer, and the
hour-long 'broad' certifications their evaluation pass's progress (``ProtocolCertifyConfig.checkpoint_dir``). The
documented value of a row and its
interval (the recorded run's bootstrap CI, or ± the row's tolerance) come from ``documented.json`` beside this
module, written from a measured run with ``record=True``. The documented figures are of the shipped release, so every
experiment loads the shipped files (:func:`~tl_query_lens.releases.shipped_only`), even where the user cache holds a
retrained suite or readout SAE under the same release and id.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from tl_query_lens.broad_corpus import read_manifest
from tl_query_lens.config import resolve_config
from tl_query_lens.demo_progress import Progress
from tl_query_lens.errors import CorruptFileError, InputError, MissingFileError, check_json_shape
from tl_query_lens.models import weights_fingerprint
from tl_query_lens.paths import shipped_root
from tl_query_lens.presentation import Table
from tl_query_lens.releases import shipped_only
from tl_query_lens.reproduce import rows as row_table
from tl_query_lens.reproduce.config import ReproduceConfig
from tl_query_lens.reproduce.experiments import EXPERIMENTS
from tl_query_lens.reproduce.rows import Row, rows_for
from tl_query_lens.results import SavableResult, atomic_write_text, read_json

DOCUMENTED = Path(__file__).with_name("documented.json")


@dataclass
class Reproduction(SavableResult):
    """Every reproduced row beside the paper and the docs.

    Attributes:
        size: "quick" or "full".
        rows: one dict per row: id, section, headline, paper, documented / documented_lo / documented_hi, value /
            value_lo / value_hi (this run; lo/hi its bootstrap CI where the figure has one), inside (this run's
            value within the documented interval; None when nothing is documented for this size).
        seconds: wall time per experiment measured in this call (0 for one loaded from an earlier call).
        peak_rss_gb: the process's peak resident memory.
        sizes: what each experiment's size means.
        skipped: experiment → why it was not measured (a corpus it needs is not installed, and how to install it);
            its rows hold NaN and ``inside`` None.
    """

    size: str
    rows: list[dict[str, Any]]
    seconds: dict[str, float]
    peak_rss_gb: float
    sizes: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    title: ClassVar[str] = "Reproduction: paper | documented | this run"
    COLUMNS: ClassVar[dict[str, Any]] = {
        "id": str,
        "section": str,
        "headline": str,
        "paper": str,
        "documented": (float, None),
        "documented_lo": (float, None),
        "documented_hi": (float, None),
        "value": float,
        "value_lo": (float, None),
        "value_hi": (float, None),
        "inside": (bool, None),
        "skipped": bool,
    }

    @property
    def outside(self) -> list[str]:
        """Ids of the rows whose figure fell outside its documented interval."""
        return [r["id"] for r in self.rows if r["inside"] is False]

    @property
    def exit_status(self) -> int:
        """``tlql reproduce``'s exit status: 1 when a figure fell outside its documented interval, else 0."""
        return 1 if self.outside else 0

    def summary_line(self) -> str:
        """Where the table is, the peak memory, what was not measured and what fell outside."""
        out = self.config.get("out", "")
        lines = [f"table: {out}/reproduction.md, {out}/reproduction.csv; peak RSS {self.peak_rss_gb:.1f} GB"]
        lines += [f"not measured: {name} ({why})" for name, why in self.skipped.items()]
        if self.outside:
            lines.append(f"{len(self.outside)} figure(s) outside their documented interval: {', '.join(self.outside)}")
        return "\n".join(lines)

    def scalars(self) -> dict[str, float]:
        inside = sum(r["inside"] is True for r in self.rows)
        undocumented = sum(r["inside"] is None for r in self.rows)
        out = {"rows": float(len(self.rows)), "inside": float(inside), "outside": float(len(self.outside))}
        out |= {"undocumented": float(undocumented), "skipped": float(len(self.skipped))}
        out |= {"peak_rss_gb": self.peak_rss_gb}
        return out | {f"seconds/{k}": v for k, v in self.seconds.items()}

    def tables(self) -> dict[str, Table]:
        return {
            "reproduction": Table.build(
                self.COLUMNS, ([r.get(c, False) if c == "skipped" else r[c] for c in self.COLUMNS] for r in self.rows)
            )
        }

    def markdown(self) -> str:
        """The side-by-side table: paper | documented here | this run | inside the documented interval?"""
        lines = [
            "| row | figure | paper | documented here | this run | inside? |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            doc = _fmt(r["documented"], r["documented_lo"], r["documented_hi"])
            run = _fmt(r["value"], r["value_lo"], r["value_hi"])
            verdict = {True: "yes", False: "**no**", None: "not documented"}[r["inside"]]
            if r.get("skipped"):
                verdict = "not measured (see below)"
            lines.append(f"| `{r['id']}` | {r['headline']} | {r['paper']} | {doc} | {run} | {verdict} |")
        notes = [f"- `{name}` not measured: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _fmt(value: float | None, lo: float | None, hi: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{value:.4g}"
    if lo is not None and hi is not None:
        text += f" [{lo:.4g}, {hi:.4g}]"
    return text


def load_documented(path: Path | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{size: {row_id: {"value", "lo", "hi", "recorded"}}}`` (empty when nothing was recorded)."""
    path = path or DOCUMENTED
    if not path.exists():
        return {}
    fix = (
        "Restore it (`git checkout -- tl_query_lens/reproduce/documented.json`), or delete it to compare with "
        "nothing and rerun with --record"
    )
    documented = read_json(path, fix=f"{fix}.")
    for size, rows in documented.items():
        check_json_shape(rows, f"{path} [{size!r}]", f"{fix}.")
        for row_id, entry in rows.items():
            check_json_shape(entry, f"{path} [{size!r}][{row_id!r}]", f"{fix}.", keys=("value", "lo", "hi"))
            if not all(isinstance(entry[k], (int, float)) and not isinstance(entry[k], bool) for k in ("lo", "hi")):
                raise CorruptFileError(f"{path} [{size!r}][{row_id!r}]", "'lo' and 'hi' are not numbers", f"{fix}.")
    return documented


def _interval(row: Row, value: float, lo: float | None, hi: float | None) -> tuple[float, float]:
    """value ± tolerance, widened to the CI [lo, hi] where the figure has one."""
    low, high = value - row.tolerance, value + row.tolerance
    if lo is not None and hi is not None and not (math.isnan(lo) or math.isnan(hi)):
        low, high = min(low, lo), max(high, hi)
    return low, high


def missing_needs(name: str) -> str | None:
    """Why experiment ``name`` cannot run here (a corpus it needs is not installed, with the install command), or
    None."""
    for need in EXPERIMENTS[name].needs:
        if need == "broad":
            try:
                read_manifest()
            except MissingFileError as err:
                return str(err)
    return None


def _content_key(name: str, model, size: str) -> str:
    """The content fingerprint of an experiment's result: the model's weights (``weights_fingerprint``), the
    shipped dictionaries (their release manifests hold every file's SHA-256), the size and its settings."""
    release = hashlib.sha256()
    for manifest in sorted(shipped_root().glob("*/manifest.json")):
        release.update(manifest.read_bytes())
    record = {
        "size": size,
        "settings": EXPERIMENTS[name].sizes.get(size),
        "model": weights_fingerprint(model) if model is not None else None,
        "release": release.hexdigest(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _saved(name: str, size: str, out: Path, model=None) -> bool:
    """Whether ``out`` holds experiment ``name``'s result of this size, computed from the same content (model
    weights, shipped dictionaries, settings): only then does a rerun load it."""
    marker = out / "experiments" / name / "size.json"
    if not marker.exists():
        return False
    saved = read_json(marker, fix=f"Delete {marker.parent} and rerun.")
    return saved.get("size") == size and saved.get("fingerprint") == _content_key(name, model, size)


def _experiment(name: str, model, size: str, out: Path, seconds: dict[str, float]):
    experiment = EXPERIMENTS[name]
    folder = out / "experiments" / name
    marker = folder / "size.json"
    if _saved(name, size, out, model):
        print(f"[{name}] loaded from {folder} (delete it to measure again)", flush=True)
        seconds[name] = 0.0
        return experiment.result_cls.load(folder / "result")
    print(f"[{name}] {experiment.what} ({size}: {experiment.sizes[size]})", flush=True)
    start = time.perf_counter()
    cfg = experiment.preset(size)  # type: ignore[arg-type]
    cfg = replace(cfg, run=replace(cfg.run, out=str(folder)))  # its partial results resume from its folder
    with shipped_only():  # the documented figures are of the shipped files, not of a retrained cache entry
        result = experiment.run(model, cfg)
    seconds[name] = time.perf_counter() - start
    result.save(folder / "result")
    record = {"size": size, "fingerprint": _content_key(name, model, size), "seconds": seconds[name]}
    atomic_write_text(marker, json.dumps(record))
    print(f"[{name}] done in {seconds[name]:.0f} s", flush=True)
    return result


def check_experiments(names: tuple[str, ...] | list[str]) -> None:
    """Refuse a name that is not in :data:`EXPERIMENTS` (``ReproduceConfig.experiments``).

    Raises:
        InputError: the unknown names, with the valid ones.
    """
    unknown = [name for name in names if name not in EXPERIMENTS]
    if unknown:
        raise InputError(f"Unknown experiments {unknown}; choose from {list(EXPERIMENTS)}.")


def reproduce(model, cfg: ReproduceConfig | None = None, **overrides: Any) -> Reproduction:
    """Measure every row of ``cfg.size`` (see the module docstring); writes ``reproduction.{csv,md}`` to ``cfg.out``.

    Args:
        model: the embedded model (the documented figures are of SmolLM2-135M-Instruct and the shipped release).
        cfg / overrides: :class:`ReproduceConfig`.
    """
    cfg = resolve_config(ReproduceConfig, cfg, overrides)
    check_experiments(cfg.experiments)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = rows_for(cfg.size, set(cfg.experiments) or None)
    documented = load_documented().get(cfg.size, {})
    seconds: dict[str, float] = {}
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    records = []
    saved = {name for name in dict.fromkeys(r.experiment for r in rows) if _saved(name, cfg.size, out, model)}
    todo = [n for n in dict.fromkeys(r.experiment for r in rows) if n not in saved and missing_needs(n) is None]
    progress = _progress(todo, cfg.size)
    with progress.on_forward(model) if model is not None else nullcontext():
        for i, row in enumerate(rows, 1):
            if row.experiment not in results and row.experiment not in skipped:
                why = None if row.experiment in saved else missing_needs(row.experiment)
                if why is not None:
                    skipped[row.experiment] = why
                    print(f"[{row.experiment}] not measured: {why}", flush=True)
                else:
                    if row.experiment in todo:
                        progress.begin(todo.index(row.experiment) + 1, row.experiment)
                    results[row.experiment] = _experiment(row.experiment, model, cfg.size, out, seconds)
                    progress.end(row.experiment, seconds[row.experiment])
            records.append(_record(row, results, skipped, documented, i, len(rows)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    used = sorted({r.experiment for r in rows})
    result = Reproduction(
        size=cfg.size,
        rows=records,
        seconds=seconds,
        peak_rss_gb=peak,
        sizes={name: EXPERIMENTS[name].sizes[cfg.size] for name in used},
        skipped=skipped,
        config={"size": cfg.size, "experiments": list(cfg.experiments), "out": cfg.out},
    )
    atomic_write_text(out / "reproduction.md", result.markdown())
    columns, table = result.tables()["reproduction"].lists()
    atomic_write_text(out / "reproduction.csv", _csv(columns, table))
    if cfg.record:
        record(result, rows)
    return result


def _record(row: Row, results: dict[str, Any], skipped: dict[str, str], documented: dict, i: int, n: int) -> dict:
    """Row ``i`` of ``n`` beside its documented interval, printed as it is measured."""
    if row.experiment in skipped:
        value, lo, hi = math.nan, None, None
    else:
        value, lo, hi = row.value(results[row.experiment])
    doc = documented.get(row.id)
    inside = None if doc is None or row.experiment in skipped else bool(doc["lo"] <= value <= doc["hi"])
    record = {
        "id": row.id,
        "section": row.section,
        "headline": row.headline,
        "paper": row.paper,
        "documented": None if doc is None else doc["value"],
        "documented_lo": None if doc is None else doc["lo"],
        "documented_hi": None if doc is None else doc["hi"],
        "value": value,
        "value_lo": lo,
        "value_hi": hi,
        "inside": inside,
        "skipped": row.experiment in skipped,
    }
    verdict = {True: "inside", False: "OUTSIDE", None: "not documented"}[inside]
    verdict = "not measured" if row.experiment in skipped else verdict
    shown = _fmt(None if doc is None else doc["value"], *(None, None) if doc is None else (doc["lo"], doc["hi"]))
    print(f"[{i}/{n}] {row.id}: {_fmt(value, lo, hi)} (documented {shown}; paper {row.paper}) {verdict}")
    sys.stdout.flush()
    return record


def _progress(todo: list[str], size: str) -> Progress:
    """The overall progress of the experiments to measure: each one's cost model (``Experiment.forward_tokens``) times
    the seconds per token of the run's first forward batch, rescaled as experiments finish."""
    option = "size (--quick)" if size == "full" else "--experiments list"
    return Progress(
        todo,
        lambda rate: {n: (EXPERIMENTS[n].forward_tokens.get(size, 0) * rate, option) for n in todo},
        time.perf_counter(),
        command="reproduce",
    )


def _csv(columns: list[str], rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()


def record(result: Reproduction, rows: list[Row], path: Path | None = None) -> None:
    """Write ``result``'s figures as the documented values of its size (interval: ± tolerance, widened to its CI);
    entries of rows that no longer exist are dropped."""
    path = path or DOCUMENTED
    by_id = {r.id: r for r in rows}
    documented = load_documented(path)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    known = {r.id for r in row_table.ROWS}  # entries of rows that no longer exist are dropped
    size = {k: v for k, v in documented.get(result.size, {}).items() if k in known}
    documented[result.size] = size
    for r in result.rows:
        if math.isnan(r["value"]):
            continue
        lo, hi = _interval(by_id[r["id"]], r["value"], r["value_lo"], r["value_hi"])
        size[r["id"]] = {"value": r["value"], "lo": lo, "hi": hi, "recorded": stamp}
    atomic_write_text(path, json.dumps(documented, indent=1, sort_keys=True) + "\n")


def check_reproduce(cfg: Any, dims: Any) -> None:
    """``tlql reproduce`` before the model loads: every experiment named exists."""
    check_experiments(cfg.reproduce.experiments)


def run_reproduce(model, cfg: Any) -> Reproduction:
    """``tlql reproduce`` (:class:`~tl_query_lens.reproduce.config.ReproduceCommandConfig`): :func:`reproduce` with
    the command's options; the result's ``exit_status`` is 1 when a figure left its documented interval."""
    return reproduce(model, cfg.reproduce)
