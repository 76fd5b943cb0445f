"""Precision settings: bf16 detection, ``"auto"`` resolved both ways, and bf16 output against fp32 references
within the tolerances of docs/benchmarks.md ("bf16 where its measured accuracy holds")."""

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens, precision
from tl_query_lens.errors import InputError
from tl_query_lens.operators import EngineConfig
from tl_query_lens.operators.engine import sweep_precision

ENGINE = {"chunk": 16, "batch_size": 2, "progress": False}


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert precision.cpu_flags(str(x86)) == {"fpu", "sse", "avx512f", "avx512_bf16"}  # the first CPU's
    assert precision.BF16_CPU_FLAGS & precision.cpu_flags(str(x86))
    assert precision.BF16_CPU_FLAGS & precision.cpu_flags(str(arm))
    assert not precision.BF16_CPU_FLAGS & precision.cpu_flags(str(plain))  # AVX-512 without BF16: not fast
    assert precision.cpu_flags(str(tmp_path / "missing")) == frozenset()  # macOS, Windows: not assumed


@pytest.mark.parametrize(
    ("flags", "fast"),
    [
        ({"avx512f", "avx512_bf16"}, True),
        ({"amx_bf16", "amx_tile"}, True),
        ({"avx2", "avx512f"}, False),
        (set(), False),
    ],
)
def test_bf16_fast_on_cpu_follows_the_flags(monkeypatch, flags, fast):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    assert precision.bf16_fast("cpu") is fast
    assert precision.bf16_fast(None) is fast


def test_bf16_fast_on_cuda_asks_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.bf16_fast("cuda") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for supported in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, s=supported: s)
        assert precision.bf16_fast("cuda:0") is supported
    assert precision.bf16_fast("meta") is False


@pytest.mark.parametrize("fast", [True, False])
def test_auto_resolves_through_the_detection_and_the_environment(monkeypatch, fast):
    monkeypatch.setattr(precision, "bf16_fast", lambda device="cpu": fast)
    monkeypatch.delenv(precision.PRECISION_ENV, raising=False)
    assert precision.use_bf16("auto") is fast
    monkeypatch.setenv(precision.PRECISION_ENV, "float32")  # fp32 one setting away, whatever the units
    assert precision.use_bf16("auto") is False
    monkeypatch.setenv(precision.PRECISION_ENV, "bfloat16")
    assert precision.use_bf16("auto") is True
    assert precision.use_bf16("float32") is False and precision.use_bf16(False) is False  # explicit wins
    monkeypatch.setenv(precision.PRECISION_ENV, "float32")
    assert precision.use_bf16("bfloat16") is True and precision.use_bf16(True) is True
    monkeypatch.setenv(precision.PRECISION_ENV, "fp16")
    with pytest.raises(InputError, match="TLQL_PRECISION='fp16': set it to 'float32', 'bfloat16' or 'auto'"):
        precision.use_bf16("auto")
    with pytest.raises(InputError, match="precision must be one of"):
        precision.use_bf16("half")


@pytest.mark.parametrize("fast", [True, False])
def test_model_passes_and_the_engine_resolve_auto(monkeypatch, fast):
    monkeypatch.delenv(precision.PRECISION_ENV, raising=False)
    monkeypatch.setattr(precision, "bf16_fast", lambda device="cpu": fast)
    model = tiny_model("gated_rms")
    with precision.model_passes(model, "auto"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == (torch.bfloat16 if fast else torch.float32)
    with precision.model_passes(model, "float32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert sweep_precision(EngineConfig(sweep_dtype="auto"), model) == (
        (torch.bfloat16, True) if fast else (None, False)
    )
    assert sweep_precision(EngineConfig(sweep_dtype=None), model) == (None, False)  # explicit fp32: not resolved
    assert sweep_precision(EngineConfig(sweep_dtype="bfloat16", sweep_autocast=True), model) == (torch.bfloat16, True)
    with pytest.raises(InputError, match="'auto' or None"):
        EngineConfig(sweep_dtype="half")


def test_auto_bf16_sweep_against_the_fp32_per_feature_reference(monkeypatch):
    """The engine's "auto" sweep, resolved to bf16 autocast, against the plain per-feature JVP reference in fp32:
    inside the operator tolerance (relative Frobenius error ≤ 1e-2), and farther than fp32 rounding (bf16 really ran)."""
    from tl_query_lens.query_lens.reference import clean_stream, value_direction

    monkeypatch.setenv(precision.PRECISION_ENV, "bfloat16")
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    ffkv = FFKV.from_model(model, 1, "topk", k=8)
    features = [0, 5, 9, 17]
    low = QueryLens(model, tokens, sweep_dtype="auto", **ENGINE).value_directions(ffkv, features, basis="identity")
    stream, mask = clean_stream(model, tokens), torch.ones(tokens.shape)
    reference = torch.stack(
        [
            value_direction(model, stream, "blocks.1.hook_resid_post", ffkv.W_dec[i].detach(), mask, "full")
            for i in features
        ]
    )
    error = float((low - reference.detach()).norm() / reference.detach().norm())
    assert 1e-4 < error <= 1e-2, error  # fp32 sweeps agree with the reference to ~1e-7; bf16 here to ~2e-3


def _top_contexts(out) -> dict[int, set[int]]:
    import json

    tops = {}
    for path in sorted((out / "shards").rglob("*.json")):
        for rec in json.loads(path.read_text(encoding="utf-8"))["features"]:
            tops[rec["i"]] = {ctx["s"] for ctx in rec["top"]}
    return tops


def test_atlas_corpus_pass_in_bf16_against_fp32(monkeypatch, tmp_path):
    """The atlas's corpus pass with its "auto" precision resolved to bf16 finds the fp32 pass's top contexts (mean
    Jaccard ≥ 0.95, the stated tolerance), and a bf16 build's shards are not reused by an fp32 build."""
    from tl_query_lens.atlas import AtlasConfig, build_atlas

    model = tiny_model("gated_rms")
    cfg = AtlasConfig(out=tmp_path, dictionary=("ffkv:1",), n_tokens=64 * 16, seq_len=16, n_top=8, signatures=False)
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len)
    tops = {}
    for value in ("bfloat16", "float32"):
        monkeypatch.setenv(precision.PRECISION_ENV, value)
        result = build_atlas(model, None, cfg, tokens=tokens, progress=False)
        assert result.shards_reused == 0  # the fp32 build after the bf16 one rebuilds every shard
        tops[value] = _top_contexts(tmp_path)
    low, ref = tops["bfloat16"], tops["float32"]
    assert sorted(low) == sorted(ref) == list(range(model.cfg.d_mlp))  # every FF-KV neuron of the tiny model
    scores = [len(low[i] & ref[i]) / len(low[i] | ref[i]) for i in ref if ref[i] | low[i]]
    assert sum(scores) / len(scores) >= 0.95
    assert min(scores) < 1  # bf16 really ran: some near-ties swap
