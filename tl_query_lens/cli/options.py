"""Command-line options made from config dataclasses: ``n_seqs: int = 32`` becomes ``--n-seqs N`` (default 32), with
the field's ``Attributes:`` entry as help; ``Literal`` fields get choices, ``bool`` a flag (``--no-x`` when on by
default), tuples and lists a comma-separated, repeatable value (``bool | tuple``: a flag with optional items).
:func:`tl_query_lens.cli.configs.build` makes the config back."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from tl_query_lens.config import describe_interval, in_interval

_METAVARS = {int: "N", float: "X", str: "TEXT", Path: "PATH"}


def option(name: str) -> str:
    """``n_seqs`` → ``--n-seqs``."""
    return "--" + name.replace("_", "-")


def field_help(cls: type) -> dict[str, str]:
    """Field → help text, from the ``Attributes:`` sections of ``cls`` and its bases (the nearest class wins)."""
    names = {f.name for f in dataclasses.fields(cls)}
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        parts = re.split(
            r"^Attributes:\s*$", inspect.cleandoc(klass.__dict__.get("__doc__") or ""), 1, flags=re.MULTILINE
        )
        text = (
            " ".join(re.split(r"^\S", parts[-1], maxsplit=1, flags=re.MULTILINE)[0].split()) if len(parts) > 1 else ""
        )
        for entry in re.split(r"(?:^|(?<=[.)]))\s+(?=[\w ,/]+:\s)", text):
            head, _, body = entry.partition(": ")
            keys = [k.strip() for k in re.split(r"[,/]", head)]
            if body and all(k in names for k in keys):
                plain = re.sub(r":\w+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", body.strip())
                plain = plain.replace('``"', "'").replace('"``', "'").replace("``", "'")  # ``"tlql"`` → 'tlql'
                helps.update(dict.fromkeys(keys, plain))  # reST roles and literals as plain text
    return helps


def _unwrap(kind: Any) -> tuple[Any, bool]:
    """``X | None`` → (X, True); anything else → (kind, False)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True  # noqa: UP007
    return kind, False


def _flag_or_list(kind: Any) -> bool:
    """``bool | tuple[str, ...]``: ``--x`` alone means True, ``--x a,b`` the items."""
    return typing.get_origin(kind) in (typing.Union, types.UnionType) and bool in typing.get_args(kind)


def _items(kind: Any) -> Any | None:
    """Item type of ``tuple[T, ...]``, ``tuple[T, T]``, ``list[T]`` or ``bool | tuple[T, ...]``; else None."""
    if typing.get_origin(kind) in (tuple, list):
        return typing.get_args(kind)[0]
    return next(_items(a) for a in typing.get_args(kind) if a is not bool) if _flag_or_list(kind) else None


