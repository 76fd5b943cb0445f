"""Every result class saves and loads itself: built from its own field annotations, NaN and ±inf included."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
import torch

from tl_query_lens.atlas.build import AtlasResult, DictionaryQuality
from tl_query_lens.certify.certify import Certificate
from tl_query_lens.certify.commands import PaperCertificates
from tl_query_lens.certify.protocol import ProtocolCertification
from tl_query_lens.certify.sweep import LayerSweep, ShuffleAblation
from tl_query_lens.dictionaries.absorption import AbsorptionResult
from tl_query_lens.dictionaries.compare import DictionaryComparison
from tl_query_lens.dictionaries.faithfulness import FaithfulnessResult
from tl_query_lens.dictionaries.splice import FFKVSummary, SpliceMetrics
from tl_query_lens.documents import DocumentWindows
from tl_query_lens.query_lens.channels import ChannelAnalysis
from tl_query_lens.query_lens.channels_commands import ChannelsRun
from tl_query_lens.query_lens.commands import QueryLensRun, Table1Run
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.max_activating import MaxActivations
from tl_query_lens.query_lens.result import Signatures
from tl_query_lens.readout.commands import ReadoutDecomposition, ReadoutEvalRun, ReadoutFitRun
from tl_query_lens.readout.cross_lens import CrossLensResult
from tl_query_lens.readout.cross_lens_paper import CrossLensPromptResult
from tl_query_lens.readout.decompose import Decomposition
from tl_query_lens.readout.diagnostics import AblationRegression, ReadoutEval
from tl_query_lens.readout.diagnostics_paper import PaperReadoutDiagnostics
from tl_query_lens.readout.evaluate import ReadoutReport
from tl_query_lens.readout.fit import ReadoutFit
from tl_query_lens.readout.sae import ReadoutSAE, ReadoutSAEConfig
from tl_query_lens.readout.states import StateBank
from tl_query_lens.reproduce.run import Reproduction
from tl_query_lens.results import SavableResult, read_json, write_json
from tl_query_lens.saes.release import ReleaseFidelity
from tl_query_lens.saes.report import SuiteQuality
from tl_query_lens.saes.train import SAESuiteResult

RESULT_CLASSES = [
    Signatures,
    MaxActivations,
    SignatureEvaluation,
    ChannelAnalysis,
    SpliceMetrics,
    FFKVSummary,
    Certificate,
    LayerSweep,
    ShuffleAblation,
    ReadoutFit,
    ReadoutReport,
    ReadoutEval,
    AblationRegression,
    Decomposition,
    CrossLensResult,
    StateBank,
    DocumentWindows,
    # paper protocols (docs/reproduction.md)
    ProtocolCertification,
    PaperReadoutDiagnostics,
    CrossLensPromptResult,
    # FF-KV paper's comparison and the SAE suite (docs/saes.md)
    DictionaryComparison,
    AbsorptionResult,
    FaithfulnessResult,
    SAESuiteResult,
    SuiteQuality,
    ReleaseFidelity,
    # the atlas and tlql reproduce
    AtlasResult,
    DictionaryQuality,
    Reproduction,
    # what the commands return (tl_query_lens/commands.py)
    PaperCertificates,
    ChannelsRun,
    QueryLensRun,
    Table1Run,
    ReadoutFitRun,
    ReadoutDecomposition,
    ReadoutEvalRun,
]
SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.25]


def _tensor(hint, counter: list[int]) -> torch.Tensor:
    counter[0] += 1
    dtypes = " ".join(getattr(hint, "dtypes", ["float32"]))
    if "bool" in dtypes:
        return torch.tensor([[True, False], [counter[0] % 2 == 0, True]])
    if "int" in dtypes and "float" not in dtypes:
        return torch.tensor([[3, -1], [0, counter[0]]])
    return torch.tensor([[float("nan"), float("inf")], [-float("inf"), 1.5 + counter[0]]])


def build(hint, counter: list[int]):
    """A value of type ``hint`` with every float special (NaN, inf, −inf in turn)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return build(next(a for a in args if a is not type(None)), counter)
    if getattr(hint, "array_type", None) is torch.Tensor or hint is torch.Tensor:
        return _tensor(hint, counter)
    if isinstance(hint, type) and issubclass(hint, ReadoutSAE):
        sae = ReadoutSAE(ReadoutSAEConfig(d_in=4, d_sae=6, d_vocab=5, k=2, dtype="float32", device="cpu"))
        with torch.no_grad():
            for p in sae.parameters():
                p.normal_()
        return sae
    if isinstance(hint, type) and issubclass(hint, SavableResult):
        return make(hint, counter)
    if dataclasses.is_dataclass(hint) and hasattr(hint, "__post_init__"):
        return hint()  # a validated config: its defaults
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: build(hints[f.name], counter) for f in dataclasses.fields(hint) if f.init})
    if hint is float:
        counter[0] += 1
        return SPECIAL[counter[0] % len(SPECIAL)]
    if hint is bool:
        return True
    if hint is int:
        return 3
    if hint is str:
        return "blocks.1.hook_resid_post"
    if origin is list or hint is list:
        return [build(args[0], counter) for _ in range(3)] if args else [1.0, float("nan")]
    if origin is dict or hint is dict:
        value_type = args[1] if args else float
        if isinstance(value_type, type) and issubclass(value_type, SavableResult):
            return {0: build(value_type, counter), "label b": build(value_type, counter)}
        return {"a": build(value_type, counter), "b": {"nested": float("inf")}}
    if hint is typing.Any or hint is None:
        return {"x": float("nan")}
    raise TypeError(f"no builder for {hint!r}")


