"""FF-KV: a transformer MLP's key–value memories as a training-free SAELens dictionary (docs/design.md §3, arXiv 2510.22332).

GELU MLP: a = act(x W_in + b_in); SwiGLU: a = silu(x W_gate) ⊙ (x W_in) + b_in (TL ``mlp.hook_post``; TL adds
the gated MLP's b_in after the product, zero for Llama-style models);
value i = row i of W_out, b_dec = b_out. x is read at ``blocks.l.ln2.hook_normalized``, which TransformerLens takes
*before* the norm's own weight and bias, so those are folded into the keys: x·diag(w)·W + b_ln·W.
It is a transcoder: it reads the MLP input and writes ``blocks.l.hook_mlp_out``.
Blocks with a norm after the MLP (Gemma-2's ``ln2_post``, ``use_normalization_before_and_after``) write
``RMS(a W_out + b_out)·w_post`` to ``hook_mlp_out``; the dictionary applies the same norm in ``decode``, so the vanilla
splice stays exact, but its values then pass through a per-token norm and are no fixed residual directions. Query Lens
therefore defines a feature's value effect there as the corpus-mean Jacobian of a unit change of its activation: the
tangent ``e_i / act_scale_i`` at ``blocks.l.mlp.hook_post`` (``KeyValueView.value_source`` / ``source_tangents``),
pushed by the engine through ``W_out``, ``ln2_post`` and everything downstream (see ``QueryLens._source_terms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from sae_lens import SAE, SAEConfig, register_sae_class
from sae_lens.registry import SAE_CLASS_REGISTRY
from sae_lens.saes.sae import SAEMetadata
from torch import nn
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from tl_query_lens.hooks import refuse_norm_after_only
from tl_query_lens.primitives import topk_mask

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": tl_utils.gelu_new,
    "gelu_fast": tl_utils.gelu_fast,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass
class FFKVSAEConfig(SAEConfig):
    """Config of an FF-KV dictionary.

    Attributes:
        d_out: width of the write hook (d_model).
        mlp_kind: ``"standard"`` (act(x W_in + b_in)) or ``"gated"`` (SwiGLU-style).
        act_fn: TransformerLens activation name of the MLP.
        variant: ``"vanilla"`` (all activations; exact), ``"topk"`` (keep k), ``"normalized"`` (unit-norm values,
            activations scaled by ‖v_i‖; reconstruction unchanged; optional k).
        k: number of features kept by TopK (required for ``"topk"``).
        topk_by: ``"magnitude"`` keeps the k largest |a_i| with their sign (SwiGLU activations are signed);
            ``"value"`` keeps the k largest a_i.
    """

    d_out: int = 0
    mlp_kind: Literal["standard", "gated"] = "standard"
    act_fn: str = "gelu"
    variant: Literal["vanilla", "topk", "normalized"] = "vanilla"
    k: int | None = None
    topk_by: Literal["magnitude", "value"] = "magnitude"
    apply_b_dec_to_input: bool = False
    post_norm_eps: float | None = None

    @classmethod
    def architecture(cls) -> str:
        return "ffkv"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.apply_b_dec_to_input:
            raise ValueError("FF-KV is a transcoder: apply_b_dec_to_input must be False.")
        if self.d_out <= 0:
            raise ValueError("FFKVSAEConfig.d_out must be the write hook's width (d_model).")
        if self.mlp_kind not in ("standard", "gated"):
            raise ValueError(f"mlp_kind must be 'standard' or 'gated', got {self.mlp_kind!r}.")
        if self.act_fn not in ACTIVATIONS:
            raise ValueError(f"Unsupported MLP activation {self.act_fn!r}; supported: {sorted(ACTIVATIONS)}.")
        if self.variant not in ("vanilla", "topk", "normalized"):
            raise ValueError(f"variant must be 'vanilla', 'topk' or 'normalized', got {self.variant!r}.")
        if self.topk_by not in ("magnitude", "value"):
            raise ValueError(f"topk_by must be 'magnitude' or 'value', got {self.topk_by!r}.")
        if self.variant == "topk" and self.k is None:
            raise ValueError("variant='topk' needs k (the number of features kept per token).")
        if self.variant == "vanilla" and self.k is not None:
            raise ValueError("variant='vanilla' keeps every activation; use variant='topk' to set k.")
        if self.k is not None and not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae={self.d_sae}, got {self.k}.")

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict()


class FFKVSAE(SAE[FFKVSAEConfig]):
    """FF-KV dictionary; ``encode`` gives MLP activations (scaled by ‖v_i‖ when normalized), ``decode`` the MLP output."""

    W_enc: nn.Parameter
    b_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    act_scale: nn.Parameter

    def initialize_weights(self) -> None:
        cfg, kw = self.cfg, {"dtype": self.dtype, "device": self.device}
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_out, **kw))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_out, **kw))
        self.act_scale = nn.Parameter(torch.ones(cfg.d_sae, **kw))
        if cfg.mlp_kind == "gated":
            self.W_enc_lin = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
            self.b_enc_lin = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
            self.b_post = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        if cfg.post_norm_eps is not None:
            self.post_norm_w = nn.Parameter(torch.ones(cfg.d_out, **kw))

    def get_activation_fn(self):
        return ACTIVATIONS[self.cfg.act_fn]

    def process_sae_in(self, sae_in: torch.Tensor) -> torch.Tensor:
        # A transcoder: b_dec lives in the output space and is never subtracted from the input.
        return self.hook_sae_input(sae_in.to(self.dtype))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """a_i(x) (× ‖v_i‖ for the normalized variant), TopK-sparsified when k is set."""
        sae_in = self.process_sae_in(x)
        hidden_pre = self.hook_sae_acts_pre(sae_in @ self.W_enc + self.b_enc)
        acts = self.activation_fn(hidden_pre)
        if self.cfg.mlp_kind == "gated":
            acts = acts * (sae_in @ self.W_enc_lin + self.b_enc_lin) + self.b_post
        acts = acts * self.act_scale
        if self.cfg.k is not None:
            acts = topk_mask(acts, self.cfg.k, by=self.cfg.topk_by)
        return self.hook_sae_acts_post(acts)

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        out = feature_acts @ self.W_dec + self.b_dec
        if self.cfg.post_norm_eps is not None:  # the block's RMS norm after the MLP (Gemma-2 ln2_post)
            out = out * (out.pow(2).mean(-1, keepdim=True) + self.cfg.post_norm_eps).rsqrt() * self.post_norm_w
        return self.hook_sae_recons(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP output reconstructed from its input. Like SAELens' ``Transcoder``, a standalone forward neither
        adds an error term nor fires ``hook_sae_output`` (the true output lives at another hook); spliced into a
        ``HookedSAETransformer`` the wrapper adds the error term and fires ``hook_sae_error``/``hook_sae_output``."""
        return self.decode(self.encode(x))

    @property
    def d_out(self) -> int:
        return self.cfg.d_out

    @torch.no_grad()
    def fold_and_get_W_dec_norm(self) -> torch.Tensor:
        """Give every value row unit norm and move its norm into ``act_scale`` (so ``fold_W_dec_norm`` is exact).

        SAELens' default fold scales ``W_enc``/``b_enc``, which is only exact for a positively homogeneous
        activation (ReLU); FF-KV's GELU/SiLU and the gated product are not. Here the norm multiplies the activation
        after the nonlinearity instead, so a_i·v_i is unchanged: the result is the ``"normalized"`` variant.
        A TopK variant ranks the activations, so rescaling them would change which k survive: it folds only when
        its value rows are already unit-norm (``variant="normalized"``, a no-op) and raises otherwise.
        """
        norms = self.get_W_dec_norm()
        if self.cfg.k is not None:
            if (norms - 1).abs().max().item() > 1e-6:
                raise NotImplementedError(
                    f"fold_W_dec_norm would change which features this TopK FF-KV keeps (variant={self.cfg.variant!r}"
                    f" ranks activations by {self.cfg.topk_by} before the value norms): it cannot be folded exactly. "
                    "Build FFKV.from_model(model, layer, 'normalized', k=...) for unit-norm values (it ranks "
                    "a_i·‖v_i‖, a different dictionary), or load without fold_W_dec_norm=True."
                )
            return norms  # already unit-norm: folding is the identity
        self.W_dec.data.div_(norms[:, None])
        self.act_scale.data.mul_(norms)
        self.cfg.variant = "normalized"
        return norms

    @torch.no_grad()
    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """Fold a constant input scale s: afterwards ``sae(x) == original(s·x) / s`` (SAELens' convention).
        The gated variant's second input projection reads the input too, so it is scaled with ``W_enc``."""
        super().fold_activation_norm_scaling_factor(scaling_factor)
        if self.cfg.mlp_kind == "gated":
            self.W_enc_lin.data *= scaling_factor


