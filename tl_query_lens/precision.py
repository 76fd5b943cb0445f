"""Whether bf16 matrix products are fast on a device, and what a precision setting of ``"auto"`` resolves to.

A setting is ``"auto"``, ``"float32"`` or ``"bfloat16"`` (``True`` / ``False`` read as bf16 / fp32). ``"auto"`` means
bf16 autocast where :func:`bf16_fast` finds native bf16 units (a CUDA device that supports bf16, a CPU whose flags
list ``amx_bf16`` or ``avx512_bf16``, or an Arm CPU listing ``bf16``) and float32 elsewhere; the environment variable
``TLQL_PRECISION`` (``float32`` or ``bfloat16``) overrides every ``"auto"`` in the process, so fp32 is always one
setting away. Explicit settings are never overridden. docs/benchmarks.md ("bf16 where its measured accuracy holds")
lists the measurements that decide which defaults are ``"auto"``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from typing import Any, Literal

import torch

from tl_query_lens.errors import InputError

logger = logging.getLogger(__name__)

Precision = Literal["auto", "float32", "bfloat16"]
PRECISIONS: tuple[str, ...] = ("auto", "float32", "bfloat16")
#: The environment variable that decides every ``"auto"`` setting of the process.
PRECISION_ENV = "TLQL_PRECISION"
#: CPU flags of native bf16 matrix units: Intel AMX, AVX-512 BF16 (Intel and AMD), Arm's BF16 extension.
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})


@functools.cache
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags of the first CPU listed in ``path`` (x86 ``flags``, Arm ``Features``); empty where the file
    is missing (macOS, Windows): bf16 is then not assumed."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def bf16_fast(device: str | torch.device | None = "cpu") -> bool:
    """Whether ``device`` has native bf16 matrix units (detected, not assumed; the environment is not consulted).

    CUDA: ``torch.cuda.is_bf16_supported`` without emulation. CPU: the flags in :func:`cpu_flags`. Other devices
    (MPS, ...): False.
    """
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(cpu_flags() & BF16_CPU_FLAGS)
    return False


def _override() -> str | None:
    value = os.environ.get(PRECISION_ENV, "").strip().lower()
    if not value or value == "auto":
        return None
    if value not in ("float32", "bfloat16"):
        raise InputError(f"{PRECISION_ENV}={value!r}: set it to 'float32', 'bfloat16' or 'auto' (or unset it).")
    return value


def check_precision(setting: str | bool, name: str = "precision") -> None:
    """Raise :class:`InputError` unless ``setting`` is a precision setting (see the module docstring)."""
    if not isinstance(setting, bool) and setting not in PRECISIONS:
        raise InputError(
            f"{name} must be one of {', '.join(map(repr, PRECISIONS))} (or True / False), not {setting!r}."
        )


def use_bf16(setting: str | bool, device: str | torch.device | None = "cpu") -> bool:
    """Whether a precision ``setting`` means bf16 on ``device``: ``"auto"`` follows ``TLQL_PRECISION`` if set, else
    :func:`bf16_fast`; ``"bfloat16"`` / True and ``"float32"`` / False say it themselves."""
    check_precision(setting)
    if isinstance(setting, bool):
        return setting
    if setting == "auto":
        forced = _override()
        return bf16_fast(device) if forced is None else forced == "bfloat16"
    return setting == "bfloat16"


def model_passes(model: Any, setting: str | bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on the model's device where ``setting`` resolves to bf16 (:func:`use_bf16`), else nothing.

    Under autocast the matrix products run in bf16; weights, norms, softmax and the residual stream stay fp32
    (SAELens' ``autocast_lm``)."""
    device = torch.device(model.cfg.device or "cpu")
    if not use_bf16(setting, device):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
