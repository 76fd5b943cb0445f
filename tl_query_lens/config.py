"""The one configuration convention: a validated ``@dataclass`` per method, overridable by keywords.

Every API function takes ``cfg: XConfig | None = None, **overrides``; :func:`resolve_config` builds the config
(defaults, then ``cfg``, then keyword overrides) and names the valid options when a keyword is unknown. A config may
nest another (``Table1Config.engine`` is an :class:`~tl_query_lens.operators.config.EngineConfig`): a keyword that
names a field of the nested config (``chunk=16``) replaces that field of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from tl_query_lens.errors import InputError, InputTypeError

C = TypeVar("C")


def nested_configs(cls: type) -> dict[str, type]:
    """Field name → config class of the fields of ``cls`` that hold a nested config (a dataclass default factory)."""
    return {
        f.name: f.default_factory  # type: ignore[misc]
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)
    }


def resolve_config(cls: type[C], cfg: C | None = None, overrides: dict[str, Any] | None = None) -> C:
    """``cls()`` (or ``cfg``) with ``overrides`` replacing single fields, nested configs' fields included.

    Raises:
        InputError: an unknown option (``InputTypeError``, also a ``TypeError``), a ``cfg`` of another class, or a
            value the config's validation (``__post_init__``) refuses.
    """
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    nested = nested_configs(cls)
    inner: dict[str, dict[str, Any]] = {}
    for key in [k for k in overrides if k not in names]:
        owners = [n for n, sub in nested.items() if key in {f.name for f in dataclasses.fields(sub)}]
        if len(owners) == 1:
            inner.setdefault(owners[0], {})[key] = overrides.pop(key)
    unknown = sorted(set(overrides) - names)
    if unknown:
        valid = sorted(names | {f.name for sub in nested.values() for f in dataclasses.fields(sub)})
        raise InputTypeError(f"Unknown option(s) {unknown} for {cls.__name__}; valid options: {valid}.")
    if cfg is not None and not isinstance(cfg, cls):
        raise InputTypeError(f"cfg must be a {cls.__name__}, got {type(cfg).__name__}.")
    for name, values in inner.items():
        current = overrides.get(name, getattr(cfg, name) if cfg is not None else None)
        overrides[name] = resolve_config(nested[name], current, values)
    try:
        if cfg is None:
            return cls(**overrides)
        return dataclasses.replace(cfg, **overrides) if overrides else cfg  # type: ignore[type-var]
    except InputError:
        raise
    except TypeError as err:
        raise InputTypeError(str(err)) from err
    except ValueError as err:
        raise InputError(str(err)) from err
