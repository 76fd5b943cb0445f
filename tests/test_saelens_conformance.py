"""SAELens conformance: the architecture-generic SAE and HookedSAETransformer checks, run on every FF-KV variant
(both tiny styles), the readout SAE, and SAELens' own ``TopKSAE`` and ``Transcoder`` as controls.

A behaviour is required of our classes exactly where the control of the same kind (an SAE that reads and writes
one hook: ``TopKSAE``; a transcoder: ``Transcoder``) shows it; where the controls differ from each other the
expectation is taken from the control at run time, not written down here. The trained SAEs / transcoders of the
SAE suite are SAELens ``TopKSAE`` / ``Transcoder`` instances, so the controls cover them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from sae_lens import SAE, TopKSAE, TopKSAEConfig, Transcoder, TranscoderConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import STYLES, tiny_model, tiny_readout, tiny_tokens
from tl_query_lens import FFKV, FFKVSAE

SAE_HOOKS = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_output",
    "hook_sae_recons",
    "hook_sae_error",
)
READOUT_WIDTH = 2304  # > 2048: feature ids that neither bfloat16 (exact to 256) nor float16 (to 2048) can hold


@functools.cache
def _model(style):
    return tiny_model(style)


def _inputs(model, sae: SAE) -> torch.Tensor:
    """Activations at the SAE's read hook on a tiny random batch."""
    _, cache = model.run_with_cache(tiny_tokens(model, n_seqs=2, seq_len=8), names_filter=sae.cfg.metadata.hook_name)
    return cache[sae.cfg.metadata.hook_name].detach()


def _metadata(model, hook_name: str, hook_name_out: str | None = None) -> SAEMetadata:
    return SAEMetadata(
        model_name=model.cfg.model_name,
        hook_name=hook_name,
        hook_name_out=hook_name_out,
        hook_layer=1,
        prepend_bos=True,
        context_size=model.cfg.n_ctx,
    )


def _randomise(sae: SAE, seed: int) -> SAE:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(sae.b_enc.shape, generator=gen) * 0.1)
        sae.b_dec.copy_(torch.randn(sae.b_dec.shape, generator=gen) * 0.1)
        sae.W_dec.mul_(1 + torch.rand(sae.W_dec.shape[0], 1, generator=gen))  # decoder norms far from 1
    return sae


def _topk_control(model) -> SAE:
    d = model.cfg.d_model
    torch.manual_seed(1)
    cfg = TopKSAEConfig(
        d_in=d, d_sae=64, k=8, dtype="float32", device="cpu", metadata=_metadata(model, "blocks.1.hook_resid_post")
    )
    return _randomise(TopKSAE(cfg), 1)


def _transcoder_control(model) -> SAE:
    d = model.cfg.d_model
    torch.manual_seed(2)
    cfg = TranscoderConfig(
        d_in=d,
        d_out=d,
        d_sae=64,
        dtype="float32",
        device="cpu",
        apply_b_dec_to_input=False,
        metadata=_metadata(model, "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"),
    )
    return _randomise(Transcoder(cfg), 2)


def _readout(model) -> SAE:
    sae = tiny_readout(model, d_sae=READOUT_WIDTH)
    assert int(sae.code_indices.max()) > 2048  # the ids must exercise every low-precision dtype
    return sae


FFKV_VARIANTS: dict[str, dict] = {
    "vanilla": {"variant": "vanilla"},
    "normalized": {"variant": "normalized"},
    "normalized-top8": {"variant": "normalized", "k": 8},
    "topk8-magnitude": {"variant": "topk", "k": 8, "topk_by": "magnitude"},
    "topk8-value": {"variant": "topk", "k": 8, "topk_by": "value"},
}


@dataclass(frozen=True)
class Case:
    name: str
    style: str
    kind: str  # "sae" (reads and writes one hook) or "transcoder"
    build: Callable

    def make(self):
        model = _model(self.style)
        return model, _built(self)


