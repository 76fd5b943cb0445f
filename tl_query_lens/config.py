"""The one configuration convention: a validated ``@dataclass`` per method, overridable by keywords.

Every API function takes ``cfg: XConfig | None = None, **overrides``; :func:`resolve_config` builds the config
(defaults, then ``cfg``, then keyword overrides) and names the valid options when a keyword is unknown. A config may
nest another (``Table1Config.engine`` is an :class:`~tl_query_lens.operators.config.EngineConfig`): a keyword that
names a field of the nested config (``chunk=16``) replaces that field of it.

Every numeric field has a range, written in interval notation in the class's ``RANGES`` (``{"k": "[1, inf)",
"lr": "(0, inf)", "train_frac": "(0, 1)"}``); ``__post_init__`` calls :func:`check_ranges`, which refuses a value
outside its range (and a bool or a non-finite float) with an :class:`~tl_query_lens.errors.InputError` naming the
field, the value and the range. ``None`` passes (it means "the default" wherever a field allows it); tuples and lists
of numbers are checked item by item. ``tests/test_config_ranges.py`` checks that every numeric field of every config
the command line builds has a range and that values outside it are refused. Cross-field rules (``k <= d_sae``) stay
in ``__post_init__``. This module imports nothing heavy: configs are built before torch is loaded.

:class:`RunConfig` holds what every ``tlql`` analysis shares and no method's config holds: the model, corpus, sizes,
output and W&B.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Literal, TypeVar

from tl_query_lens.errors import InputError, InputTypeError

C = TypeVar("C")

#: The splits of a corpus (:func:`~tl_query_lens.corpus.load_corpus`): disjoint by a hash of each document.
Split = Literal["train", "calibration", "evaluation"]


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


_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")


@cache
def parse_interval(text: str) -> tuple[float, float, bool, bool]:
    """``"[1, inf)"`` → ``(1.0, inf, True, False)``: lower, upper, whether each end is included."""
    match = _INTERVAL.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an interval such as '[1, inf)' or '(0, 1]'.")
    lo, hi = float(match[2]), float(match[3])
    return lo, hi, match[1] == "[", match[4] == "]"


def in_interval(value: float, text: str) -> bool:
    """Whether the finite number ``value`` lies in the interval ``text``."""
    lo, hi, lo_in, hi_in = parse_interval(text)
    return (lo < value or (lo_in and value == lo)) and (value < hi or (hi_in and value == hi))


def check_first_positions(exclude_first_positions: int, seq_len: int) -> None:
    """Refuse an ``exclude_first_positions`` that leaves no scored next-token prediction in a ``seq_len``-token window.

    Positions ``< exclude_first_positions`` keep the clean activation and are not scored (SAEBench's
    ``exclude_special_tokens_from_reconstruction``, applied by position because the windows start mid-text); the
    prediction from position t is scored for t ≥ ``exclude_first_positions``, and the last position has no next token.
    """
    if not 0 <= exclude_first_positions < seq_len - 1:
        raise InputError(
            f"exclude_first_positions={exclude_first_positions} leaves no position of the {seq_len}-token windows to "
            f"score (it must be below seq_len − 1 = {seq_len - 1}); use 0, or 1 to keep an attention-sink position 0 "
            "clean, or longer windows."
        )


def check_ranges(cfg: Any, ranges: dict[str, str] | None = None) -> None:
    """Refuse any field of ``cfg`` outside its interval in ``ranges`` (default ``type(cfg).RANGES``).

    Raises:
        InputError: ``<field> must be in <interval>, got <value>`` (the command line writes the field as its option),
            also for booleans and non-finite floats where a number is expected.
    """
    integral = _integer_fields(type(cfg))  # type: ignore[arg-type]  # classes are hashable
    for name, interval in (type(cfg).RANGES if ranges is None else ranges).items():
        value = getattr(cfg, name)
        if value is None:
            continue
        items = value if isinstance(value, (tuple, list)) else [value]
        for item in items:
            if name in integral and not (isinstance(item, numbers.Integral) and not isinstance(item, bool)):
                raise InputError(f"{name} must be an integer, got {value!r}; round it deliberately.")
            good = (
                isinstance(item, numbers.Real)
                and not isinstance(item, bool)
                and math.isfinite(item)
                and in_interval(float(item), interval)
            )
            if not good:
                shown = f" (item {item!r})" if items is value else ""
                raise InputError(f"{name} must {describe_interval(interval, item)}, got {value!r}{shown}.")


@cache
def _integer_fields(cls: type) -> frozenset[str]:
    """Fields of ``cls`` typed ``int``, ``int | None`` or a tuple / list of ints."""
    names = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kinds = {hints[f.name]}
        while True:  # unwrap X | None, tuple[X, ...], list[X]
            inner = {a for k in kinds for a in typing.get_args(k) if a is not type(None) and a is not Ellipsis}
            if not inner:
                break
            kinds = inner
        if kinds == {int}:
            names.add(f.name)
    return frozenset(names)


def _number(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


def describe_interval(text: str, value: Any = None) -> str:
    """What a value must do to lie in ``text``, after "must": ``"[1, inf)"`` → ``"be ≥ 1"``; ``"(0, 1)"`` → ``"lie
    strictly between 0 and 1"``; with ``value``, the bound it breaks (``"be ≤ 4096 (range [1, 4096])"``)."""
    lo, hi, lo_in, hi_in = parse_interval(text)
    low = f"{'≥' if lo_in else '>'} {_number(lo)}"
    high = f"{'≤' if hi_in else '<'} {_number(hi)}"
    if math.isinf(lo) and math.isinf(hi):
        return "be a finite number"
    if math.isinf(hi):
        return f"be {low}"
    if math.isinf(lo):
        return f"be {high}"
    if not lo_in and not hi_in:
        return f"lie strictly between {_number(lo)} and {_number(hi)}"
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        value = float(value)
        if not (lo < value or (lo_in and value == lo)):
            return f"be {low} (range {text})"
        return f"be {high} (range {text})"
    return f"be in {text}"


