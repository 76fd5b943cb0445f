"""``sweep_dtype``: the engine's sweeps on a copy of the model in another dtype, sums in fp32 (docs/gpu.md)."""

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens
from tl_query_lens.errors import InputError
from tl_query_lens.operators import key_operators, module_operators, value_operators

HOOK, READ = "blocks.1.hook_resid_post", "blocks.1.ln2.hook_normalized"
ENGINE = {"chunk": 16, "batch_size": 2, "progress": False}


def _bf16_model(style):
    """The reference: the same weights converted by torch's own ``Module.to`` (no copy_model)."""
    model = tiny_model(style)
    model.to(torch.bfloat16)
    return model


@pytest.mark.parametrize("run", ["value", "key", "module"])
def test_bf16_sweep_equals_a_bf16_model(style, run):
    model, tokens = tiny_model(style), tiny_tokens(tiny_model(style), n_seqs=3, seq_len=8)
    call = {
        "value": lambda m, **kw: value_operators(m, tokens, [HOOK], **ENGINE, **kw)[HOOK],
        "key": lambda m, **kw: key_operators(m, tokens, [READ], **ENGINE, **kw)[READ],
        "module": lambda m, **kw: module_operators(m, tokens, [2], **ENGINE, **kw)["blocks.2.mlp"],
    }[run]
    swept = call(model, sweep_dtype=torch.bfloat16)
    reference = call(_bf16_model(style))
    assert swept.dtype == torch.float32  # accumulated in fp32
    torch.testing.assert_close(swept, reference, rtol=0, atol=0)
    exact = call(model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the user's model is untouched
    rel = ((swept - exact).abs().max() / exact.abs().max()).item()
    assert 0 < rel < 5e-2  # bf16 products (8 mantissa bits): close to fp32, not equal


def test_fp32_sweep_dtype_changes_nothing(tmp_path):
    model, tokens = tiny_model("gelu_ln"), tiny_tokens(tiny_model("gelu_ln"), n_seqs=3, seq_len=8)
    plain = value_operators(model, tokens, [HOOK], **ENGINE)[HOOK]
    same = value_operators(model, tokens, [HOOK], sweep_dtype=torch.float32, **ENGINE)[HOOK]
    assert torch.equal(plain, same)
    low = value_operators(model, tokens, [HOOK], sweep_dtype=torch.bfloat16, cache_dir=tmp_path, **ENGINE)
    assert low.dtype == "bfloat16"  # cached under the precision it was computed in, never mistaken for fp32
    again = value_operators(model, tokens, [HOOK], cache_dir=tmp_path, **ENGINE)
    assert again.dtype == "float32" and torch.equal(again[HOOK], plain)


def test_query_lens_passes_sweep_dtype():
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    lens = QueryLens(model, tokens, sweep_dtype=torch.bfloat16, **ENGINE)
    reference = value_operators(_bf16_model("gated_rms"), tokens, [HOOK], **ENGINE)[HOOK]
    assert torch.equal(lens.value_operator(HOOK), reference)
    ffkv = FFKV.from_model(model, 1, "topk", k=8)
    assert lens.value_signatures(ffkv, [0, 1], method="full").top_ids.shape[0] == 2  # the fp32 readout still runs


def test_bad_sweep_dtype_is_an_input_error():
    model = tiny_model("gelu_ln")
    with pytest.raises(InputError, match="sweep_dtype"):
        value_operators(model, tiny_tokens(model), [HOOK], sweep_dtype=torch.int32, progress=False)


def test_autocast_sweep_equals_the_engine_under_torch_autocast(tmp_path):
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    ours = value_operators(
        model, tokens, [HOOK], sweep_dtype=torch.bfloat16, sweep_autocast=True, cache_dir=tmp_path, **ENGINE
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the reference: torch's own autocast around the plain engine
        reference = value_operators(model, tokens, [HOOK], **ENGINE)[HOOK]
    torch.testing.assert_close(ours[HOOK], reference, rtol=0, atol=0)
    assert ours.dtype == "bfloat16-autocast" and ours[HOOK].dtype == torch.float32
    exact = value_operators(model, tokens, [HOOK], **ENGINE)[HOOK]
    assert 0 < ((ours[HOOK] - exact).abs().max() / exact.abs().max()).item() < 5e-2
    with pytest.raises(InputError, match="sweep_autocast"):
        value_operators(model, tokens, [HOOK], sweep_autocast=True, progress=False)
