import pytest
import torch
import torch.nn.functional as F
from sae_lens import (
    GatedSAE,
    GatedSAEConfig,
    JumpReLUSAE,
    JumpReLUSAEConfig,
    StandardSAE,
    StandardSAEConfig,
    TopKSAE,
    TopKSAEConfig,
)
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.transcoder import Transcoder, TranscoderConfig

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import as_key_value

HOOK = "blocks.1.hook_resid_post"


def build(arch: str, d_in: int = 32, d_sae: int = 48, hook: str = HOOK, hook_out: str | None = None):
    meta = SAEMetadata(hook_name=hook, hook_name_out=hook_out)
    torch.manual_seed(1)
    if arch == "standard":
        sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta))
    elif arch == "topk":
        sae = TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=6, metadata=meta))
    elif arch == "jumprelu":
        sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta))
    elif arch == "gated":
        sae = GatedSAE(GatedSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta))
    elif arch == "transcoder":
        sae = Transcoder(
            TranscoderConfig(d_in=d_in, d_sae=d_sae, d_out=d_in, apply_b_dec_to_input=False, metadata=meta)
        )
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae


@pytest.mark.parametrize("arch", ["standard", "topk", "jumprelu", "gated", "transcoder"])
def test_view_matches_sae(arch):
    model = tiny_model("gelu_ln")
    hook_out = "blocks.1.hook_mlp_out" if arch == "transcoder" else None
    hook = "blocks.1.ln2.hook_normalized" if arch == "transcoder" else HOOK
    sae = build(arch, hook=hook, hook_out=hook_out)
    view = as_key_value(sae, model)
    assert view.keys.shape == (48, 32) and view.values.shape == (48, 32)
    assert view.read_hook == hook and view.write_hook == (hook_out or hook)
    assert view.activation == arch
    torch.testing.assert_close(view.values, sae.W_dec)
    _, cache = model.run_with_cache(tiny_tokens(model))
    x = cache[hook]
    pre = x @ view.keys.T + view.b_enc  # independent: the view's affine key read-out
    acts = sae.encode(x)
    if arch in ("standard", "transcoder"):
        torch.testing.assert_close(acts, F.relu(pre), atol=1e-5, rtol=1e-5)
    elif arch == "topk":
        # TopK keeps the 6 largest pre-activations (after ReLU) unchanged
        kept = acts != 0
        torch.testing.assert_close(acts[kept], F.relu(pre)[kept], atol=1e-5, rtol=1e-5)
    elif arch == "jumprelu":
        fired = acts != 0
        torch.testing.assert_close(acts[fired], pre[fired], atol=1e-5, rtol=1e-5)
    elif arch == "gated":
        # the gate is the key read-out: a feature fires only where its key pre-activation is positive
        assert not ((acts != 0) & (pre <= 0)).any()
        x_in = x - sae.b_dec
        magnitude = F.relu(x_in @ (sae.W_enc * sae.r_mag.exp()) + sae.b_mag)
        torch.testing.assert_close(acts, (pre > 0).float() * magnitude, atol=1e-5, rtol=1e-5)


def test_apply_b_dec_to_input_is_folded_into_bias():
    sae = build("standard")
    assert sae.cfg.apply_b_dec_to_input
    view = as_key_value(sae)
    x = torch.randn(5, 32)
    torch.testing.assert_close(F.relu(x @ view.keys.T + view.b_enc), sae.encode(x), atol=1e-5, rtol=1e-5)


def test_unknown_hook_lists_valid_hooks():
    model = tiny_model("gelu_ln")
    sae = build("standard", hook="blocks.1.hook_resid_pots")
    with pytest.raises(KeyError, match="blocks.1.hook_resid_post"):
        as_key_value(sae, model)
    with pytest.raises(KeyError, match="Unknown hook"):
        as_key_value(build("standard", hook="blocks.7.hook_resid_post"), model)


def test_d_in_mismatch():
    model = tiny_model("gated_rms")
    with pytest.raises(ValueError, match="d_in mismatch.*32"):
        as_key_value(build("standard", d_in=24), model)
    with pytest.raises(ValueError, match="d_in mismatch"):
        as_key_value(build("standard", hook="blocks.0.mlp.hook_post"), model)  # d_mlp = 64 wide


def test_feature_ids_out_of_range():
    view = as_key_value(build("standard"))
    assert view.feature_ids([0, 47]).tolist() == [0, 47]
    with pytest.raises(IndexError, match="0..47"):
        view.feature_ids([3, 48])
    with pytest.raises(IndexError):
        view.feature_ids(-1)


def test_rejects_non_dictionaries():
    with pytest.raises(TypeError, match="SAELens SAEs"):
        as_key_value(torch.nn.Linear(3, 3))
