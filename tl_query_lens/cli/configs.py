"""Configs from parsed options: :func:`build` makes a config dataclass from the options that
:func:`~tl_query_lens.cli.options.add_options` added for it; the config's ``__post_init__`` validates, and its errors
reach the user as one line that names the options."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tl_query_lens.cli.options import _items, _unwrap, option


def build(
    cls: type,
    args: argparse.Namespace,
    *,
    exclude: Iterable[str] = (),
    factory: Callable[..., Any] | None = None,
    **values: Any,
) -> Any:
    """``cls`` from the parsed options that name its fields and ``values`` (which win), made by
    ``factory`` (default ``cls``; e.g. a preset) from those keywords.

    Raises:
        InputError: a list item that is not a number, or any error of the config's validation (``ValueError`` and
            ``TypeError`` too), with field names written as options (``n_seqs must …`` → ``--n-seqs must …``).
    """
    from tl_query_lens.errors import InputError  # imports torch: only once a command runs

    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        nested = _unwrap(hints[f.name])[0]
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif (
            dataclasses.is_dataclass(nested) and f.default_factory is not dataclasses.MISSING and f.name not in exclude
        ):
            names = {g.name for g in dataclasses.fields(nested)}  # a nested config, from its own options
            kwargs[f.name] = build(
                typing.cast(type, nested), args, exclude=exclude, **{k: v for k, v in values.items() if k in names}
            )
        elif (
            f.init
            and f.name not in exclude
            and hasattr(args, f.name)
            and not dataclasses.is_dataclass(_unwrap(hints[f.name])[0])
        ):
            kwargs[f.name] = convert(getattr(args, f.name), hints[f.name], f.name)
    try:
        return (factory or cls)(**kwargs)
    except InputError as err:
        raise type(err)(as_options(str(err), kwargs)) from err
    except (ValueError, TypeError) as err:
        raise InputError(as_options(str(err), kwargs)) from err


def convert(value: Any, kind: Any, name: str) -> Any:
    """A parsed option as the field's type: comma lists split (numbers converted), paths as :class:`Path`."""
    from tl_query_lens.errors import InputError
    from tl_query_lens.ranges import parse_ranges

    kind = _unwrap(kind)[0]
    items = _items(kind)
    if value is None or isinstance(value, (bool, tuple, list)):
        return value
    if items is None:
        return Path(value) if kind is Path else value
    parts: list[str | float] = [p.strip() for p in str(value).split(",") if p.strip()]
    if items is int:  # ids and ranges: '3,5', '0-9,15'
        return (
            tuple(parse_ranges(str(value), None, option(name)))
            if typing.get_origin(kind) is tuple
            else list(parse_ranges(str(value), None, option(name)))
        )
    if items is float:
        for part in parts:
            try:
                items(part)
            except ValueError:
                raise InputError(
                    f"{option(name)} {value!r}: {part!r} is not a number; write e.g. '0.25,0.5'."
                ) from None
        parts = [items(p) for p in parts]
    return list(parts) if typing.get_origin(kind) is list else tuple(parts)


def as_options(message: str, names: Iterable[str]) -> str:
    """Field names written as options: one that starts the message, and any with an underscore (not in
    ``name=value`` nor ``Config.name``)."""
    names = sorted(names, key=len, reverse=True)
    first = next((n for n in names if re.match(rf"{re.escape(n)}\b(?!\s*=)", message)), None)
    if first:
        message = option(first) + message[len(first) :]
    pattern = "|".join(re.escape(n) for n in names if "_" in n)
    if not pattern:
        return message
    return re.sub(rf"(?<![\w.-])({pattern})\b(?!\s*=)", lambda m: option(m[1]), message)


def build_config(base: Any, args: argparse.Namespace, fixed: Iterable[str] = ()) -> Any:
    """``base`` (a config, e.g. a command's preset) with every option given on the command line applied, nested
    configs included (options made by :func:`~tl_query_lens.cli.options.add_config_options`; not given:
    :data:`~tl_query_lens.cli.options.NOT_GIVEN`), except to the ``fixed`` fields (a bare name at every level, a
    dotted path one nested field: those the command sets itself). The configs validate themselves as they are
    rebuilt.

    Raises:
        InputError: as :func:`build`, with field names written as options.
    """
    from tl_query_lens.cli.options import NOT_GIVEN
    from tl_query_lens.errors import InputError

    fixed = set(fixed)

    def apply(cfg: Any, prefix: str = "") -> Any:
        hints = typing.get_type_hints(type(cfg))
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if f.name in fixed or prefix + f.name in fixed:
                continue
            if dataclasses.is_dataclass(value) and f.default_factory is not dataclasses.MISSING:
                rebuilt = apply(value, f"{prefix}{f.name}.")
                if rebuilt is not value:
                    changes[f.name] = rebuilt
            elif f.init and getattr(args, f.name, NOT_GIVEN) is not NOT_GIVEN:
                changes[f.name] = convert(getattr(args, f.name), hints[f.name], f.name)
        if not changes:
            return cfg
        try:
            return dataclasses.replace(cfg, **changes)
        except InputError as err:
            raise type(err)(as_options(str(err), changes)) from err
        except (ValueError, TypeError) as err:
            raise InputError(as_options(str(err), changes)) from err

    return apply(base)
