"""Errors a user can fix (the checks of tensors and devices that raise them: :mod:`tl_query_lens.tensor_checks`).

Every exception here derives from :class:`InputError` (a ``ValueError``) and carries a message that names the fix.
The ``tlql`` command line reports them in one or two lines with exit status 2 (``--debug`` shows the traceback);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import numbers
import os
import pickle
import re
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """An argument, file, tensor or dictionary handed to tl_query_lens is unusable; the message says how to fix it."""


class OutOfRangeError(InputError, IndexError):
    """An id (feature, token, layer) outside its valid range."""


class InputTypeError(InputError, TypeError):
    """An input of the wrong type or shape (e.g. a list where a token tensor is expected)."""


class UnknownNameError(InputError, KeyError):
    """A name (hook, label) that is not among the valid ones; the message lists them."""

    def __str__(self) -> str:  # KeyError would print the repr() of the message
        return str(self.args[0]) if self.args else ""


class HookNotFoundError(UnknownNameError):
    """A hook name the model does not have."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder the user named that does not exist."""


class UnsupportedModelError(InputError, NotImplementedError):
    """A model layout a method does not model (e.g. OLMo-2/3 norms after each module for FF-KV); names what works."""


class UnavailableError(InputError, RuntimeError):
    """A model or dataset that cannot be reached from here (no hub, package missing)."""


class CorruptFileError(InputError):
    """A file on disk that cannot be read as what it claims to be; names the file and the fix.

    Args:
        path: the offending file or folder.
        problem: what is wrong with it.
        fix: what to do (delete it, recompute, re-save).
    """

    def __init__(self, path: str | Path, problem: str, fix: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {problem}. {fix}")


class NonFiniteError(InputError):
    """NaN or inf in a dictionary's weights, a model's activations or a method's outputs."""


class WriteError(InputError, OSError):
    """A result, cache or checkpoint that could not be written (disk full, read-only, name too long); the message
    names the path and the fix. Nothing half-written is left behind and parts already written are kept."""


class LockedError(InputError):
    """An output folder another running process is writing to."""


_WRITE_FIXES = {
    errno.ENOSPC: "the disk is full: free space there or choose another folder",
    errno.EDQUOT: "the disk quota is exhausted: free space there or choose another folder",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "permission denied: choose a folder you can write",
    errno.EPERM: "permission denied: choose a folder you can write",
    errno.ENAMETOOLONG: "the name is too long for the file system: choose a shorter path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EISDIR: "a folder stands where the file should be written: remove it or choose another path",
}


def write_error(path: str | Path, err: OSError) -> WriteError:
    """A :class:`WriteError` for ``err`` raised while writing ``path``, naming the path and the fix."""
    fix = _WRITE_FIXES.get(err.errno or 0, f"{err.strerror or err}: check the folder and rerun")
    return WriteError(err.errno or 0, f"Could not write {path}: {fix}. Results finished before it were kept.")


_OS_CODE = re.compile(r"code: (\d+)")


def write_error_of(path: str | Path, err: Exception) -> WriteError:
    """:func:`write_error` for an ``OSError`` or for a writer's own error that wraps one (safetensors raises a
    ``SafetensorError``, not an ``OSError``, on a full disk: its message holds ``Os { code: 28, ... }``)."""
    if isinstance(err, OSError):
        return write_error(path, err)
    found = _OS_CODE.search(str(err))
    code = int(found.group(1)) if found else 0
    return write_error(path, OSError(code, os.strerror(code) if code else str(err).splitlines()[0]))


def check_json_shape(record: Any, path: str | Path, fix: str, *, shape: type = dict, keys: tuple[str, ...] = ()) -> Any:
    """``record`` (read from the JSON file ``path``) if it is a ``shape`` (a JSON object by default) holding every
    one of ``keys``; else :class:`CorruptFileError` naming the file, what it holds instead and ``fix``."""
    if not isinstance(record, shape) or isinstance(record, bool):
        names: dict[Any, str] = {dict: "a JSON object", list: "a JSON list", str: "a JSON string"}
        got = names.get(type(record), "null" if record is None else f"a JSON {type(record).__name__}")
        raise CorruptFileError(path, f"holds {got}, not {names.get(shape, shape.__name__)}", fix)
    missing = [key for key in keys if key not in record]  # type: ignore[operator]
    if missing:
        raise CorruptFileError(path, f"lacks the fields {missing}", fix)
    return record


def boundary_error(err: BaseException) -> InputError | None:
    """The command line's one error boundary: an :class:`InputError` (one line naming the file, option or variable
    and the fix) for an exception from a library that a user's input, file or machine caused; None for bugs.

    Call sites that know the file raise their own :class:`InputError` first; this is what still reaches the top:
    a safetensors file (``SafetensorError``), a JSON file (``JSONDecodeError``), a pickle (``UnpicklingError``),
    a write (``OSError`` of a full, read-only or foreign disk), CUDA asked for without CUDA, memory exhausted.
    """
    if isinstance(err, InputError):
        return err
    kind = type(err).__name__
    text = " ".join(str(err).split())[:300]
    if kind == "SafetensorError":
        if "code: " in text:
            return write_error_of("a .safetensors file", err)  # type: ignore[arg-type]
        return InputError(
            f"A .safetensors file is not readable ({text}); it is truncated or not a safetensors file. Delete the "
            "file named in the log and rerun, or rerun with --debug to see which one."
        )
    if isinstance(err, json.JSONDecodeError):
        return InputError(f"A JSON file is not valid JSON ({text}); rerun with --debug to see which one, then fix it.")
    if isinstance(err, pickle.UnpicklingError):
        return InputError(
            f"A checkpoint file refused to load ({text.split('.')[0]}): it is corrupt or was not written by "
            "tl_query_lens, so it is not loaded. Delete it (the work it held is recomputed)."
        )
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) and err.filename:
        return write_error(err.filename, err)  # only a write meets these
    if isinstance(err, OSError) and err.errno in _WRITE_FIXES and err.filename:  # a read or a write: say which file
        return InputError(f"{err.filename}: {err.strerror or err}; check that path and its permissions, and rerun.")
    if isinstance(err, (AssertionError, RuntimeError)) and re.search(
        r"not compiled with CUDA|no NVIDIA driver|CUDA driver|No CUDA GPUs", text
    ):
        return InputError(f"CUDA is not available here ({text}); use --device cpu (or leave --device out).")
    if isinstance(err, MemoryError) or kind == "OutOfMemoryError":
        return InputError(
            "The run ran out of memory; lower the sizes given (--n-seqs, --seq-len, --batch-size, widths) and "
            "rerun (results already written are kept)."
        )
    return None