@dataclass
class RunConfig:
    """Options of a ``tlql`` run that are not a method's own.

    Attributes:
        model: the embedded model ('smollm2-135m', offline) or a TransformerLens model name.
        corpus: 'embedded', 'stdlib', 'broad' (installed by scripts/setup.sh --broad-corpus), a .txt/.jsonl file or folder of documents, or a Hugging Face dataset name.
        device: torch device of the model, e.g. 'cpu', 'cuda', 'cuda:1' (None: TransformerLens' choice).
        seed: seed of the corpus windows drawn (and of the method, where it has one).
        n_seqs: sequences (windows) drawn from the corpus.
        seq_len: tokens per sequence.
        layers: layers analysed, e.g. '3,5', '0-29' or 'all'.
        features: feature ids per dictionary, e.g. '0-99,512' or 'all'.
        dictionary: dictionaries, comma-separated and repeatable: 'ffkv' (the MLP at each of --layers as an FF-KV
            dictionary), 'ffkv:<layer>[:vanilla|topk|normalized[:<k>]]', folders of SAEs saved with save_model or
            the SAELens runner, SAELens '<release>:<sae_id>' (e.g. 'tlql-saes-smollm2-135m:blocks.12.hook_resid_post')
            or '<hf-org>/<repo>:<sae_id>'; all share one model.
        out: results folder (created; results are written there before anything is logged).
        wandb: log the run to Weights & Biases (offline unless WANDB_MODE says otherwise); results are written to disk
            either way.
        wandb_project: W&B project name.
    """

    model: str = "smollm2-135m"
    corpus: str = "embedded"
    device: str | None = None
    seed: int = 0
    n_seqs: int = 32
    seq_len: int = 64
    layers: str = "all"
    features: str | None = None
    dictionary: tuple[str, ...] = ("ffkv",)
    out: str = "results"
    wandb: bool = True
    wandb_project: str = "tl_query_lens"

    RANGES: ClassVar[dict[str, str]] = {"seed": "[0, 4294967295]", "n_seqs": "[1, 10000000]", "seq_len": "[1, 1048576]"}

    def __post_init__(self) -> None:
        check_ranges(self)