@functools.cache
def _built_cached(case: Case) -> SAE:
    return case.build(_model(case.style))


def _built(case: Case) -> SAE:
    return copy.deepcopy(_built_cached(case))


CONTROLS = {"sae": "topk-control", "transcoder": "transcoder-control"}
CASES = [
    case
    for style in STYLES
    for case in (
        *(
            Case(
                f"ffkv-{v}-{style}",
                style,
                "transcoder",
                functools.partial(lambda m, kw: FFKV.from_model(m, 1, **kw), kw=kw),
            )
            for v, kw in FFKV_VARIANTS.items()
        ),
        Case(f"readout-{style}", style, "sae", _readout),
        Case(f"topk-control-{style}", style, "sae", _topk_control),
        Case(f"transcoder-control-{style}", style, "transcoder", _transcoder_control),
    )
]


def _control(case: Case) -> Case:
    return next(c for c in CASES if c.name == f"{CONTROLS[case.kind]}-{case.style}")


cases = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# ------------------------------------------------------------------------------------------------ config, disk
@cases
def test_to_dict_from_dict_round_trip(case):
    _, sae = case.make()
    cfg_dict = sae.cfg.to_dict()
    rebuilt = SAE.from_dict(cfg_dict)
    assert type(rebuilt) is type(sae)
    assert rebuilt.cfg.to_dict() == cfg_dict
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in sae.state_dict().items()}


@cases
def test_save_load_bit_exact(case, tmp_path):
    model, sae = case.make()
    sae.save_model(tmp_path / "sae")
    loaded = SAE.load_from_disk(tmp_path / "sae")
    assert type(loaded) is type(sae) and loaded.cfg.to_dict() == sae.cfg.to_dict()
    for name, tensor in sae.state_dict().items():
        got = loaded.state_dict()[name]
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
    x = _inputs(model, sae)
    assert torch.equal(loaded(x), sae(x))


@cases
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_to_dtype(case, dtype):
    model, sae = case.make()
    before = {k: v.clone() for k, v in sae.state_dict().items()}
    moved = sae.to(dtype)
    assert moved.dtype == dtype and moved.cfg.dtype == str(dtype).removeprefix("torch.")
    for name, tensor in moved.state_dict().items():
        if before[name].is_floating_point():
            assert tensor.dtype == dtype and torch.equal(tensor, before[name].to(dtype)), name
        else:  # ids and other integer buffers must keep dtype and every value
            assert tensor.dtype == before[name].dtype and torch.equal(tensor, before[name]), name
    x = _inputs(model, sae)
    assert moved.encode(x).dtype == dtype and moved(x).dtype == dtype


@cases
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_load(case, dtype, tmp_path):
    """``load_from_disk(..., dtype=)`` casts the floats; integer buffers (readout feature ids) keep every value."""
    _, sae = case.make()
    sae.save_model(tmp_path / "sae")
    loaded = SAE.load_from_disk(tmp_path / "sae", dtype=dtype)
    torch_dtype = getattr(torch, dtype)
    assert loaded.cfg.dtype == dtype
    for name, tensor in sae.state_dict().items():
        got = loaded.state_dict()[name]
        expected = tensor.to(torch_dtype) if tensor.is_floating_point() else tensor
        assert got.dtype == expected.dtype and torch.equal(got, expected), name


def test_readout_bf16_from_pretrained_keeps_every_id(tmp_path, monkeypatch):
    from tl_query_lens.readout import cached_sae_path, register_releases

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    sae = _readout(_model("gelu_ln"))
    register_releases({"conformance-tiny": {"model": "tiny", "repo_id": None, "sae_ids": ["cpu"]}})
    sae.save_model(cached_sae_path("conformance-tiny", "cpu"))
    for dtype in ("bfloat16", "float16"):
        loaded = SAE.from_pretrained("tlql-readout-conformance-tiny", "cpu", dtype=dtype)
        assert loaded.code_indices.dtype == torch.int64 and torch.equal(loaded.code_indices, sae.code_indices)
        assert int(loaded.code_indices.max()) < sae.cfg.d_sae