def check_ids(ids: Any, upper: int | None, what: str = "feature ids") -> list[int]:
    """Integer ids in ``0..upper-1``: a list, tuple, range or integer tensor / array of them.

    Floats (``1.9`` is not silently id 1) and boolean masks (not ids 0/1) are refused, as are ids out of range.

    Raises:
        InputTypeError: not integers (floats, booleans, strings).
        OutOfRangeError: an id below 0 or at/above ``upper``.
    """
    dtype = getattr(ids, "dtype", None)
    if dtype is not None:  # a tensor or array: decide by its dtype, not by its values
        kind = str(dtype).replace("torch.", "")
        if kind == "bool":
            raise InputTypeError(
                f"{what}: a boolean mask is not a list of ids; pass mask.nonzero().flatten() (the ids where it is "
                "True) instead."
            )
        if not kind.startswith(("int", "uint")):
            raise InputTypeError(f"{what} must be integers, got a {kind} tensor; round or cast them deliberately.")
        ids = ids.reshape(-1).tolist()
    elif isinstance(ids, numbers.Integral) and not isinstance(ids, bool):
        ids = [ids]
    values = list(ids)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
    if bad:
        raise InputTypeError(
            f"{what} must be integers; got {bad[:5]!r}"
            + (
                " (booleans: pass the ids, not a mask)"
                if any(isinstance(v, bool) for v in bad)
                else " (round or cast them deliberately)"
            )
            + "."
        )
    values = [int(v) for v in values]
    out = [v for v in values if v < 0 or (upper is not None and v >= upper)]
    if out:
        valid = f"0..{upper - 1}" if upper is not None else "≥ 0"
        raise OutOfRangeError(f"{what} {out[:10]} out of range; valid: {valid}.")
    return values
