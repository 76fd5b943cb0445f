"""What the checks before a model loads need of a model, and the check of option values against it.

The embedded model's dimensions are known without loading it (:func:`tl_query_lens.checks.check_model_name`); other
models are checked again once loaded (:func:`dims_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tl_query_lens.errors import InputError


@dataclass(frozen=True)
class ModelDims:
    """What the checks need of a model: blocks, MLP width (an FF-KV dictionary's), vocabulary, context."""

    n_layers: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    d_model: int = 0


def dims_of(model: Any) -> ModelDims:
    """The :class:`ModelDims` of a loaded model (for the same checks after loading a model not known before)."""
    cfg = model.cfg
    return ModelDims(int(cfg.n_layers), int(cfg.d_mlp or 0), int(cfg.d_vocab), int(cfg.n_ctx), int(cfg.d_model))


_DIM_NAMES = {
    "n_layers": "layers",
    "d_mlp": "MLP neurons (the FF-KV width)",
    "d_vocab": "vocabulary tokens",
    "n_ctx": "context positions",
    "d_model": "residual dimensions",
}


def check_limits(dims: ModelDims | None, limits: dict[str, tuple[Any, str]], model: str = "the model") -> None:
    """Refuse option values above a size of the model: ``{"--k": (k, "d_mlp")}`` needs ``k <= d_mlp`` (``"<n_layers"``
    for ids: ``< n_layers``). Nothing is checked while ``dims`` is None (a model not loaded yet and not embedded);
    values None pass. The message names the option, the model's size and what it counts."""
    if dims is None:
        return
    for option, (value, dim) in limits.items():
        strict = dim.startswith("<")
        name = dim.lstrip("<")
        size = getattr(dims, name)
        values = value if isinstance(value, (tuple, list)) else [value]
        for item in values:
            if item is None or not size:
                continue
            if item > size or (strict and item >= size):
                bound = f"< {size}" if strict else f"≤ {size}"
                raise InputError(
                    f"{option} {item} is too large for {model}: it has {size} {_DIM_NAMES[name]}, so {option} must "
                    f"be {bound}."
                )
