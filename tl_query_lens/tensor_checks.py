"""The checks of tensors, dictionaries, results and devices every method shares: non-finite values (NaN / inf) and a
device this machine lacks, each refused with an :class:`~tl_query_lens.errors.InputError` that names the fix.

They import torch; :mod:`tl_query_lens.errors` (which the configs import) does not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tl_query_lens.errors import NonFiniteError, UnavailableError


def check_device(device: Any, what: str = "--device") -> None:
    """Refuse a ``device`` that is not a torch device or that this machine lacks (``"cuda"`` without CUDA, a CUDA
    index past the last device, MPS without MPS), before anything is loaded onto it; None passes.

    Raises:
        UnavailableError: the message names ``what`` (the option or argument) and the fix.
    """
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise UnavailableError(f"{what} {device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'.") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UnavailableError(f"{what} {device}: CUDA is not available here; use --device cpu (device='cpu').")
        if parsed.index is not None and parsed.index >= count:
            raise UnavailableError(f"{what} {device}: this machine has {count} CUDA device(s) (cuda:0..{count - 1}).")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UnavailableError(f"{what} {device}: MPS is not available here; use --device cpu (device='cpu').")


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


def dictionary_tensors(dictionary: Any) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of a dictionary module by name (thresholds, scales, norms and all)."""
    named = {}
    for method in ("named_parameters", "named_buffers"):
        if callable(getattr(dictionary, method, None)):
            named.update({name: t for name, t in getattr(dictionary, method)() if t is not None})
    return named


def check_dictionary_finite(dictionary: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming the dictionary and the first tensor that holds NaN/inf: first the
    ``tensors`` named, then every other parameter and buffer of ``dictionary`` (e.g. a JumpReLU ``threshold``, an
    FF-KV's ``act_scale`` or ``post_norm_w``)."""
    tensors = {**tensors, **{n: t for n, t in dictionary_tensors(dictionary).items() if n not in tensors}}
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