def mlp_read_hook(model: HookedTransformer, layer: int) -> str:
    """The hook carrying layer ``layer``'s MLP input (before the norm's weight, which FF-KV folds into its keys)."""
    if model.cfg.normalization_type is None:  # parallel blocks: the MLP reads the block input
        return f"blocks.{layer}.{'hook_resid_pre' if model.cfg.parallel_attn_mlp else 'hook_resid_mid'}"
    return f"blocks.{layer}.ln2.hook_normalized"


class FFKV:
    """Builders for FF-KV dictionaries."""

    @staticmethod
    @torch.no_grad()
    def from_model(
        model: HookedTransformer,
        layer: int,
        variant: Literal["vanilla", "topk", "normalized"] = "vanilla",
        k: int | None = None,
        *,
        topk_by: Literal["magnitude", "value"] = "magnitude",
    ) -> FFKVSAE:
        """FF-KV of ``model``'s MLP at ``layer`` as an SAELens SAE (a transcoder; see module docstring)."""
        n_layers = model.cfg.n_layers
        if not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise IndexError(f"Layer {layer} is out of range; this model has layers 0..{n_layers - 1}.")
        cfg = model.cfg
        if cfg.attn_only:
            raise ValueError("This model is attention-only: it has no MLP to read key-value memories from.")
        if cfg.act_fn not in ACTIVATIONS:
            raise ValueError(f"FF-KV supports MLP activations {sorted(ACTIVATIONS)}, not {cfg.act_fn!r}.")
        refuse_norm_after_only(model, "FF-KV")
        block = model.blocks[layer]
        mlp: Any = block.mlp  # MLP or GatedMLP (W_gate)
        ln = getattr(block, "ln2", None)
        w_ln = getattr(ln, "w", None)
        b_ln = getattr(ln, "b", None)
        d_model = cfg.d_model
        w_ln = torch.ones(d_model, device=mlp.W_in.device) if w_ln is None else w_ln.detach()
        b_ln = torch.zeros(d_model, device=mlp.W_in.device) if b_ln is None else b_ln.detach()
        gated = bool(cfg.gated_mlp)
        post_norm = getattr(block, "ln2_post", None) if cfg.use_normalization_before_and_after else None
        if post_norm is not None and not hasattr(post_norm, "w"):
            raise NotImplementedError(
                f"FF-KV supports RMS post-MLP norms with a weight, not {type(post_norm).__name__}."
            )
        W_in = mlp.W_in.detach().float()
        b_in = mlp.b_in.detach().float()
        W_key = mlp.W_gate.detach().float() if gated else W_in
        b_key = b_ln.float() @ W_key + (torch.zeros_like(b_in) if gated else b_in)

        W_out = mlp.W_out.detach().float()
        act_scale = torch.ones(W_out.shape[0], device=W_out.device)  # [d_mlp]
        if variant == "normalized":
            act_scale = W_out.norm(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
            W_out = W_out / act_scale[:, None]

        sae_cfg = FFKVSAEConfig(
            d_in=d_model,
            d_sae=cfg.d_mlp,
            d_out=d_model,
            mlp_kind="gated" if gated else "standard",
            act_fn=cfg.act_fn,
            variant=variant,
            k=k,
            topk_by=topk_by,
            post_norm_eps=None if post_norm is None else float(post_norm.eps),
            dtype="float32",
            device=str(W_out.device),
            metadata=SAEMetadata(
                model_name=cfg.model_name,
                hook_name=mlp_read_hook(model, layer),
                hook_name_out=f"blocks.{layer}.hook_mlp_out",
                hook_layer=layer,
                hook_layer_out=layer,
                prepend_bos=cfg.default_prepend_bos,
                context_size=cfg.n_ctx,
            ),
        )
        sae = FFKVSAE(sae_cfg)
        sae.W_enc.copy_(w_ln.float()[:, None] * W_key)
        sae.b_enc.copy_(b_key)
        sae.W_dec.copy_(W_out)
        sae.b_dec.copy_(mlp.b_out.detach().float())
        sae.act_scale.copy_(act_scale)
        if post_norm is not None:
            sae.post_norm_w.copy_(post_norm.w.detach().float())
        if gated:
            sae.W_enc_lin.copy_(w_ln.float()[:, None] * W_in)
            sae.b_enc_lin.copy_(b_ln.float() @ W_in)
            sae.b_post.copy_(b_in)
        return sae


if "ffkv" not in SAE_CLASS_REGISTRY:
    register_sae_class("ffkv", FFKVSAE, FFKVSAEConfig)
