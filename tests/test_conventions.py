"""One configuration convention (docs/architecture.md, "Configs"): every public method of the package takes its
settings as ``cfg: XConfig | None = None, **overrides`` (the engine's as ``engine: EngineConfig | None``), builds them
with :func:`~tl_query_lens.config.resolve_config` before any other work, and refuses a bad option with an
``InputError``. The methods are found by walking the package, so a new one is checked without being listed here."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

import pytest
import torch

import tl_query_lens
from tl_query_lens.cli.options import field_help
from tl_query_lens.config import resolve_config
from tl_query_lens.errors import InputError
from tl_query_lens.operators import EngineConfig
from tl_query_lens.query_lens.config import QueryLensConfig, Table1Config

SKIPPED_PACKAGES = ("tl_query_lens.cli", "tl_query_lens.__main__")  # the CLI builds configs from options


def _modules():
    for info in pkgutil.walk_packages(tl_query_lens.__path__, "tl_query_lens."):
        if not info.name.startswith(SKIPPED_PACKAGES):
            yield importlib.import_module(info.name)


def _config_parameter(fn) -> str | None:
    params = inspect.signature(fn).parameters
    takes_overrides = any(p.kind is p.VAR_KEYWORD for p in params.values())
    name = next((n for n in ("cfg", "engine") if n in params), None)
    return name if name and takes_overrides else None


def public_methods() -> dict[str, typing.Callable]:
    """``module.name`` → every public function or class (its constructor) that takes a config and overrides."""
    found = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) or (inspect.isclass(obj) and not dataclasses.is_dataclass(obj)):
                try:
                    if _config_parameter(obj.__init__ if inspect.isclass(obj) else obj):
                        found[f"{module.__name__}.{name}"] = obj
                except (TypeError, ValueError):  # no signature (builtins)
                    continue
    return found


METHODS = public_methods()
# Names that must be found: the walk itself is checked, so the test cannot pass by finding nothing.
EXPECTED = {
    "tl_query_lens.operators.engine.value_operators",
    "tl_query_lens.operators.engine.key_operators",
    "tl_query_lens.operators.engine.module_operators",
    "tl_query_lens.query_lens.lens.QueryLens",
    "tl_query_lens.query_lens.table1.evaluate_table1",
    "tl_query_lens.query_lens.channels.subspace_channels",
    "tl_query_lens.certify.certify.certify",
    "tl_query_lens.dictionaries.compare.compare_dictionaries",
    "tl_query_lens.saes.train.train_saes",
    "tl_query_lens.readout.fit.fit_readout",
    "tl_query_lens.demo.run_demo",
}


def test_the_walk_finds_the_public_methods():
    assert EXPECTED <= set(METHODS), sorted(EXPECTED - set(METHODS))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_config_argument_is_an_optional_config_dataclass(name):
    fn = METHODS[name]
    fn = fn.__init__ if inspect.isclass(fn) else fn
    param = _config_parameter(fn)
    assert param is not None
    annotation = typing.get_type_hints(fn)[param]
    classes = [a for a in typing.get_args(annotation) if a is not type(None)]
    if classes:  # a dispatcher (the protocol's own config) annotates Any
        assert len(classes) == 1 and dataclasses.is_dataclass(classes[0]), annotation
        assert type(None) in typing.get_args(annotation), f"{param} must default to None"
    assert inspect.signature(fn).parameters[param].default is None


@pytest.mark.parametrize("name", sorted(METHODS))
def test_an_unknown_option_is_an_input_error_before_any_work(name):
    """Every other argument is a placeholder that fails if touched: the options are checked first."""
    fn = METHODS[name]
    signature = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
    required = [p for p in signature.parameters.values() if p.name != "self" and p.default is p.empty]
    positional = [p for p in required if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {p.name: object() for p in required if p.kind is p.KEYWORD_ONLY}
    with pytest.raises(InputError, match="not_an_option"):
        fn(*[object()] * len(positional), **keywords, not_an_option=1)


def _configs() -> set[type]:
    """Every config class the methods take, nested ones included."""
    todo, seen = [], set()
    for fn in METHODS.values():
        fn = fn.__init__ if inspect.isclass(fn) else fn
        annotation = typing.get_type_hints(fn)[_config_parameter(fn)]
        todo += [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo += [f.default_factory for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default_factory)]
    return seen


def test_every_config_field_has_a_docstring_entry():
    configs = _configs()
    assert {EngineConfig, QueryLensConfig, Table1Config} <= configs
    missing = {
        cls.__name__: sorted({f.name for f in dataclasses.fields(cls)} - set(field_help(cls))) for cls in configs
    }
    assert {name: fields for name, fields in missing.items() if fields} == {}


@pytest.mark.parametrize(
    "cls,bad",
    [
        (EngineConfig, {"chunk": 0}),
        (EngineConfig, {"sweep_dtype": torch.int32}),
        (EngineConfig, {"sweep_autocast": True}),
        (QueryLensConfig, {"basis": "diagonal"}),
        (QueryLensConfig, {"batch_size": 0}),  # a field of the nested engine config
        (Table1Config, {"k": 0}),
    ],
)
def test_a_bad_value_is_an_input_error(cls, bad):
    with pytest.raises(InputError, match=next(iter(bad))):
        resolve_config(cls, None, bad)


def test_keywords_reach_the_nested_engine_config():
    """Reference: the config written out by hand."""
    cfg = resolve_config(Table1Config, None, {"k": 5, "chunk": 16, "sweep_dtype": torch.bfloat16})
    assert cfg == Table1Config(k=5, engine=EngineConfig(chunk=16, sweep_dtype="bfloat16"))
    given = Table1Config(engine=EngineConfig(cache_dir="ops"))
    assert resolve_config(Table1Config, given, {"chunk": 8}).engine == EngineConfig(cache_dir="ops", chunk=8)
    assert given.engine.chunk == 64  # the given config is not changed
    engine = EngineConfig(chunk=4)
    assert resolve_config(QueryLensConfig, None, {"engine": engine, "progress": False}).engine == EngineConfig(
        chunk=4, progress=False
    )


def test_the_flat_engine_options_of_a_config_still_work_with_a_deprecation_warning():
    """The spelling before EngineConfig: ``Table1Config(chunk=16)`` is ``Table1Config(engine=EngineConfig(chunk=16))``."""
    from tl_query_lens.query_lens.config import SubspaceChannelsConfig

    with pytest.warns(DeprecationWarning, match=r"engine=EngineConfig\(chunk=16, cache_dir='ops'\)"):
        old = Table1Config(chunk=16, cache_dir="ops")
    assert old == Table1Config(engine=EngineConfig(chunk=16, cache_dir="ops"))
    with pytest.warns(DeprecationWarning, match="SubspaceChannelsConfig"):
        channels = SubspaceChannelsConfig(skip_positions=1)
    assert channels.engine == EngineConfig(skip_positions=1)
