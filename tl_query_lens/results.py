"""Results on disk: JSON + safetensors, written atomically, before anything is logged (docs/design.md §8)."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from functools import partial
from pathlib import Path
from typing import Any

import torch
from sae_lens import SAE
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from typing_extensions import Self

from tl_query_lens.errors import CorruptFileError, check_json_shape
from tl_query_lens.paths import atomic_write, atomic_write_with, inside, result_name, result_names
from tl_query_lens.presentation import Presents

# JSON has no NaN or infinities (JavaScript's JSON.parse and other strict readers refuse the tokens NaN / Infinity);
# they are written as {"__float__": "nan" | "inf" | "-inf"} and read back as floats by loads_json / read_json.
FLOAT_KEY = "__float__"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.Tensor):
        return _jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_KEY: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    return value


def _decode_float(record: dict[str, Any]) -> Any:
    if len(record) == 1 and record.get(FLOAT_KEY) in _NON_FINITE:
        return _NON_FINITE[record[FLOAT_KEY]]
    return record


def dumps_json(data: Any, **kwargs: Any) -> str:
    """Standard JSON of ``data`` (dataclasses, tensors, paths, numpy scalars converted; NaN / ±inf as
    ``{"__float__": "nan" | "inf" | "-inf"}``, so strict parsers read it and :func:`loads_json` restores them)."""
    return json.dumps(_jsonable(data), allow_nan=False, **kwargs)


def loads_json(text: str) -> Any:
    """Parse JSON written by :func:`dumps_json` (non-finite floats restored exactly; the bare tokens NaN / Infinity
    of files written before are read too)."""
    return json.loads(text, object_hook=_decode_float)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename (no ``.tmp`` is left on
    failure; ``OSError`` becomes :class:`~tl_query_lens.errors.WriteError` naming the path and the fix)."""
    with atomic_write(path) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    """Atomically write standard JSON (see :func:`dumps_json`)."""
    return atomic_write_text(path, dumps_json(data, indent=2))


def write_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write a safetensors file; metadata values are stored as JSON strings."""
    meta = {k: dumps_json(v) for k, v in (metadata or {}).items()}
    cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return atomic_write_with(path, lambda tmp: save_file(cpu, tmp, metadata=meta))


RERUN_FIX = "Delete it and rerun the command that wrote it."


def read_tensors(path: str | Path, *, fix: str = RERUN_FIX) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a safetensors file written by :func:`write_tensors`: ``(tensors, metadata)``.

    Raises:
        CorruptFileError: the file is missing, truncated or not safetensors (the message names it and ``fix``).
    """
    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(path, "is missing", fix)
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = {k: loads_json(v) for k, v in (handle.metadata() or {}).items()}
        return load_file(str(path)), meta
    except (SafetensorError, json.JSONDecodeError, OSError, RuntimeError) as err:
        raise CorruptFileError(path, f"is not a readable safetensors file ({_first_line(err)})", fix) from err


def read_json(path: str | Path, *, fix: str = RERUN_FIX, shape: type | None = dict, keys: tuple[str, ...] = ()) -> Any:
    """Read a JSON file and check its shape: a ``shape`` (a JSON object unless told; None: anything) holding every
    one of ``keys``. A missing, malformed or misshapen file raises :class:`~tl_query_lens.errors.CorruptFileError`
    naming it and ``fix``."""
    path = Path(path)
    if not path.is_file():
        raise CorruptFileError(path, "is missing", fix)
    try:
        record = loads_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CorruptFileError(path, f"is not valid JSON ({_first_line(err)})", fix) from err
    except OSError as err:
        raise CorruptFileError(path, f"cannot be read ({err.strerror or err})", fix) from err
    return record if shape is None else check_json_shape(record, path, fix, shape=shape, keys=keys)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _is_result_type(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, SavableResult)


def _is_sae_type(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, SAE)


def _dict_value_type(hint: Any) -> Any:
    return typing.get_args(hint)[1] if typing.get_origin(hint) is dict and len(typing.get_args(hint)) == 2 else None


