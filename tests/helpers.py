"""Builders for offline tests: tiny random TransformerLens models in both architecture styles."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from sae_lens import HookedSAETransformer
from transformer_lens import HookedTransformerConfig

Style = Literal["gelu_ln", "gated_rms"]
STYLES: tuple[Style, ...] = ("gelu_ln", "gated_rms")


def tiny_config(style: Style = "gelu_ln", **overrides) -> HookedTransformerConfig:
    """A 3-layer random config: GELU/LayerNorm/learned positions, or SiLU-gated/RMSNorm/rotary (Llama-like, GQA)."""
    common = dict(n_layers=3, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=32, d_vocab=61, seed=0)
    if style == "gelu_ln":
        kw = dict(act_fn="gelu", normalization_type="LN", positional_embedding_type="standard")
    else:
        kw = dict(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=8,
                  gated_mlp=True, final_rms=True, n_key_value_heads=2)
    return HookedTransformerConfig(**{**common, **kw, **overrides})


def tiny_model(style: Style = "gelu_ln", *, perturb_norms: bool = True, **overrides) -> HookedSAETransformer:
    """Random tiny model; norm weights/biases and MLP biases are randomised so folding bugs cannot hide."""
    torch.manual_seed(0)
    model = HookedSAETransformer(tiny_config(style, **overrides))
    if perturb_norms:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(".w"):
                    param.normal_(1.0, 0.2)
                elif name.endswith(".b") or name.split(".")[-1] in {"b_in", "b_out", "b_O", "b_U"}:
                    param.normal_(0.0, 0.1)
    model.eval()
    return model


def tiny_tokens(model, n_seqs: int = 4, seq_len: int = 12, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.d_vocab, (n_seqs, seq_len), generator=gen)


@pytest.fixture(params=STYLES)
def style(request) -> Style:
    return request.param


class DeviceAudit(torch.overrides.TorchFunctionMode):
    """Records every torch call whose tensor arguments (0-d scalars aside) live on more than one device.

    PyTorch itself is lax on the ``meta`` device (``cpu_tensor @ meta_tensor`` silently returns a CPU tensor), so a run
    with the model on ``meta`` only catches a stray CPU tensor under this mode. Use ``with DeviceAudit() as audit:``
    and assert ``audit.mixed == []``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
        devices = {t.device.type for t in flat if isinstance(t, torch.Tensor) and t.ndim > 0}
        if len(devices) > 1:
            self.mixed.append(f"{getattr(func, '__name__', func)} on {sorted(devices)}")
        return func(*args, **kwargs)
