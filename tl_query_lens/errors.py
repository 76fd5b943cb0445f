"""Errors a user can fix, and the non-finite checks every method shares.

Every exception here derives from :class:`InputError` (a ``ValueError``) and carries a message that names the fix.
The ``tlql`` command line reports them in one or two lines with exit status 2 (``--debug`` shows the traceback);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch


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


def count_non_finite(tensor: torch.Tensor) -> int:
    """Number of NaN / inf entries of a floating tensor (0 for integer and boolean tensors)."""
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.device.type == "meta":
        return 0  # integer/boolean tensors cannot hold NaN; values on the meta device are unknown
    return int((~torch.isfinite(tensor)).sum())


def check_finite(tensor: torch.Tensor, what: str, *, hint: str = "") -> torch.Tensor:
    """Return ``tensor`` if it is finite, else raise :class:`NonFiniteError` naming ``what`` (plus ``hint``)."""
    bad = count_non_finite(tensor)
    if bad:
        raise NonFiniteError(
            f"The {what} has {bad} non-finite entries (NaN/inf) of {tensor.numel()}." + (f" {hint}" if hint else "")
        )
    return tensor


def dictionary_name(dictionary: Any) -> str:
    """A short human name for a dictionary: class, read hook and, where different, write hook."""
    cfg = getattr(dictionary, "cfg", None)
    meta = getattr(cfg, "metadata", None)
    read = getattr(meta, "hook_name", None) or getattr(dictionary, "read_hook", "?")
    write = getattr(meta, "hook_name_out", None) or getattr(dictionary, "write_hook", None) or read
    where = read if write == read else f"{read} → {write}"
    return f"{type(dictionary).__name__} at {where}"


def check_dictionary_finite(dictionary: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming the dictionary and the first tensor that holds NaN/inf."""
    for name, tensor in tensors.items():
        bad = count_non_finite(tensor)
        if bad:
            raise NonFiniteError(
                f"The dictionary {dictionary_name(dictionary)} has {bad} non-finite entries (NaN/inf) in {name} "
                f"{tuple(tensor.shape)}. Its weights are corrupt or training diverged: reload or retrain it "
                "(if it was loaded from a folder, that folder's sae_weights.safetensors holds the bad values)."
            )


def check_outputs(
    result: Any, what: str, *, nan_only: tuple[str, ...] = (), skip: tuple[str, ...] = (), hint: str = ""
) -> Any:
    """Check every float and float-tensor field of a result dataclass before it is reported.

    Args:
        result: a dataclass instance (e.g. a :class:`~tl_query_lens.certify.Certificate`).
        what: the method's name, for the message.
        nan_only: fields where inf is a legitimate value (e.g. an N* that is never reached); NaN still fails.
        skip: fields not checked at all (e.g. diagnostics that are NaN by definition when empty).
        hint: where the non-finite values most likely come from.

    Returns:
        ``result`` unchanged.
    """
    bad_fields = []
    for field in dataclasses.fields(result):
        if field.name in skip:
            continue
        values = _floats(getattr(result, field.name))
        if values is None or values.numel() == 0:
            continue
        bad = int(torch.isnan(values).sum()) if field.name in nan_only else count_non_finite(values)
        if bad:
            bad_fields.append(f"{field.name} ({bad})")
    if bad_fields:
        raise NonFiniteError(
            f"{what} produced non-finite values in {', '.join(bad_fields)}; nothing was reported."
            + (f" {hint}" if hint else "")
        )
    return result


def _floats(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value.detach().double().reshape(-1) if value.is_floating_point() else None
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return torch.tensor([value], dtype=torch.float64)
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, float) and not isinstance(v, bool) for v in value)
    ):
        return torch.tensor([float(v) for v in value], dtype=torch.float64)
    return None