class _Join(argparse.Action):
    """A comma list given several times: the values are joined (``--x a --x b`` = ``--x a,b``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = getattr(namespace, self.dest)
        joined = isinstance(given, str) and isinstance(values, str) and given is not self.default
        setattr(namespace, self.dest, f"{given},{values}" if joined else values)


def _shown(value: Any) -> str:
    return (",".join(map(str, value)) or "''") if isinstance(value, (tuple, list)) else str(value)


def _default_text(name: str, default: Any, text: str, shown: dict[str, str]) -> str:
    """The help's parenthesis: ``default: <value>``; for ``None`` not the word None: nothing when the field's help
    already says what None means, else ``default: not set``."""
    if shown.get(name):
        return f"default: {shown[name]}"
    if default is not None:
        return f"default: {_shown(default)}"
    return "" if ("None" in text or "default" in text) else "default: not set"


def preset_defaults(presets: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, str]:
    """``shown`` texts for options whose default a preset decides: field → ``"32; --quick: 4"`` from config objects
    (or ``{field: value}`` dicts) keyed by how each preset is chosen (``{"": DemoConfig(), "--quick": ...}``). A field
    every preset leaves at ``None`` is not listed (its help says what ``None`` means)."""

    def value(cfg: Any, name: str) -> Any:
        return cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)

    names = {n for cfg in presets.values() for n in (cfg if isinstance(cfg, dict) else vars(cfg))} - set(skip)
    out = {}
    for name in sorted(names):
        values = {how: value(cfg, name) for how, cfg in presets.items()}
        if all(v is None for v in values.values()):
            continue
        if len({_shown(v) for v in values.values()}) == 1:
            out[name] = _shown(next(iter(values.values())))
        else:
            out[name] = "; ".join(f"{how}: {_shown(v)}" if how else _shown(v) for how, v in values.items())
    return out


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    aliases: dict[str, str] | None = None,
    taken: set[str] | None = None,
    shown: dict[str, str] | None = None,
) -> set[str]:
    """Add an option per field of ``cls`` that is not in ``skip`` nor ``taken`` (added for another config: the
    option then feeds both); ``defaults`` replace the CLI's defaults, ``aliases`` add a second spelling, ``shown``
    is the help's text for a default the command works out after parsing (``"<--out>/parts"`` for ``None``).
    Returns ``taken`` plus the fields added."""
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    defaults, aliases, taken, shown = defaults or {}, aliases or {}, set(taken or ()), shown or {}
    for f in dataclasses.fields(cls):
        kind = _unwrap(hints[f.name])[0]
        if dataclasses.is_dataclass(kind) and f.default_factory is not dataclasses.MISSING and f.name not in skip:
            taken = add_options(
                parser,
                typing.cast(type, kind),
                skip=skip,
                defaults=defaults,
                aliases=aliases,
                taken=taken,
                shown=shown,
            )
            continue  # a nested config (e.g. the engine's): its fields are options of their own
        unsupported = dataclasses.is_dataclass(kind) or dict in (kind, typing.get_origin(kind))
        if f.name in taken or f.name in skip or not f.init or unsupported:
            continue
        taken.add(f.name)
        ranges = getattr(cls, "RANGES", {})
        if f.name in ranges:  # checked by main() right after parsing (no config import needed)
            parser.__dict__.setdefault("tlql_ranges", {})[f.name] = ranges[f.name]
        factory = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        default = defaults.get(f.name, f.default if f.default is not dataclasses.MISSING else factory)
        flags = [option(f.name), *([aliases[f.name]] if f.name in aliases else [])]
        text = helps.get(f.name, f"{cls.__name__}.{f.name}").replace("%", "%%")  # argparse formats help with %
        if kind is bool:
            flag, action = (option("no_" + f.name), "store_false") if default else (flags[0], "store_true")
            off = f" On by default; {flag} turns it off." if default else ""
            parser.add_argument(flag, dest=f.name, action=action, help=text + off)
            continue
        note = _default_text(f.name, default, text, shown)
        spec: dict[str, Any] = {
            "dest": f.name,
            "default": default,
            "help": f"{text} ({note})" if note else text,
        }
        items = _items(kind)
        if items is not None:
            either = _flag_or_list(kind)
            values = typing.get_args(items) if typing.get_origin(items) is Literal else ("A", "B")
            spec.update(nargs="?" if either else None, const=True if either else None, action=_Join)
            listed = (
                spec["help"].replace("(default", "(comma-separated; default") if note else f"{text} (comma-separated)"
            )
            spec.update(metavar=",".join(values), help=listed)
        else:
            choices = list(typing.get_args(kind)) if typing.get_origin(kind) is Literal else None
            spec.update(choices=choices, type=kind if kind in (int, float) else str)
            spec.update(metavar=None if choices else _METAVARS.get(kind, "TEXT"))
        parser.add_argument(*flags, **spec)
    return taken


class _NotGiven:
    """The default of every option made by :func:`add_config_options`: the option was not on the command line."""

    def __repr__(self) -> str:
        return "not given"


NOT_GIVEN: Any = _NotGiven()


def _preset_text(values: dict[str, Any]) -> str:
    """``"32"``, or ``"32; --quick: 4"`` where the presets differ."""
    shown = {how: _shown(v) for how, v in values.items()}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return "; ".join(f"{how}: {text}" if how else text for how, text in shown.items())


def add_config_options(
    parser: argparse.ArgumentParser,
    presets: dict[str, Any],
    *,
    skip: Iterable[str] = (),
    shown: dict[str, str] | None = None,
    taken: set[str] | None = None,
    aliases: dict[str, str] | None = None,
) -> set[str]:
    """An option per field of the config ``presets[""]`` (a nested config's fields too: ``run.model`` is
    ``--model``); ``presets`` maps how a preset is chosen (``""``, ``"--quick"``) to the config it gives, and the help
    shows each preset's default. Every option's parsed default is :data:`NOT_GIVEN`, so :func:`~tl_query_lens.cli.
    configs.build_config` applies exactly the options given on top of the chosen preset. A config class's
    ``RUN_OPTIONS`` (a tuple of field names) limits which fields of its nested ``run`` are options; its ``ALIASES``
    (field → ``"--x"``) add a second spelling of an option, nested fields' included; ``skip`` names fields that get
    no option: a bare name at every level, a dotted path (``"table1.features"``) one nested field. A field's
    ``metadata`` may shape its option: ``positional`` (an optional positional argument), ``nargs`` and ``metavar``
    (argparse's), ``exclusive`` (options sharing this name are mutually exclusive). Returns the option names taken
    (a name taken by an earlier config feeds both fields)."""
    base = presets[""]
    cls = type(base)
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    taken, shown = set(taken or ()), shown or {}
    aliases = {**getattr(cls, "ALIASES", {}), **(aliases or {})}
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        kind = _unwrap(hints[f.name])[0]
        values = {how: getattr(cfg, f.name) for how, cfg in presets.items()}
        if dataclasses.is_dataclass(kind) and f.default_factory is not dataclasses.MISSING:
            run_options = getattr(cls, "RUN_OPTIONS", None) if f.name == "run" else None
            nested_skip = {s for s in skip if "." not in s}
            nested_skip |= {s.split(".", 1)[1] for s in skip if s.startswith(f.name + ".")}
            if run_options:
                nested_skip |= {g.name for g in dataclasses.fields(kind) if g.name not in run_options}
            taken = add_config_options(parser, values, skip=nested_skip, shown=shown, taken=taken, aliases=aliases)
            continue
        if f.name in taken or dataclasses.is_dataclass(kind) or dict in (kind, typing.get_origin(kind)):
            continue
        taken.add(f.name)
        ranges = getattr(cls, "RANGES", {})
        if f.name in ranges:  # a given number is checked by main() right after parsing, before any config is built
            parser.__dict__.setdefault("tlql_ranges", {})[f.name] = ranges[f.name]
        text = helps.get(f.name, f"{cls.__name__}.{f.name}").replace("%", "%%")  # argparse formats help with %
        if _shaped_option(parser, f, text):
            continue
        default = values[""]
        if kind is bool:
            flag, const = (option("no_" + f.name), False) if default else (option(f.name), True)
            differs = len({bool(v) for v in values.values()}) > 1
            note = f" (default: {_preset_text(values)})" if differs else ""
            off = f" On by default; {flag} turns it off." if default else ""
            parser.add_argument(
                flag, dest=f.name, action="store_const", const=const, default=NOT_GIVEN, help=text + off + note
            )
            continue
        if f.name in shown:
            note = f"default: {shown[f.name]}"
        elif all(v is None for v in values.values()):
            note = "" if ("None" in text or "default" in text) else "default: not set"
        else:
            note = f"default: {_preset_text(values)}"
        spec: dict[str, Any] = {"dest": f.name, "default": NOT_GIVEN, "help": f"{text} ({note})" if note else text}
        items = _items(kind)
        if items is not None:
            either = _flag_or_list(kind)
            metavars = typing.get_args(items) if typing.get_origin(items) is Literal else ("A", "B")
            listed = f"{text} (comma-separated; {note})" if note else f"{text} (comma-separated)"
            spec.update(nargs="?" if either else None, const=True if either else None, action=_Join)
            spec.update(metavar=",".join(metavars), help=listed)
        else:
            choices = list(typing.get_args(kind)) if typing.get_origin(kind) is Literal else None
            spec.update(choices=choices, type=kind if kind in (int, float) else str)
            spec.update(metavar=None if choices else _METAVARS.get(kind, "TEXT"))
        parser.add_argument(option(f.name), *([aliases[f.name]] if f.name in aliases else []), **spec)
    return taken


def _shaped_option(parser: argparse.ArgumentParser, f: dataclasses.Field, text: str) -> bool:
    """Add the option of a field whose ``metadata`` shapes it (see :func:`add_config_options`); False if none does."""
    meta = f.metadata
    if meta.get("positional"):
        parser.add_argument(f.name, nargs="?", default=NOT_GIVEN, help=text)
        return True
    if "nargs" not in meta and "exclusive" not in meta:
        return False
    target: Any = parser
    if "exclusive" in meta:
        groups = parser.__dict__.setdefault("tlql_exclusive", {})
        if meta["exclusive"] not in groups:
            groups[meta["exclusive"]] = parser.add_mutually_exclusive_group()
        target = groups[meta["exclusive"]]
    spec = {"nargs": meta["nargs"], "metavar": meta.get("metavar")} if "nargs" in meta else {}
    target.add_argument(option(f.name), dest=f.name, default=NOT_GIVEN, help=text, **spec)
    return True


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first parsed number outside its option's range, as a message naming the option; None when all fit."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = subs[0].choices.get(getattr(args, "command", None) or "") if subs else None
    nested = [a for a in (sub._actions if sub else []) if isinstance(a, argparse._SubParsersAction)]
    if nested and getattr(args, "action", None):
        sub = nested[0].choices.get(args.action)
    for dest, interval in (getattr(sub, "tlql_ranges", None) or {}).items():
        value = getattr(args, dest, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # None (the default), or a list checked by its config
        if not (math.isfinite(value) and in_interval(value, interval)):
            flag = "--" + dest.replace("_", "-")
            return f"{flag} must {describe_interval(interval, value)}, got {value!r}."
    return None
