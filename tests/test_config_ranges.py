"""Every numeric option the command line builds has a range, and its config refuses any value outside it.

The configs are the ones ``tlql`` makes options from (collected by wrapping ``add_options`` while the whole parser is
built, so a config added later is covered without editing this file). For each, Hypothesis draws a numeric field
and a value outside the field's interval (below, above, non-finite, or a fraction where an integer is meant) and
checks that the config refuses it with a ``ValueError`` (``InputError`` is one) whose message names the field.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl_query_lens.config import in_interval, parse_interval


def cli_configs() -> list[type]:
    from tl_query_lens import cli
    from tl_query_lens.cli import options

    seen: dict[type, None] = {}
    original = options.add_options

    def recording(parser, cls, **kwargs):
        seen[cls] = None
        return original(parser, cls, **kwargs)

    for name in cli.SUBCOMMANDS:  # import them first, so their `add_options` can be wrapped
        __import__(f"tl_query_lens.cli.{name}")
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("tl_query_lens.cli") and m is not None]
    patched = [m for m in modules if getattr(m, "add_options", None) is original]
    for module in patched:
        module.add_options = recording
    try:
        cli.build_parser()
    finally:
        for module in patched:
            module.add_options = original
    from tl_query_lens.commands import COMMANDS  # commands on the runner: their configs and the ones they nest

    todo = [command.config_class() for command in COMMANDS]
    while todo:
        cls = todo.pop(0)
        seen[cls] = None
        hints = typing.get_type_hints(cls)
        todo += [hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return list(seen)


CONFIGS = cli_configs()


def numeric_fields(cls: type) -> dict[str, type]:
    """Field → int or float, for fields typed int / float, optionally ``| None`` or in a tuple / list."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        kinds = {hints[f.name]}
        while True:
            inner = {a for k in kinds for a in typing.get_args(k) if a is not type(None) and a is not Ellipsis}
            if not inner:
                break
            kinds = inner
        if kinds in ({int}, {float}) and f.init:
            out[f.name] = next(iter(kinds))
    return out


def test_the_command_line_builds_many_configs():
    names = {c.__name__ for c in CONFIGS}
    assert {"RunConfig", "SAESuiteConfig", "ReadoutFitConfig", "ProtocolCertifyConfig", "Table1Config"} <= names
    assert len(CONFIGS) >= 15


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_numeric_field_has_a_range(cls):
    ranges = getattr(cls, "RANGES", {})
    missing = sorted(set(numeric_fields(cls)) - set(ranges))
    assert not missing, f"{cls.__name__} has numeric fields without a RANGES entry: {missing}"
    for interval in ranges.values():
        parse_interval(interval)  # well-formed
    cls()  # the defaults lie in their ranges


def value_as_field(cls: type, name: str, value):
    """``value`` shaped as field ``name`` takes it (a tuple field gets a tuple of it)."""
    hint = typing.get_type_hints(cls)[name]
    text = str(hint)
    if "tuple[int, int]" in text:
        return (value, value)
    if "tuple" in text or "list" in text:
        return (value,) if "tuple" in text else [value]
    return value


@st.composite
def out_of_range(draw, cls: type):
    fields = numeric_fields(cls)
    name = draw(st.sampled_from(sorted(fields)))
    lo, hi, lo_in, hi_in = parse_interval(cls.RANGES[name])
    integer = fields[name] is int
    choices = []
    if math.isfinite(lo):
        below = lo - 1 if (integer and lo_in) else lo
        choices.append(
            st.integers(max_value=int(below), min_value=int(below) - 10**9)
            if integer
            else st.floats(max_value=lo, min_value=lo - 1e9, exclude_max=lo_in)
        )
    if math.isfinite(hi):
        above = hi + 1 if (integer and hi_in) else hi
        choices.append(
            st.integers(min_value=int(above), max_value=int(above) + 10**9)
            if integer
            else st.floats(min_value=hi, max_value=hi + 1e9, exclude_min=hi_in)
        )
    choices.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    if integer:
        choices.append(st.floats(min_value=0.5, max_value=1e6).filter(lambda x: x != int(x)))
        choices.append(st.just(True))  # a bool is not a number of items
    value = draw(st.one_of(choices))
    if not integer and isinstance(value, float) and math.isfinite(value):
        assert not in_interval(value, cls.RANGES[name])  # the strategy really draws outside the range
    return name, value


@pytest.mark.parametrize("cls", [c for c in CONFIGS if numeric_fields(c)], ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_value_outside_its_range_is_refused(cls, data):
    name, value = data.draw(out_of_range(cls))
    with pytest.raises(ValueError) as caught:
        cls(**{name: value_as_field(cls, name, value)})
    message = str(caught.value)
    assert name in message, message
