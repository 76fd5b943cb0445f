"""How the operator engine sweeps: one config shared by the engine, :class:`~tl_query_lens.QueryLens` and every method
that computes operators (docs/design.md §4; docs/architecture.md, "Configs"). It imports no torch: the command line
builds it before torch loads, and the engine resolves ``sweep_dtype`` to a ``torch.dtype`` where it sweeps."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tl_query_lens.config import check_ranges
from tl_query_lens.errors import InputError

#: Dtypes a sweep may run in (``EngineConfig.sweep_dtype``), by their torch names.
SWEEP_DTYPES: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")


@dataclass
class EngineConfig:
    """Options of the transition-operator engine (:mod:`tl_query_lens.operators.engine`).

    The operators themselves depend only on the model, the corpus and ``skip_positions``; the other options decide how
    they are computed (memory, time, precision) and where they are kept.

    Attributes:
        skip_positions: leading positions of each sequence left out of the valid tokens T the operators average over.
        chunk: tangents / cotangents per batched pass (memory grows with chunk x batch x positions x width).
        batch_size: sequences per forward pass of a sweep.
        cache_dir: folder where operators are kept, reused and resumed (matched by model, hooks, corpus, dtype and
            skip); None keeps them in memory only.
        progress: show a progress bar per sweep.
        max_memory_gb: choose chunk from this working-memory budget in GiB (None: use chunk as given).
        sweep_dtype: run the sweeps on a copy of the model in this dtype, e.g. 'bfloat16' (operators still accumulate
            in float32); None: the model's own dtype; 'auto': bf16 autocast where the device has bf16 units
            (:mod:`tl_query_lens.precision`; ``TLQL_PRECISION=float32`` forces fp32), else the model's dtype
            (sweep_autocast is then not read). Given as a name or a torch.dtype; kept as its name.
        sweep_autocast: with sweep_dtype, run the sweeps under torch.autocast on the model itself instead of a copy
            (matrix products in sweep_dtype, norms and the residual stream in the model's dtype).
    """

    skip_positions: int = 0
    chunk: int = 64
    batch_size: int = 8
    cache_dir: str | Path | None = None
    progress: bool = True
    max_memory_gb: float | None = None
    sweep_dtype: str | None = None
    sweep_autocast: bool = False

    RANGES: ClassVar[dict[str, str]] = {
        "skip_positions": "[0, inf)",
        "chunk": "[1, inf)",
        "batch_size": "[1, inf)",
        "max_memory_gb": "(0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.sweep_dtype is not None and not isinstance(self.sweep_dtype, str):  # a torch.dtype: kept as its name
            self.sweep_dtype = str(self.sweep_dtype).replace("torch.", "")
        if self.sweep_dtype is not None and self.sweep_dtype != "auto" and self.sweep_dtype not in SWEEP_DTYPES:
            raise InputError(
                f"sweep_dtype must be one of {[f'torch.{d}' for d in SWEEP_DTYPES]} (or its name), 'auto' or None, "
                f"not {self.sweep_dtype!r}."
            )
        if self.skip_positions < 0:
            raise InputError(f"skip_positions must be >= 0, got {self.skip_positions}.")
        if self.chunk < 1 or self.batch_size < 1:
            raise InputError(f"chunk and batch_size must be ≥ 1 (got {self.chunk}, {self.batch_size}).")
        if self.max_memory_gb is not None and self.max_memory_gb <= 0:
            raise InputError(f"max_memory_gb must be > 0, got {self.max_memory_gb}.")
        if self.sweep_autocast and self.sweep_dtype is None:
            raise InputError("sweep_autocast=True needs a sweep_dtype other than the model's, e.g. torch.bfloat16.")


def fold_flat_engine_options(owner: str, engine: EngineConfig, flat: dict[str, object]) -> EngineConfig:
    """``engine`` with the deprecated flat options of a config (``Table1Config(chunk=16)``, before the engine's options
    moved into ``engine``) folded in, and a ``DeprecationWarning`` that names the new spelling; None means not given."""
    given = {name: value for name, value in flat.items() if value is not None}
    if not given:
        return engine
    spelled = ", ".join(f"{name}={value!r}" for name, value in given.items())
    warnings.warn(
        f"{owner}({spelled}) is deprecated: the engine's options moved to {owner}(engine=EngineConfig({spelled})); "
        "keyword overrides of the methods (evaluate_table1(..., chunk=16)) reach them as before.",
        DeprecationWarning,
        stacklevel=4,
    )
    return dataclasses.replace(engine, **given)  # type: ignore[arg-type]
