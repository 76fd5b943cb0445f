"""The one configuration convention: a validated ``@dataclass`` per method, overridable by keywords.

Every API function takes ``cfg: XConfig | None = None, **overrides``; :func:`resolve_config` builds the config
(defaults, then ``cfg``, then keyword overrides) and names the valid options when a keyword is unknown.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

C = TypeVar("C")


def resolve_config(cls: type[C], cfg: C | None = None, overrides: dict[str, Any] | None = None) -> C:
    """``cls()`` (or ``cfg``) with ``overrides`` replacing single fields; validation runs in ``__post_init__``."""
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown} for {cls.__name__}; valid options: {sorted(names)}.")
    if cfg is None:
        return cls(**overrides)
    if not isinstance(cfg, cls):
        raise TypeError(f"cfg must be a {cls.__name__}, got {type(cfg).__name__}.")
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
