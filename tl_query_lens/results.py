"""Results on disk: JSON + safetensors, written atomically, before anything is logged (DESIGN §8)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file
from typing_extensions import Self

T = TypeVar("T", bound="SavableResult")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.Tensor):
        return _jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be read by others
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """Atomically write JSON (NaN/inf stored as strings, tensors as lists)."""
    return atomic_write_text(path, json.dumps(_jsonable(data), indent=2))


def write_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write a safetensors file; metadata values are stored as JSON strings."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    meta = {k: json.dumps(_jsonable(v)) for k, v in (metadata or {}).items()}
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp, metadata=meta)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def read_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a safetensors file written by :func:`write_tensors`: ``(tensors, metadata)``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = {k: json.loads(v) for k, v in (handle.metadata() or {}).items()}
    return load_file(str(path)), meta


class SavableResult:
    """Mixin for result dataclasses: tensor fields go to ``tensors.safetensors``, the rest to ``result.json``."""

    def save(self, path: str | Path) -> Path:
        """Save into folder ``path`` (created); returns it."""
        path = Path(path)
        tensors, plain = {}, {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                tensors[field.name] = value
            else:
                plain[field.name] = value
        if tensors:
            write_tensors(path / "tensors.safetensors", tensors)
        write_json(path / "result.json", {"type": type(self).__name__, "fields": plain})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Load a result saved with :meth:`save`."""
        path = Path(path)
        record = json.loads((path / "result.json").read_text(encoding="utf-8"))
        if record.get("type") != cls.__name__:
            raise TypeError(f"{path} holds a {record.get('type')}, not a {cls.__name__}.")
        fields = dict(record["fields"])
        tensor_file = path / "tensors.safetensors"
        if tensor_file.exists():
            fields.update(load_file(str(tensor_file)))
        return cls(**fields)  # type: ignore[call-arg]
