"""W&B logging shared by every analysis: offline by default, and only of what is already on disk (DESIGN §8)."""

from __future__ import annotations

import csv
import io
import logging
import os
from pathlib import Path
from typing import Any

from typing_extensions import Self

from tl_query_lens.results import atomic_write_text, write_json

logger = logging.getLogger(__name__)


class Tracker:
    """One analysis run: every table, scalar set and plot is written under ``out_dir`` first, then logged to W&B.

    Args:
        out_dir: results folder (created).
        project: W&B project.
        name: run name.
        config: run config (also written to ``out_dir/config.json``).
        use_wandb: False keeps everything on disk only.

    ``WANDB_MODE`` defaults to ``offline``; a user's own ``WANDB_MODE`` wins. Run files go to ``WANDB_DIR`` if set,
    else ``out_dir``.
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
        self.run = None
        if use_wandb:
            try:
                import wandb
            except ImportError as err:
                raise ImportError(
                    "W&B logging needs `pip install wandb`; or pass use_wandb=False (CLI: --no-wandb). "
                    f"Results already computed are on disk under {self.out_dir}."
                ) from err
            self._wandb = wandb
            mode = os.environ.get("WANDB_MODE", "offline")
            wandb_dir = Path(os.environ.get("WANDB_DIR", self.out_dir))
            wandb_dir.mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(
                project=project, name=name, config=self.config, mode=mode, dir=str(wandb_dir), reinit="finish_previous"
            )

    @property
    def run_dir(self) -> Path | None:
        """The W&B run folder (holds the offline ``.wandb`` file), or None without W&B."""
        return Path(self.run.dir).parent if self.run is not None else None

    def log_scalars(self, name: str, values: dict[str, float], step: int | None = None) -> Path:
        """Write ``out_dir/{name}.json`` and log the values (keys prefixed by ``name/``)."""
        path = write_json(self.out_dir / f"{name}.json", values)
        if self.run is not None:
            self.run.log({f"{name}/{k}": v for k, v in values.items()}, step=step)
        return path

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]]) -> Path:
        """Write ``out_dir/{name}.csv`` and log it as a ``wandb.Table``."""
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        path = atomic_write_text(self.out_dir / f"{name}.csv", buffer.getvalue())
        if self.run is not None:
            self.run.log({name: self._wandb.Table(columns=columns, data=[list(r) for r in rows])})
        return path

    def log_plot(self, name: str, figure) -> Path:
        """Write a plotly figure to ``out_dir/{name}.html`` (JavaScript embedded: opens offline) and log it."""
        path = atomic_write_text(self.out_dir / f"{name}.html", figure.to_html(include_plotlyjs=True, full_html=True))
        if self.run is not None:
            self.run.log({name: self._wandb.Html(str(path))})
        return path

    def log_artifact(self, name: str, paths: list[str | Path], *, type: str = "results") -> None:
        """Log files or folders already on disk as one W&B artifact."""
        missing = [str(p) for p in paths if not Path(p).exists()]
        if missing:
            raise FileNotFoundError(f"Artifact {name!r}: write these to disk before logging: {missing}")
        if self.run is None:
            return
        artifact = self._wandb.Artifact(name, type=type)
        for p in map(Path, paths):
            if p.is_dir():
                artifact.add_dir(str(p), name=p.name)
            else:
                artifact.add_file(str(p))
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


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
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records