def make(cls, counter: list[int] | None = None):
    counter = counter if counter is not None else [0]
    hints = typing.get_type_hints(cls)
    kwargs = {
        f.name: build(hints[f.name], counter) for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")
    }
    return cls(**kwargs)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
            if a.is_floating_point()
            else torch.equal(a, b)
        )
    if isinstance(a, float):
        return isinstance(b, float) and (math.isnan(a) and math.isnan(b) or a == b)
    if isinstance(a, ReadoutSAE):
        sa, sb = a.state_dict(), b.state_dict()
        return type(b) is ReadoutSAE and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("cls", RESULT_CLASSES, ids=lambda c: c.__name__)
def test_every_result_round_trips(cls, tmp_path):
    result = make(cls)
    result.save(tmp_path / "r")
    back = cls.load(tmp_path / "r")
    assert same(result, back)
    assert not same(result, make(cls, [1]))  # the comparison can fail: other specials in other places


def strict_json(text: str):
    """Parse as a strict reader (JavaScript's JSON.parse) does: the tokens NaN / Infinity are refused."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_inf_are_standard_json_and_come_back_as_floats(tmp_path):
    path = write_json(tmp_path / "x.json", {"nan": float("nan"), "inf": float("inf"), "neg": [-float("inf")]})
    strict = strict_json(path.read_text())
    assert strict == {"nan": {"__float__": "nan"}, "inf": {"__float__": "inf"}, "neg": [{"__float__": "-inf"}]}
    back = read_json(path)
    assert math.isnan(back["nan"]) and back["inf"] == math.inf and back["neg"] == [-math.inf]
    cert = make(Certificate)
    cert.N_star = float("inf")
    cert.save(tmp_path / "c")
    for file in (tmp_path / "c").rglob("*.json"):
        strict_json(file.read_text())
    assert Certificate.load(tmp_path / "c").summary()["N_star"] == math.inf


@pytest.mark.parametrize("cls", RESULT_CLASSES, ids=lambda c: c.__name__)
def test_every_result_writes_standard_json(cls, tmp_path):
    result = make(cls)
    for name, value in vars(result).items():  # put a NaN and an infinity wherever a float field is
        if isinstance(value, float):
            setattr(result, name, float("inf") if len(name) % 2 else float("nan"))
    result.save(tmp_path / "r")
    files = list((tmp_path / "r").rglob("*.json"))
    assert files
    for file in files:
        strict_json(file.read_text())
    assert same(result, cls.load(tmp_path / "r"))


def test_loading_checks_the_type(tmp_path):
    make(SpliceMetrics).save(tmp_path / "s")
    with pytest.raises(TypeError, match="SpliceMetrics, not a Certificate"):
        Certificate.load(tmp_path / "s")


def test_every_result_class_is_listed():
    """A new result class anywhere in the package must join RESULT_CLASSES (this test finds the ones that did not)."""
    import importlib
    import pkgutil

    import tl_query_lens

    for module in pkgutil.walk_packages(tl_query_lens.__path__, "tl_query_lens."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, stack = set(), [SavableResult]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("tl_query_lens."):
                found.add(sub)
    missing = sorted(c.__qualname__ for c in found - set(RESULT_CLASSES))
    assert not missing, f"add {missing} to RESULT_CLASSES"