def test_readout_old_format_low_precision_load_fails_clearly(tmp_path):
    """A file written before the digit format holds raw int64 ids: float32 still loads it; bf16 refuses."""
    from safetensors.torch import save_file

    sae = _readout(_model("gelu_ln"))
    sae.save_model(tmp_path / "sae")
    save_file(sae.state_dict(), str(tmp_path / "sae" / "sae_weights.safetensors"))  # the pre-fix layout
    assert torch.equal(SAE.load_from_disk(tmp_path / "sae").code_indices, sae.code_indices)
    with pytest.raises(ValueError, match="dtype='float32'"):
        SAE.load_from_disk(tmp_path / "sae", dtype="bfloat16")


# ------------------------------------------------------------------------------------------------ folding
def _fold_w_dec_norm_or_refusal(case: Case, fold: Callable[[SAE], SAE]) -> tuple[SAE, SAE] | None:
    """Fold a copy; returns (original, folded), or None after checking a refusal is clear and changed nothing."""
    _, sae = case.make()
    target = copy.deepcopy(sae)
    try:
        folded = fold(target)
    except NotImplementedError as err:
        assert len(str(err)) > 40, "a refusal must say why and what to do"
        for name, tensor in sae.state_dict().items():
            assert torch.equal(target.state_dict()[name], tensor), f"refused fold modified {name}"
        return None
    return sae, folded


