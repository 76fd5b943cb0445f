"""One key–value view of any sparse dictionary (DESIGN §3): keys read, values write.

A feature i fires on ``a_i = act(⟨k_i, x⟩ + b_enc_i)`` at the read hook and adds ``a_i · v_i`` at the write hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from sae_lens import SAE
from transformer_lens import HookedTransformer

from tl_query_lens.hooks import check_hook, hook_dims, hook_layer, residual_hook_of


@dataclass
class KeyValueView:
    """Keys ``[d_sae, d_in]`` (encoder columns), values ``[d_sae, d_out]`` (decoder rows) and where they act.

    Attributes:
        keys: encoder directions; row i is k_i.
        values: decoder directions; row i is v_i.
        b_enc: effective encoder bias (b_dec subtraction folded in where the SAE applies it).
        b_dec: decoder bias, added once to every reconstruction.
        activation: the activation rule, e.g. ``"relu"``, ``"topk"``, ``"jumprelu"``, ``"gated"``, ``"ffkv:swiglu"``.
        read_hook: hook whose activation the keys read.
        write_hook: hook the reconstruction replaces.
        dictionary: the wrapped object (its ``encode`` gives activations).
        fixed_values: False when the decoder passes ``Σ a_i v_i`` through a per-token norm before the write hook
            (FF-KV of a block with a post-MLP norm, Gemma-2): the values are then no fixed residual directions.
    """

    keys: Float[torch.Tensor, "d_sae d_in"]
    values: Float[torch.Tensor, "d_sae d_out"]
    b_enc: Float[torch.Tensor, " d_sae"]
    b_dec: Float[torch.Tensor, " d_out"]
    activation: str
    read_hook: str
    write_hook: str
    dictionary: Any = None
    fixed_values: bool = True

    @property
    def d_sae(self) -> int:
        return int(self.keys.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.keys.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.values.shape[1])

    @property
    def layer(self) -> int | None:
        """Layer of the read hook."""
        return hook_layer(self.read_hook)

    @property
    def value_hook(self) -> str:
        """Residual-stream hook where values enter (``hook_mlp_out`` of layer l → ``blocks.l.hook_resid_post``)."""
        return residual_hook_of(self.write_hook)

    def encode(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """Feature activations, by the wrapped dictionary's own rule."""
        if self.dictionary is None or not hasattr(self.dictionary, "encode"):
            raise TypeError("This view wraps no dictionary with an encode method.")
        return self.dictionary.encode(x)

    def feature_ids(self, features: int | Sequence[int] | torch.Tensor | None) -> Int[torch.Tensor, " n"]:
        """Validate feature ids (None = all) and return them as a LongTensor."""
        if features is None:
            return torch.arange(self.d_sae)
        ids = torch.as_tensor(features, dtype=torch.long).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.d_sae)]
        if bad.numel():
            raise IndexError(
                f"Feature ids {bad.tolist()[:10]} are out of range for a dictionary of {self.d_sae} features "
                f"(valid: 0..{self.d_sae - 1})."
            )
        return ids


def _sae_activation(sae: SAE) -> str:
    arch = sae.cfg.architecture()
    if arch == "ffkv":
        return f"ffkv:{sae.cfg.mlp_kind}"
    return arch


def as_key_value(dictionary: Any, model: HookedTransformer | None = None) -> KeyValueView:
    """The key–value view of an SAELens SAE (standard, topk, jumprelu, gated, …), transcoder, FF-KV or readout SAE.

    With ``model``, the hooks are checked to exist and the widths to match (clear errors otherwise; SAELens'
    ``add_sae`` silently skips an unknown hook).
    """
    if isinstance(dictionary, KeyValueView):
        view = dictionary
    elif isinstance(dictionary, SAE):
        view = _view_of_sae(dictionary)
    else:
        raise TypeError(
            f"as_key_value accepts SAELens SAEs (incl. transcoders, FF-KV, readout SAEs) or a KeyValueView, "
            f"not {type(dictionary).__name__}."
        )
    if model is not None:
        validate_view(view, model)
    return view


def _view_of_sae(sae: SAE) -> KeyValueView:
    read_hook = sae.cfg.metadata.hook_name
    if not read_hook:
        raise ValueError("This SAE's cfg.metadata.hook_name is empty; set it to the hook the SAE reads.")
    write_hook = sae.cfg.metadata.hook_name_out or read_hook
    W_enc = sae.W_enc.detach()
    # Gated SAEs gate with b_gate; every other architecture has b_enc.
    b_enc = getattr(sae, "b_enc", None)
    if b_enc is None:
        b_enc = getattr(sae, "b_gate", None)
    b_enc = torch.zeros(W_enc.shape[1]) if b_enc is None else b_enc.detach()
    if getattr(sae.cfg, "apply_b_dec_to_input", False):
        b_enc = b_enc - sae.b_dec.detach() @ W_enc  # k·(x − b_dec) + b = k·x + (b − k·b_dec)
    return KeyValueView(
        keys=W_enc.T,
        values=sae.W_dec.detach(),
        b_enc=b_enc,
        b_dec=sae.b_dec.detach(),
        activation=_sae_activation(sae),
        read_hook=read_hook,
        write_hook=write_hook,
        dictionary=sae,
        fixed_values=getattr(sae.cfg, "post_norm_eps", None) is None,
    )


def validate_view(view: KeyValueView, model: HookedTransformer) -> None:
    """Raise a clear error if a view's hooks are missing from ``model`` or its widths do not match them."""
    hooks = list(dict.fromkeys([view.read_hook, view.write_hook]))
    for name in hooks:
        check_hook(model, name)
    dims = hook_dims(model, hooks)
    if dims[view.read_hook] != view.d_in:
        raise ValueError(
            f"d_in mismatch: the dictionary reads {view.d_in}-dim vectors but {view.read_hook} carries "
            f"{dims[view.read_hook]} (check cfg.d_in and cfg.metadata.hook_name; hook_z SAEs need reshape_activations)."
        )
    if dims[view.write_hook] != view.d_out:
        raise ValueError(
            f"d_out mismatch: the dictionary writes {view.d_out}-dim vectors but {view.write_hook} carries "
            f"{dims[view.write_hook]} (check the decoder width and cfg.metadata.hook_name_out)."
        )
