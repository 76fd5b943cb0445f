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

from tl_query_lens.errors import CorruptFileError

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


RERUN_FIX = "Delete it and rerun the command that wrote it."


def read_tensors(path: str | Path, *, fix: str = RERUN_FIX) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a safetensors file written by :func:`write_tensors`: ``(tensors, metadata)``.

    Raises:
        CorruptFileError: the file is missing, truncated or not safetensors (the message names it and ``fix``).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(path, "is missing", fix)
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = {k: json.loads(v) for k, v in (handle.metadata() or {}).items()}
        return load_file(str(path)), meta
    except (SafetensorError, json.JSONDecodeError, OSError, RuntimeError) as err:
        raise CorruptFileError(path, f"is not a readable safetensors file ({_first_line(err)})", fix) from err


def read_json(path: str | Path, *, fix: str = RERUN_FIX) -> Any:
    """Read a JSON file; a missing or malformed file raises :class:`~tl_query_lens.errors.CorruptFileError`."""
    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(path, "is missing", fix)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptFileError(path, f"is not valid JSON ({_first_line(err)})", fix) from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


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
        if not path.is_dir():
            raise CorruptFileError(path, f"is not a folder holding a saved {cls.__name__}",
                                   "Pass the folder that .save() wrote.")
        fix = f"Delete {path} and rerun the command that wrote it."
        record = read_json(path / "result.json", fix=fix)
        if not isinstance(record, dict) or "fields" not in record:
            raise CorruptFileError(path / "result.json", "has no 'type' and 'fields' entries", fix)
        if record.get("type") != cls.__name__:
            raise TypeError(f"{path} holds a {record.get('type')}, not a {cls.__name__}.")
        fields = dict(record["fields"])
        tensor_file = path / "tensors.safetensors"
        if tensor_file.exists():
            fields.update(read_tensors(tensor_file, fix=fix)[0])
        try:
            return cls(**fields)  # type: ignore[call-arg]
        except TypeError as err:  # missing or unexpected fields: a partial folder or another version
            raise CorruptFileError(path, f"does not hold the fields of a {cls.__name__} ({err})", fix) from err