@cases
@pytest.mark.parametrize("route", ["method", "load_from_disk"])
def test_fold_W_dec_norm_exact_or_refused(case, route, tmp_path):
    def fold(sae):
        if route == "method":
            sae.fold_W_dec_norm()
            return sae
        sae.save_model(tmp_path / "sae")
        return SAE.load_from_disk(tmp_path / "sae", fold_W_dec_norm=True)

    pair = _fold_w_dec_norm_or_refusal(case, fold)
    if pair is None:
        return
    sae, folded = pair
    x = _inputs(_model(case.style), sae)
    torch.testing.assert_close(folded.W_dec.norm(dim=-1), torch.ones(sae.cfg.d_sae), atol=1e-6, rtol=0)
    assert _rel(folded(x), sae(x)) <= 1e-5
    # SAELens' convention: feature activations grow by the decoder norms they absorbed.
    torch.testing.assert_close(folded.encode(x), sae.encode(x) * sae.W_dec.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_fold_W_dec_norm_behaviour_by_variant():
    """Which FF-KV variants fold exactly and which refuse (the conformance test accepts either)."""
    model = _model("gated_rms")
    for kw, folds in [
        ({"variant": "vanilla"}, True),
        ({"variant": "normalized"}, True),
        ({"variant": "normalized", "k": 8}, True),
        ({"variant": "topk", "k": 8}, False),
        ({"variant": "topk", "k": 8, "topk_by": "value"}, False),
    ]:
        sae = FFKV.from_model(model, 1, **kw)
        if folds:
            sae.fold_W_dec_norm()
        else:
            with pytest.raises(NotImplementedError, match="normalized"):
                sae.fold_W_dec_norm()


@cases
def test_fold_activation_norm_scaling_factor(case):
    model, sae = case.make()
    s = 3.0
    folded = copy.deepcopy(sae)
    folded.fold_activation_norm_scaling_factor(s)
    assert folded.cfg.normalize_activations == "none"
    x = _inputs(model, sae)
    acts, acts_folded = sae.encode(x), folded.encode(x / s)
    assert torch.equal(acts != 0, acts_folded != 0)
    torch.testing.assert_close(acts_folded, acts, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s * folded.decode(acts_folded), sae.decode(acts), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ hooks
def _fired(sae: SAE, x: torch.Tensor, *, use_error_term: bool) -> set[str]:
    sae.use_error_term = use_error_term
    _, cache = sae.run_with_cache(x)
    return {name for name in cache if name in SAE_HOOKS}


@cases
@pytest.mark.parametrize("use_error_term", [False, True])
def test_standalone_hooks_match_control(case, use_error_term):
    """Standalone ``sae(x)`` fires the hooks its control fires. SAELens' ``Transcoder`` fires neither
    hook_sae_output nor hook_sae_error (its true output lives at another hook), and FF-KV follows it."""
    model, sae = case.make()
    _, control = _control(case).make()
    x = _inputs(model, sae)
    expected = _fired(control, _inputs(model, control), use_error_term=use_error_term)
    assert {"hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"} <= expected
    assert _fired(sae, x, use_error_term=use_error_term) == expected
    if case.kind == "sae":
        out = sae(x)
        if use_error_term:  # the error term restores the input exactly
            torch.testing.assert_close(out, x, atol=1e-5, rtol=1e-5)
        else:
            assert _rel(out, x) > 1e-4


# ------------------------------------------------------------------------------------------------ HookedSAETransformer
def _manual_splice(model, sae: SAE, tokens: torch.Tensor) -> torch.Tensor:
    """Independent reference: run_with_hooks that replaces the output hook with decode(encode(input))."""
    captured = {}
    read, write = sae.cfg.metadata.hook_name, sae.cfg.metadata.hook_name_out or sae.cfg.metadata.hook_name

    def grab(act, hook):
        captured["x"] = act
        return act

    def replace(act, hook):
        return sae.decode(sae.encode(captured.get("x", act))).to(act.dtype)

    hooks = [(write, replace)] if read == write else [(read, grab), (write, replace)]
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=hooks)


@cases
def test_run_with_saes(case):
    model, sae = case.make()
    tokens = tiny_tokens(model)
    with torch.no_grad():
        clean = model(tokens)
        spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
        with_error = model.run_with_saes(tokens, saes=[sae], use_error_term=True)
        after = model(tokens)
    torch.testing.assert_close(spliced, _manual_splice(model, sae, tokens), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(with_error, clean, atol=1e-4, rtol=1e-4)
    assert torch.equal(after, clean) and not model.acts_to_saes  # run_with_saes leaves no SAE attached


@cases
@pytest.mark.parametrize("use_error_term", [False, True])
def test_run_with_cache_with_saes_matches_control(case, use_error_term):
    model, sae = case.make()
    _, control = _control(case).make()
    tokens = tiny_tokens(model)

    def sae_hooks(s):
        prefix = (s.cfg.metadata.hook_name_out or s.cfg.metadata.hook_name) + "."
        with torch.no_grad():
            _, cache = model.run_with_cache_with_saes(tokens, saes=[s], use_error_term=use_error_term)
        return {k.removeprefix(prefix) for k in cache if k.startswith(prefix)}

    expected = sae_hooks(control)
    got = sae_hooks(sae)
    assert got == expected
    assert set(SAE_HOOKS) - {"hook_sae_error"} <= got and (("hook_sae_error" in got) == use_error_term)


@cases
def test_add_sae_and_gradients_through_splice(case):
    model, sae = case.make()
    tokens = tiny_tokens(model)
    model.add_sae(sae)
    try:
        assert next(iter(model.acts_to_saes.values())) is sae
        loss = model(tokens, return_type="loss")
        loss.backward()
    finally:
        model.reset_saes()
        model.zero_grad(set_to_none=True)
    assert sae.W_dec.grad is not None and torch.isfinite(sae.W_dec.grad).all() and sae.W_dec.grad.abs().sum() > 0


def test_ffkv_is_a_transcoder_like_the_control():
    """The case table's kinds are right: FF-KV writes a different hook than it reads, as ``Transcoder`` does."""
    model = _model("gelu_ln")
    ffkv = FFKV.from_model(model, 1)
    assert isinstance(ffkv, FFKVSAE)
    assert ffkv.cfg.metadata.hook_name != ffkv.cfg.metadata.hook_name_out
    assert _transcoder_control(model).cfg.metadata.hook_name_out == ffkv.cfg.metadata.hook_name_out
