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
    common = {
        "n_layers": 3,
        "d_model": 32,
        "d_head": 8,
        "n_heads": 4,
        "d_mlp": 64,
        "n_ctx": 32,
        "d_vocab": 61,
        "seed": 0,
    }
    if style == "gelu_ln":
        kw = {"act_fn": "gelu", "normalization_type": "LN", "positional_embedding_type": "standard"}
    else:
        kw = {
            "act_fn": "silu",
            "normalization_type": "RMS",
            "positional_embedding_type": "rotary",
            "rotary_dim": 8,
            "gated_mlp": True,
            "final_rms": True,
            "n_key_value_heads": 2,
        }
    return HookedTransformerConfig(**{**common, **kw, **overrides})


# The architecture matrix: tiny random configs mirroring the families users run (docs/design.md §4).
ARCHITECTURES: dict[str, dict] = {
    # GPT-2: LayerNorm, learned positions, gelu_new, qkv biases.
    "gpt2": {"act_fn": "gelu_new", "normalization_type": "LN", "positional_embedding_type": "standard"},
    # Pythia (GPT-NeoX): parallel attention/MLP, partial rotary (rotary_dim < d_head), LayerNorm, gelu.
    "pythia": {
        "act_fn": "gelu",
        "normalization_type": "LN",
        "positional_embedding_type": "rotary",
        "rotary_dim": 4,
        "parallel_attn_mlp": True,
    },
    # Gemma-2: RMS pre+post norms around each module, attention and final-logit soft-capping, gated gelu_pytorch_tanh.
    "gemma2": {
        "act_fn": "gelu_pytorch_tanh",
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": 8,
        "gated_mlp": True,
        "final_rms": True,
        "use_normalization_before_and_after": True,
        "attn_scores_soft_cap": 5.0,
        "output_logits_soft_cap": 3.0,
        "n_key_value_heads": 2,
    },
    # Llama: RMS, rotary, GQA, SiLU-gated MLP.
    "llama": {
        "act_fn": "silu",
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": 8,
        "gated_mlp": True,
        "final_rms": True,
        "n_key_value_heads": 2,
    },
    # Qwen: Llama-like with biases on q, k, v.
    "qwen": {
        "act_fn": "silu",
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": 8,
        "gated_mlp": True,
        "final_rms": True,
        "n_key_value_heads": 2,
    },
}
_QKV_BIASES = {"gpt2", "pythia", "qwen"}


def arch_model(arch: str, **overrides) -> HookedSAETransformer:
    """A tiny random model of one ``ARCHITECTURES`` family, norms and biases randomised (qkv biases where it has them)."""
    model = tiny_model("gelu_ln", **{**ARCHITECTURES[arch], **overrides})
    if arch in _QKV_BIASES:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.split(".")[-1].lstrip("_") in {"b_Q", "b_K", "b_V"}:
                    param.normal_(0.0, 0.3)
    return model


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


def tiny_readout(model, d_sae: int = 128, k: int = 8, seed: int = 3):
    """A random-weight readout SAE (unit decoder rows, μ = mean LM-head row) with the model's row codes stored."""
    from sae_lens.saes.sae import SAEMetadata

    from tl_query_lens import ReadoutSAE, ReadoutSAEConfig
    from tl_query_lens.readout.sae import unembedding_rows

    d, V = model.cfg.d_model, model.cfg.d_vocab
    cfg = ReadoutSAEConfig(
        d_in=d,
        d_sae=d_sae,
        d_vocab=V,
        k=k,
        dtype="float32",
        device="cpu",
        metadata=SAEMetadata(
            model_name=model.cfg.model_name,
            hook_name="ln_final.hook_normalized",
            hook_layer=model.cfg.n_layers - 1,
            context_size=model.cfg.n_ctx,
        ),
    )
    sae = ReadoutSAE(cfg)
    rows = unembedding_rows(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(d, d_sae, generator=gen) / d**0.5)
        sae.b_enc.copy_(torch.randn(d_sae, generator=gen) * 0.1)
        W_dec = torch.randn(d_sae, d, generator=gen)
        sae.W_dec.copy_(W_dec / W_dec.norm(dim=1, keepdim=True))
        sae.b_dec.copy_(rows.mean(0))
    sae.store_codes(rows)
    return sae


def tiny_export_atlas(out, dictionary: tuple[str, ...], seq_len: int = 16):
    """A small atlas without signatures on the gelu_ln tiny model, for the export tests: (model, cfg, tokens, result)."""
    from tl_query_lens.atlas import AtlasConfig, build_atlas

    model = tiny_model("gelu_ln")
    cfg = AtlasConfig(
        out=out,
        dictionary=dictionary,
        n_tokens=40 * seq_len,
        seq_len=seq_len,
        shard_size=32,
        band_sample=8,
        signatures=False,
    )
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=seq_len)
    return model, cfg, tokens, build_atlas(model, None, cfg, tokens=tokens, progress=False)


def tiny_protocol_setup():
    """The external evaluation protocols' tests (SAELens, SAEBench): a tiny model, 6 × 10 tokens, a residual SAE whose
    reconstruction sits between clean and zero, and a transcoder the protocols must leave out."""
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=6, seq_len=10, seed=5)
    torch.manual_seed(1)
    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post", model_name="tiny")  # SAEBench reads the model name
    sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=48, metadata=meta))
    with torch.no_grad():
        sae.W_dec.mul_(0.2)  # a reconstruction between clean and zero, so CE recovered is informative
    tc = StandardSAE(
        StandardSAEConfig(d_in=32, d_sae=16, metadata=SAEMetadata(hook_name="blocks.1.ln2.hook_normalized"))
    )
    tc.cfg.metadata.hook_name_out = "blocks.1.hook_mlp_out"
    return model, tokens, {"sae": sae.eval(), "tc": tc.eval()}


def count_forwards(model, monkeypatch) -> list[int]:
    """Every forward call of ``model`` from the tokens from now on (``model(...)``, ``run_with_cache``,
    ``run_with_hooks``), by its token count: ``model.forward`` wrapped on the instance, apart from the hooks the
    estimate clock uses; calls from a residual stream (``start_at_layer``) are left out."""
    calls: list[int] = []
    real = model.forward

    def forward(tokens, *args, **kwargs):
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 2:
            calls.append(int(tokens.numel()))
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    return calls
