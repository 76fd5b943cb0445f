"""The engine's FLOP accounting (operators/flops.py) against two independent references (docs/gpu.md).

1. A hand count on the tiny models, written out as plain arithmetic from the config numbers.
2. ``torch.utils.flop_counter.FlopCounterMode``, which counts the matrix products torch actually dispatches.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.helpers import arch_model, tiny_model, tiny_tokens
from tl_query_lens.operators import key_operators, module_operators, value_operators
from tl_query_lens.operators.flops import block_flops, count_flops


def _measured(run) -> tuple[int, int]:
    with FlopCounterMode(display=False) as reference, count_flops() as ours:
        run()
    return ours.total, reference.get_total_flops()


def test_value_operator_hand_count():
    # gelu_ln: d_model 32, 4 heads of 8, d_mlp 64, 3 layers; 4 sequences of 12 tokens = 48 tokens.
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=4, seq_len=12)
    qkv, core, out, mlp = 2 * 32 * 8 * 12, 2 * 2 * 4 * 8 * 12, 2 * 32 * 32, 2 * 32 * 64 * 2
    forward = 3 * 48 * (qkv + core + out + mlp)  # one clean pass through the 3 blocks
    backward = 32 * 48 * (qkv + 2 * core + out + mlp)  # 32 cotangents back through block 2 only
    probe = 3 * 1 * (qkv + 2 * 2 * 4 * 8 * 1 + out + mlp)  # the one-token width probe (P = 1)
    hand = forward + backward + probe
    assert hand == 32_514_432
    ours, reference = _measured(
        lambda: value_operators(model, tokens, ["blocks.1.hook_resid_post"], chunk=32, batch_size=4, progress=False)
    )
    assert ours == hand == reference


def test_key_operator_hand_count_forward_mode():
    # gated_rms: GQA (4 query heads, 2 key/value heads), gated MLP; the read hook sits inside block 1, so the forward
    # runs blocks 0 and 1 and the tangents cross both whole blocks. chunk 16 of 32 tangents: two primal passes, each
    # with one more primal-sized product per weight matrix crossed (torch.func's zero weight tangent).
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=4, seq_len=12)
    qkv, core, out = 2 * 32 * 8 * (4 + 2 * 2), 2 * 2 * 4 * 8 * 12, 2 * 32 * 32
    mlp_in, mlp_out = 2 * 32 * 64 * 2, 2 * 64 * 32
    block = qkv + core + out + mlp_in + mlp_out
    weights = qkv + out + mlp_in + mlp_out
    primal = 2 * 48 * 2 * (block + weights)  # 2 chunks × 48 tokens × 2 blocks
    tangents = 32 * 48 * 2 * (block + core)
    probe = 2 * (qkv + 2 * 2 * 4 * 8 * 1 + out + mlp_in + mlp_out)
    hand = primal + tangents + probe
    ours, reference = _measured(
        lambda: key_operators(model, tokens, ["blocks.1.ln2.hook_normalized"], chunk=16, batch_size=4, progress=False)
    )
    assert ours == hand == reference


def test_block_flops_of_gpt2_small():
    from transformer_lens import HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=12, d_model=768, d_head=64, n_heads=12, d_mlp=3072, n_ctx=1024, d_vocab=50257, act_fn="gelu_new"
    )
    block = block_flops(cfg, 32)
    assert block.forward == 2 * 768 * 768 * 4 + 4 * 768 * 32 + 2 * 2 * 768 * 3072
    assert block.tangent / block.forward == pytest.approx(1.007, abs=5e-4)  # one tangent ≈ one forward pass


CALLS = {
    "value reverse, two sources": lambda m, t, b, E: value_operators(
        m, t, ["blocks.0.ln2.hook_normalized", "blocks.1.hook_resid_post"], **E
    ),
    "value forward": lambda m, t, b, E: value_operators(m, t, ["blocks.0.hook_resid_post"], direction="forward", **E),
    "value feature basis": lambda m, t, b, E: value_operators(m, t, ["blocks.1.hook_resid_pre"], basis=b, **E),
    "value from hook_z to an MLP write": lambda m, t, b, E: value_operators(
        m, t, ["blocks.0.attn.hook_z"], destination="blocks.1.hook_mlp_out", **E
    ),
    "key forward": lambda m, t, b, E: key_operators(m, t, ["blocks.1.mlp.hook_in", "blocks.0.hook_resid_post"], **E),
    "key reverse": lambda m, t, b, E: key_operators(m, t, ["blocks.1.ln2.hook_normalized"], direction="reverse", **E),
    "key feature basis": lambda m, t, b, E: key_operators(m, t, ["blocks.2.hook_attn_out"], basis=b, **E),
    "module reverse": lambda m, t, b, E: module_operators(m, t, [0, 2], **E),
    "module forward": lambda m, t, b, E: module_operators(m, t, [1, 2], direction="forward", **E),
}


ARCHS = ["gpt2", "pythia", "gemma2", "llama"]  # LN/learned positions, parallel blocks, pre+post RMS norms, GQA+gated
CASES = [(ARCHS[i % 4], call) for i, call in enumerate(CALLS)] + [
    ("pythia", "module reverse"),
    ("llama", "key forward"),
]


@pytest.mark.parametrize(("arch", "call"), CASES)
def test_count_equals_flop_counter_mode(arch, call):
    """Every sweep shape (reverse/forward, feature bases, replace mode, parallel blocks, GQA, gated MLPs, a partial
    last minibatch and chunk) counts exactly what torch dispatches."""
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=6)  # minibatches of 2 and 1
    basis = torch.randn(5, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    engine = {"chunk": 20, "batch_size": 2, "progress": False}  # chunks of 20 and 12
    ours, reference = _measured(lambda: CALLS[call](model, tokens, basis, engine))
    assert ours == reference > 0


def test_cached_results_count_nothing(tmp_path):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)

    def run():
        value_operators(model, tokens, ["blocks.0.hook_resid_post"], cache_dir=tmp_path, progress=False)

    first, _ = _measured(run)
    again, reference = _measured(run)
    assert first > 0 and again == reference  # only the width probe runs when the cache answers
