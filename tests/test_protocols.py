"""One protocol pattern: ``protocol=`` dispatches to ``<method>/protocols/<name>.py``; the names are the same for
every method ("tlql" = this project's, "paper" = the authors'), and each file states its departures at the top."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from tl_query_lens.certify.config import ProtocolCertifyConfig
from tl_query_lens.errors import InputError
from tl_query_lens.protocols import FORMER_NAMES, NAMES, resolve_protocol
from tl_query_lens.query_lens.config import EvaluationConfig
from tl_query_lens.readout import protocols as readout_protocols
from tl_query_lens.readout.config import CrossLensConfig

METHODS = ("query_lens", "readout", "certify")


@pytest.mark.parametrize("method", METHODS)
def test_each_method_has_both_protocol_files_with_their_departures(method):
    package = importlib.import_module(f"tl_query_lens.{method}.protocols")
    assert set(package.PROTOCOLS) == set(NAMES)
    for name, module in package.PROTOCOLS.items():
        assert module.__name__ == f"tl_query_lens.{method}.protocols.{name}"
        other = "tlql" if name == "paper" else "paper"
        head = module.__doc__.split("\n\n")[0] + module.__doc__.split("\n\n")[1]
        assert "depart" in head and f"protocols/{other}.py" in head, f"{module.__name__}: list the departures first"
    shared = set.intersection(*(set(dir(m)) - set(dir(object)) for m in package.PROTOCOLS.values()))
    entry = {"query_lens": "steering", "readout": "diagnostics", "certify": "evaluation_windows"}[method]
    assert entry in shared  # both protocols answer the same call


@pytest.mark.parametrize("config", [EvaluationConfig, ProtocolCertifyConfig, CrossLensConfig])
def test_configs_take_the_shared_names_and_the_former_ones(config):
    for name in NAMES:
        assert config(protocol=name).protocol == name
    for former in FORMER_NAMES:
        assert config(protocol=former).protocol == "tlql"
    with pytest.raises(InputError, match="protocol must be one of"):
        config(protocol="authors")
    default = next(f.default for f in dataclasses.fields(config) if f.name == "protocol")
    assert default in NAMES


def test_resolve_protocol():
    assert resolve_protocol("paper") == "paper" and resolve_protocol("mixed-layers") == "tlql"
    with pytest.raises(InputError, match="'tlql'"):
        resolve_protocol("own")


def test_readout_diagnostics_dispatches_by_name(monkeypatch):
    calls = []
    for name, module in readout_protocols.PROTOCOLS.items():
        monkeypatch.setattr(module, "diagnostics", lambda *a, name=name, **kw: calls.append((name, a, kw)) or name)
    assert readout_protocols.readout_diagnostics("m", "s", "b", protocol="paper", max_states=4) == "paper"
    assert readout_protocols.readout_diagnostics("m", "s", "b") == "tlql"
    assert readout_protocols.readout_diagnostics("m", "s", "b", protocol="mixed-layers") == "tlql"
    assert calls[0] == ("paper", ("m", "s", "b"), {"cfg": None, "max_states": 4})