def _optional(hint: Any) -> Any:
    """``X | None`` → X (other hints unchanged)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


class SavableResult(Presents):
    """Mixin for result dataclasses: one folder per result, written before anything is logged.

    Tensor fields go to ``tensors.safetensors``, plain fields to ``result.json``; fields that are themselves results
    (or dicts of results) go to sub-folders, SAELens SAEs to an SAELens folder, plain dataclasses (configs) to JSON
    and back through their type. NaN and ±inf round-trip as floats. Loading reads the field types from the class's
    annotations, so a subclass needs nothing but its fields (override :meth:`_subfolder` to choose folder names).
    It presents itself through :class:`~tl_query_lens.presentation.Presents` (scalars, tables, figures, a report
    section), whose defaults a subclass overrides where it has tables or figures.
    """

    def _subfolder(self, name: str, key: Any = None) -> str:
        """Folder (relative to the result's) of field ``name``, or of its entry ``key`` for a dict of results
        (:func:`~tl_query_lens.paths.result_name`: one folder per key)."""
        return name if key is None else f"{name}/{result_name(key)}"

    def save(self, path: str | Path) -> Path:
        """Save into folder ``path`` (created); returns it."""
        path = Path(path)
        tensors: dict[str, torch.Tensor] = {}
        plain: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor):
                tensors[field.name] = value
            elif isinstance(value, SavableResult) or _is_sae(value):
                folder = self._subfolder(field.name)
                _save_part(value, path / folder)
                nested[field.name] = {"folder": folder}
            elif isinstance(value, dict) and value and all(isinstance(v, SavableResult) for v in value.values()):
                entries = []
                folders = result_names(
                    value, f"{type(self).__name__}.{field.name} keys", partial(self._subfolder, field.name)
                )
                for (key, item), folder in zip(value.items(), folders):
                    item.save(path / folder)
                    entries.append([key, folder])
                nested[field.name] = {"entries": entries}
            else:
                plain[field.name] = value
        path.mkdir(parents=True, exist_ok=True)
        if tensors:
            write_tensors(path / "tensors.safetensors", tensors)
        write_json(path / "result.json", {"type": type(self).__name__, "fields": plain, "nested": nested})
        return path

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Load a result saved with :meth:`save`."""
        path = Path(path)
        if not path.is_dir():
            raise CorruptFileError(
                path, f"is not a folder holding a saved {cls.__name__}", "Pass the folder that .save() wrote."
            )
        fix = f"Delete {path} and rerun the command that wrote it."
        record = read_json(path / "result.json", fix=fix)
        if not isinstance(record, dict) or "fields" not in record:
            raise CorruptFileError(path / "result.json", "has no 'type' and 'fields' entries", fix)
        if record.get("type") != cls.__name__:
            raise TypeError(f"{path} holds a {record.get('type')}, not a {cls.__name__}.")
        hints = typing.get_type_hints(cls)
        fields = {}
        for name, value in record["fields"].items():
            hint = _optional(hints.get(name))
            is_config = dataclasses.is_dataclass(hint) and not _is_result_type(hint)
            fields[name] = hint(**value) if is_config and isinstance(value, dict) else value
        for name, spec in record.get("nested", {}).items():
            hint = _optional(hints[name])
            where = f"{path / 'result.json'} (nested field {name!r})"
            if "entries" in spec:
                item_type = _dict_value_type(hint)
                fields[name] = {key: item_type.load(inside(path, folder, where)) for key, folder in spec["entries"]}
            else:
                fields[name] = _load_part(hint, inside(path, spec["folder"], where))
        tensor_file = path / "tensors.safetensors"
        if tensor_file.exists():
            fields.update(read_tensors(tensor_file, fix=fix)[0])
        try:
            return cls(**fields)  # type: ignore[call-arg]
        except TypeError as err:  # missing or unexpected fields: a partial folder or another version
            raise CorruptFileError(path, f"does not hold the fields of a {cls.__name__} ({err})", fix) from err


def _is_sae(value: Any) -> bool:
    return hasattr(value, "save_model") and hasattr(value, "cfg")


def _save_part(value: Any, folder: Path) -> None:
    if isinstance(value, SavableResult):
        value.save(folder)
    else:
        value.save_model(folder)


def _load_part(hint: Any, folder: Path) -> Any:
    if _is_result_type(hint):
        return hint.load(folder)
    if _is_sae_type(hint):
        return SAE.load_from_disk(folder)
    raise TypeError(f"Cannot load a field of type {hint!r} from {folder}.")
