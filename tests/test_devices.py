"""Device and dtype: every tensor a method builds lives on the model's device; bf16/fp16 models work.

No GPU is needed: the model is moved to PyTorch's ``meta`` device (shapes only, no data), the corpus and the dictionary
stay on the CPU as a user would pass them, and every torch call is audited for arguments on two devices. A method that
creates a CPU tensor and mixes it with the model's activations or operators fails here exactly as it would on CUDA.
"""

import pytest
import torch

from tests.helpers import DeviceAudit, tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens
from tl_query_lens.operators import key_operators, module_operators, value_operators


def meta_model(style, **overrides):
    model = tiny_model(style, **overrides)
    dictionary = FFKV.from_model(model, 0)  # built on the CPU, as a user loads an SAE before moving the model
    return model.to("meta"), dictionary


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_engine_operators_stay_on_the_model_device(style, direction):
    model, _ = meta_model(style)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)  # CPU tokens: the engine moves them
    with DeviceAudit() as audit:
        sets = [
            value_operators(model, tokens, ["blocks.0.hook_resid_post"], direction=direction, progress=False),
            key_operators(model, tokens, ["blocks.1.ln2.hook_normalized"], direction=direction, progress=False),
            module_operators(model, tokens, direction=direction, progress=False),
        ]
    assert audit.mixed == []
    for ops in sets:
        assert ops.count == 12
        for name in ops:
            assert ops.sums[name].device.type == "meta" and ops.sums[name].dtype == torch.float32, name


@pytest.mark.parametrize("basis", ["identity", "features"])
def test_query_lens_directions_stay_on_the_model_device(style, basis):
    # RMSPre: a final norm without a weight (the embedded model after fold_ln), where lens.py built a CPU torch.ones.
    overrides = {"normalization_type": "RMSPre"} if style == "gated_rms" else {}
    model, dictionary = meta_model(style, **overrides)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    lens = QueryLens(model, tokens, progress=False, basis=basis)
    ids = [1, 5]
    with DeviceAudit() as audit:
        outputs = {
            method: lens.value_directions(dictionary, ids, method=method)
            for method in ("full", "first_order", "logit_lens")
        }
        outputs["key"] = lens.key_gradients(dictionary, ids)
        outputs["center"] = lens.corpus_center()
        view = lens._view(dictionary, ids, 1)[0]
        raw, terms, _ = lens._value_terms(view, torch.tensor(ids), "first_order")
        outputs["ln_f"] = lens._final_norm(raw)
        outputs["shares"] = lens._contributions(raw, terms, torch.zeros(2, 3, dtype=torch.long))
    assert audit.mixed == []
    for name, tensor in outputs.items():
        assert tensor.device.type == "meta", name


def test_audit_catches_a_cpu_tensor_mixed_with_the_model_device():
    """The guard itself: the pattern behind the old lens.py bug (a CPU torch.ones times a model-device tensor)."""
    with DeviceAudit() as audit:
        with pytest.raises(RuntimeError, match="expected device"):
            torch.ones(4) * torch.ones(4, device="meta")
        torch.zeros(3, 3) @ torch.zeros(3, 3, device="meta")  # PyTorch alone returns a CPU tensor here
    assert len(audit.mixed) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_match_fp32(dtype):
    """Activations in the model's dtype, operator sums in fp32: signatures of a bf16/fp16 copy stay close to fp32."""
    model = tiny_model("gated_rms")
    half = tiny_model("gated_rms", dtype=dtype)
    half.load_state_dict(model.state_dict())
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    dictionary = FFKV.from_model(model, 0)
    lens, half_lens = QueryLens(model, tokens, progress=False), QueryLens(half, tokens, progress=False)
    ops = half_lens.value_operator("blocks.0.hook_resid_post")
    assert ops.dtype == torch.float32
    ref = lens.value_operator("blocks.0.hook_resid_post")
    tolerance = 0.05 if dtype == torch.bfloat16 else 0.01
    assert (ops - ref).abs().max() / ref.abs().max() < tolerance
    for side, method in (("value", "full"), ("value", "first_order"), ("key", "full")):
        call = "value_signatures" if side == "value" else "key_signatures"
        ours = getattr(half_lens, call)(dictionary, [1, 5], k=5, method=method)
        exact = getattr(lens, call)(dictionary, [1, 5], k=5, method=method)
        assert torch.isfinite(ours.top_scores).all() and ours.top_scores.dtype == torch.float32
        scale = exact.top_scores.abs().max()
        assert (ours.top_scores - exact.top_scores).abs().max() / scale < 4 * tolerance, (side, method)
