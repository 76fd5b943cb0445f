"""W&B logging shared by every analysis: offline by default, and only of what is already on disk (docs/design.md §8)."""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
from pathlib import Path
from typing import Any

from typing_extensions import Self

from tl_query_lens.presentation import Presentable
from tl_query_lens.results import atomic_write_text, write_json
from tl_query_lens.wandb_env import wandb_env_problem

logger = logging.getLogger(__name__)


class Tracker:
    """One analysis run: every table, scalar set and plot is written under ``out_dir`` at once; W&B comes last.

    The W&B run is opened only when the tracker finishes (the end of its ``with`` block, after the results are on
    disk), and everything logged is replayed into it then. If W&B fails (no API key, no network, a refused server),
    every result stays on disk, the run is written offline instead where possible, and a warning says how to log it
    later (``wandb sync``) or skip W&B (``--no-wandb`` / ``use_wandb=False``, ``WANDB_MODE=offline``). A block that
    raises logs nothing to W&B (its files stay on disk).

    Args:
        out_dir: results folder (created).
        project: W&B project.
        name: run name.
        config: run config (also written to ``out_dir/config.json``).
        use_wandb: False keeps everything on disk only.

    ``WANDB_MODE`` defaults to ``offline``; a user's own ``WANDB_MODE`` wins. Run files go to ``WANDB_DIR`` if set,
    else ``out_dir``. ``WANDB_INIT_TIMEOUT`` (seconds) bounds how long an unreachable server is retried. After :meth:`finish`, ``run_dir`` is the W&B run folder (None without a run) and
    ``wandb_error`` the reason W&B failed (None if it did not).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        project: str = "tl_query_lens",
        name: str | None = None,
        config: dict[str, Any] | None = None,
        use_wandb: bool = True,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.config = dict(config or {})
        write_json(self.out_dir / "config.json", self.config)
        self.project, self.name, self.use_wandb = project, name, use_wandb
        self.run_dir: Path | None = None
        self.wandb_error: str | None = None
        self._pending: list[tuple[str, tuple]] = []  # W&B calls, replayed by finish()
        self._finished = False

    def log_scalars(self, name: str, values: dict[str, float], step: int | None = None) -> Path:
        """Write ``out_dir/{name}.json``; W&B gets the values (keys prefixed by ``name/``) at :meth:`finish`."""
        path = write_json(self.out_dir / f"{name}.json", values)
        self._pending.append(("scalars", ({f"{name}/{k}": v for k, v in values.items()}, step)))
        return path

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]]) -> Path:
        """Write ``out_dir/{name}.csv``; W&B gets it as a ``wandb.Table`` at :meth:`finish`."""
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        path = atomic_write_text(self.out_dir / f"{name}.csv", buffer.getvalue())
        self._pending.append(("table", (name, list(columns), [list(r) for r in rows])))
        return path

    def log_plot(self, name: str, figure) -> Path:
        """Write a plotly figure to ``out_dir/{name}.html`` (JavaScript embedded: opens offline); logged at finish."""
        path = atomic_write_text(self.out_dir / f"{name}.html", figure.to_html(include_plotlyjs=True, full_html=True))
        self._pending.append(("html", (name, path)))
        return path

    def log_result(self, result: Presentable, name: str | None = None, *, step: int | None = None) -> dict[str, Path]:
        """Log a result through its presentation interface, and nothing else of it.

        ``result.scalars()`` go to ``out_dir/{name}.json`` and to W&B as ``{name}/{key}`` (history and run summary);
        each of ``result.tables()`` to ``out_dir/{name}_{table}.csv`` and a ``wandb.Table``; each of
        ``result.figures()`` to ``out_dir/{name}_{figure}.html`` and a W&B plotly chart. ``name`` defaults to the
        result class's name in snake case. Returns the files written, by what they hold (``"scalars"``,
        ``"table/{table}"``, ``"figure/{figure}"``).

        Raises:
            TypeError: a table cell whose type is not its column's (the result's ``tables()`` is wrong).
        """
        name = name or _snake(type(result).__name__)
        written: dict[str, Path] = {}
        scalars = result.scalars()
        if scalars:
            written["scalars"] = self.log_scalars(name, scalars, step=step)
            self._pending.append(("summary", ({f"{name}/{k}": v for k, v in scalars.items()},)))
        for key, table in result.tables().items():
            table.check()
            written[f"table/{key}"] = self.log_table(f"{name}_{key}", *table.lists())
        for key, figure in result.figures().items():
            path = atomic_write_text(
                self.out_dir / f"{name}_{key}.html", figure.to_html(include_plotlyjs=True, full_html=True)
            )
            self._pending.append(("plotly", (f"{name}_{key}", figure, path)))
            written[f"figure/{key}"] = path
        return written

    def log_artifact(self, name: str, paths: list[str | Path], *, type: str = "results") -> None:
        """Log files or folders already on disk as one W&B artifact (at :meth:`finish`)."""
        missing = [str(p) for p in paths if not Path(p).exists()]
        if missing:
            raise FileNotFoundError(f"Artifact {name!r}: write these to disk before logging: {missing}")
        self._pending.append(("artifact", (name, [Path(p) for p in paths], type)))

    # ----- W&B, after the results are on disk -------------------------------------------------------------------
    def finish(self) -> None:
        """Open the W&B run, replay everything logged, close it; a W&B failure only warns (results are on disk)."""
        if self._finished:
            return
        self._finished = True
        if not self.use_wandb:
            return
        try:
            import wandb
        except ImportError as err:
            self._warn(
                f"wandb is not installed ({err}); install it with `pip install wandb`",
                offline_dir=None,
                retry_offline=False,
            )
            return
        mode = os.environ.get("WANDB_MODE", "offline")
        problem = wandb_env_problem()  # a bad WANDB_DIR / WANDB_INIT_TIMEOUT is named, not retried offline
        if problem:
            self._warn(problem, offline_dir=None, retry_offline=False)
            return
        with _quiet_logging_errors():
            self._finish_wandb(wandb, mode)

    def _finish_wandb(self, wandb, mode: str) -> None:
        try:
            self._log_run(wandb, mode)
        except (wandb.errors.Error, OSError) as err:  # no key, unreachable or refusing server, disk
            reason = _one_line(err)
            if mode == "offline":
                self._warn(reason, offline_dir=None, retry_offline=False)
                return
            try:
                self._log_run(wandb, "offline")
            except (wandb.errors.Error, OSError) as offline_err:
                self._warn(f"{reason}; offline logging failed too ({_one_line(offline_err)})", offline_dir=None)
                return
            self._warn(reason, offline_dir=self.run_dir)

    def _log_run(self, wandb, mode: str) -> None:
        wandb_dir = Path(os.environ.get("WANDB_DIR", self.out_dir))
        wandb_dir.mkdir(parents=True, exist_ok=True)
        timeout = os.environ.get("WANDB_INIT_TIMEOUT")  # seconds W&B retries an unreachable server (default 90)
        settings = wandb.Settings(init_timeout=float(timeout)) if timeout else None
        run = wandb.init(
            project=self.project,
            name=self.name,
            config=self.config,
            mode=mode,
            dir=str(wandb_dir),
            reinit="finish_previous",
            settings=settings,
        )
        try:
            for kind, payload in self._pending:
                if kind == "scalars":
                    run.log(payload[0], step=payload[1])
                elif kind == "table":
                    run.log({payload[0]: wandb.Table(columns=payload[1], data=payload[2])})
                elif kind == "html":
                    run.log({payload[0]: wandb.Html(str(payload[1]))})
                elif kind == "summary":
                    run.summary.update(payload[0])
                elif kind == "plotly":
                    run.log({payload[0]: _plotly_or_html(wandb, payload[1], payload[2])})
                else:
                    name, paths, kind_name = payload
                    artifact = wandb.Artifact(name, type=kind_name)
                    for p in paths:
                        if p.is_dir():
                            artifact.add_dir(str(p), name=p.name)
                        else:
                            artifact.add_file(str(p))
                    run.log_artifact(artifact)
        finally:
            self.run_dir = Path(run.dir).parent
            run.finish()

    def _warn(self, reason: str, *, offline_dir: Path | None, retry_offline: bool = True) -> None:
        """One warning: why, where the results are, and only advice that can help (offline logging is not
        suggested when the run was offline already or the environment itself is wrong)."""
        self.wandb_error = reason
        if offline_dir is not None:
            later = (
                f" It was logged offline to {offline_dir}: upload it with `wandb sync {offline_dir}` once W&B is "
                "reachable (after `wandb login`). To log offline from the start set WANDB_MODE=offline."
            )
        elif retry_offline:
            later = " Rerun with WANDB_MODE=offline to keep an offline run for `wandb sync`."
        else:
            later = ""
        logger.warning(
            "W&B logging failed (%s). Every result is on disk under %s.%s To skip W&B pass --no-wandb "
            "(Python: use_wandb=False).",
            reason,
            self.out_dir,
            later,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._finished = True
            if self.use_wandb and self._pending:
                logger.info(
                    "Nothing logged to W&B because the run stopped early; the files under %s are kept.", self.out_dir
                )


@contextlib.contextmanager
def _quiet_logging_errors():
    """While W&B runs: a log handler that cannot write (a full disk under W&B's own debug log) drops the record
    instead of printing a traceback to stderr for each one (``logging.raiseExceptions``); the one warning of
    :meth:`Tracker._warn` still says what failed."""
    before = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        yield
    finally:
        logging.raiseExceptions = before


def _snake(name: str) -> str:
    """``SignatureEvaluation`` → ``signature_evaluation``."""
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _plotly_or_html(wandb, figure, path: Path):
    """A W&B plotly chart of ``figure``; its HTML file when W&B cannot convert it (e.g. a figure with annotations
    that its converter refuses)."""
    try:
        return wandb.Plotly(figure)
    except (ValueError, TypeError, AttributeError):
        return wandb.Html(str(path))


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def read_offline_records(wandb_file: str | Path) -> list[Any]:
    """Parse an offline run's ``.wandb`` transaction log into ``wandb_internal_pb2.Record`` messages.

    wandb 0.31 offline runs write no summary file; the log is a LevelDB-style record stream (7-byte ``:W&B`` header,
    32 KiB blocks, records split FULL/FIRST/MIDDLE/LAST). Used to check what a run logged without any server.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(wandb_file).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{wandb_file} is not a W&B transaction log.")
    block, header, pos = 32768, 7, 7
    records, pending = [], b""
    while pos + header <= len(data):
        left_in_block = block - pos % block
        if left_in_block < header:
            pos += left_in_block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records
