"""One key–value view of any sparse dictionary (docs/design.md §3): keys read, values write.

A feature i fires on ``a_i = act(⟨k_i, x⟩ + b_enc_i)`` at the read hook and adds ``a_i · v_i`` at the write hook.

Attention-output SAEs (``blocks.l.attn.hook_z``, all heads concatenated or one head with ``hook_head_index``) write in
head space. Given the model, the view maps them into the residual stream: values ``v_i = Σ_h W_dec[i, h] W_O[h]`` written
at ``blocks.l.hook_attn_out`` (b_dec likewise, plus ``b_O``), keys kept at ``hook_z`` (the engine's key operator to
``hook_z`` runs through the attention that produces it), one head's keys zero-padded to the full ``n_heads·d_head``.
SAELens' run-time input normalisation is folded where it is linear in the direction: ``expected_average_only_in`` is
folded into the weights by SAELens itself; ``layer_norm`` centres the input, so keys are centred; ``constant_norm_rescale``
and ``layer_norm`` also scale each token by a positive factor (the key direction is unchanged, ``activation`` says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from sae_lens import SAE
from transformer_lens import HookedTransformer

from tl_query_lens.errors import InputError, InputTypeError, check_ids
from tl_query_lens.hooks import check_hook, hook_dims, hook_layer, refuse_norm_after_only, residual_hook_of
from tl_query_lens.tensor_checks import check_dictionary_finite

_LINEAR_NORMS = {"none", "expected_average_only_in"}  # no per-token factor at run time
_SCALING_NORMS = {"constant_norm_rescale", "layer_norm"}  # a positive per-token factor on ⟨k, x⟩ and on the output


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
            (FF-KV of a block with a post-MLP norm, a hook_z SAE of a block with a post-attention norm: Gemma-2): the
            values are then no fixed residual directions.
        value_source: for such dictionaries, the hook before the norm where a change of feature i's activation is a
            fixed tangent (:meth:`source_tangents`): ``blocks.l.mlp.hook_post`` for a post-norm FF-KV,
            ``blocks.l.attn.hook_z`` for a hook_z SAE of a post-norm block. Value signatures push that tangent through
            the engine instead of ``v_i``. None: values are fixed directions.
        source_rows: the tangents at :attr:`value_source` when they are dense rows (a hook_z SAE's decoder rows in
            head space, ``[d_sae, n_heads·d_head]``, one head's zero-padded); None for FF-KV (one-hot tangents).
        parallel_blocks: the model's blocks run attention and MLP in parallel (set by ``as_key_value`` with a model):
            an attention write then enters at ``hook_resid_post`` (:attr:`value_hook`).
        post_norm_weight: the weight of the norm the values pass through before the write hook (``ln2_post`` for
            FF-KV, ``ln1_post`` for hook_z), which a weights-only readout (LL_VALUE) applies; None without one.
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
    head_index: int | None = None
    value_source: str | None = None
    parallel_blocks: bool = False
    source_rows: Float[torch.Tensor, "d_sae d_src"] | None = None
    post_norm_weight: Float[torch.Tensor, " d_out"] | None = None

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
        """Residual-stream hook where values enter (``hook_mlp_out`` of layer l → ``blocks.l.hook_resid_post``;
        ``hook_attn_out`` → ``hook_resid_mid``, or ``hook_resid_post`` for parallel blocks)."""
        return residual_hook_of(self.write_hook, parallel=self.parallel_blocks)

    def source_tangents(self, ids: Int[torch.Tensor, " n"]) -> Float[torch.Tensor, "n d_src"]:
        """Tangent at :attr:`value_source` of a unit change of each feature's activation, fp32.

        Post-norm FF-KV: the norm reads ``Σ_i a_i v_i + b_dec`` with ``v_i = W_out[i] / s_i`` and ``a_i = s_i ·
        hook_post_i`` (``s = act_scale``: 1 for vanilla/TopK, ‖W_out[i]‖ for normalized), so ``∂/∂a_i`` is the
        tangent ``e_i / s_i`` at ``mlp.hook_post`` (which ``W_out`` maps to ``v_i``). hook_z SAE of a post-norm
        block: ``z = Σ_i a_i W_dec[i] + b_dec`` in head space, so ``∂z/∂a_i`` is the decoder row ``W_dec[i]`` at
        ``attn.hook_z`` (which ``W_O`` maps to ``v_i``) — :attr:`source_rows`.
        """
        if self.value_source is None:
            raise ValueError("This dictionary's values are fixed directions (it has no source hook).")
        if self.source_rows is not None:
            return self.source_rows[ids.to(self.source_rows.device)].float()
        scale = self.dictionary.act_scale.detach().float()
        tangents = torch.zeros(len(ids), len(scale), device=scale.device)
        ids = ids.to(scale.device)
        tangents[torch.arange(len(ids), device=scale.device), ids] = 1.0 / scale[ids]
        return tangents

    def static_values(self, ids: Int[torch.Tensor, " n"]) -> Float[torch.Tensor, "n d_out"]:
        """The values as a weights-only readout (LL_VALUE) sees them, fp32: ``v_i``, times the post norm's weight
        when the write passes through one (its per-token factor and projection, which need a corpus, dropped)."""
        values = self.values[ids.to(self.values.device)].float()
        weight = self.post_norm_weight
        return values if weight is None else values * weight.detach().float().to(values.device)

    def encode(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """Feature activations, by the wrapped dictionary's own rule (``x`` as the read hook carries it)."""
        if self.dictionary is None or not hasattr(self.dictionary, "encode"):
            raise TypeError("This view wraps no dictionary with an encode method.")
        if x.ndim == 4 and self.head_index is not None:  # hook_z [batch, pos, head, d_head]: the SAE reads one head
            x = x[..., self.head_index, :]
        elif x.ndim == 4 and getattr(self.dictionary.cfg, "reshape_activations", "none") != "hook_z":
            x = x.flatten(-2)
        return self.dictionary.encode(x)

    def feature_ids(self, features: int | Sequence[int] | torch.Tensor | None) -> Int[torch.Tensor, " n"]:
        """Validate feature ids (None = all) and return them as a LongTensor: integers only (no floats, which would
        be truncated, no boolean masks, which would become ids 0 / 1), each in ``0..d_sae-1``."""
        if features is None:
            return torch.arange(self.d_sae)
        ids = check_ids(features, self.d_sae, f"Feature ids (of a dictionary of {self.d_sae} features)")
        return torch.tensor(ids, dtype=torch.long)


def _sae_activation(sae: SAE) -> str:
    arch = sae.cfg.architecture()
    if arch == "ffkv":
        return f"ffkv:{sae.cfg.mlp_kind}"
    return arch


def as_key_value(dictionary: Any, model: HookedTransformer | None = None) -> KeyValueView:
    """The key–value view of an SAELens SAE (standard, topk, jumprelu, gated, …), transcoder, FF-KV or readout SAE.

    Every tensor of the view is checked to be finite (the error names the dictionary and the tensor). With
    ``model``, the hooks are checked to exist and the widths to match (clear errors otherwise; SAELens' ``add_sae``
    silently skips an unknown hook).

    Build the view once per dictionary and pass it down: a view this function returned comes back as it is (no
    second finite check, no second one-token probe of the model it was checked for), as TransformerLens passes
    hook points rather than looking them up again. A view holds the dictionary's weights (shared storage), so build
    a new one after changing them out of place.
    """
    if isinstance(dictionary, KeyValueView):
        if _checked(dictionary, model):  # built (and checked) once, passed down: no second probe
            return dictionary
        view = dictionary
    elif isinstance(dictionary, SAE):
        view = _view_of_sae(dictionary)
        if view.read_hook.endswith("attn.hook_z") and model is not None:
            view = _through_W_O(view, model)
    else:
        raise InputTypeError(
            f"as_key_value accepts SAELens SAEs (incl. transcoders, FF-KV, readout SAEs) or a KeyValueView, "
            f"not {type(dictionary).__name__}."
        )
    check_dictionary_finite(
        view.dictionary if view.dictionary is not None else view,
        {"keys (W_enc)": view.keys, "values (W_dec)": view.values, "b_enc": view.b_enc, "b_dec": view.b_dec},
    )
    if model is not None:
        parallel = bool(getattr(model.cfg, "parallel_attn_mlp", False))
        if view.parallel_blocks != parallel:
            view = dataclasses.replace(view, parallel_blocks=parallel)
        validate_view(view, model)
    view.__dict__[_CHECKED] = (*_checked_models(view), model)
    return view


_CHECKED = "_checked_for"  # set by as_key_value on the view it returns; dataclasses.replace makes a view without it


def _checked_models(view: KeyValueView) -> tuple[Any, ...]:
    return view.__dict__.get(_CHECKED, ())


def _checked(view: KeyValueView, model: HookedTransformer | None) -> bool:
    """Whether ``as_key_value`` already checked this very view (finite; with ``model``: for that model)."""
    seen = _checked_models(view)
    return bool(seen) and (model is None or any(m is model for m in seen))


def _view_of_sae(sae: SAE) -> KeyValueView:
    read_hook = sae.cfg.metadata.hook_name
    if not read_hook:
        raise InputError("This SAE's cfg.metadata.hook_name is empty; set it to the hook the SAE reads.")
    write_hook = sae.cfg.metadata.hook_name_out or read_hook
    W_enc = sae.W_enc.detach()
    # Gated SAEs gate with b_gate; every other architecture has b_enc.
    b_enc = getattr(sae, "b_enc", None)
    if b_enc is None:
        b_enc = getattr(sae, "b_gate", None)
    b_enc = torch.zeros(W_enc.shape[1]) if b_enc is None else b_enc.detach()
    norm = getattr(sae.cfg, "normalize_activations", "none")
    if norm not in _LINEAR_NORMS | _SCALING_NORMS:
        raise NotImplementedError(
            f"normalize_activations={norm!r} is not linear in the input; the key-value view "
            f"supports {sorted(_LINEAR_NORMS | _SCALING_NORMS)}."
        )
    if getattr(sae.cfg, "apply_b_dec_to_input", False):
        b_enc = b_enc - sae.b_dec.detach() @ W_enc  # k·(x − b_dec) + b = k·x + (b − k·b_dec)
    keys = W_enc.T
    if norm == "layer_norm":  # k·(x − mean(x)) = (k − mean(k))·x
        keys = keys - keys.mean(-1, keepdim=True)
    activation = _sae_activation(sae) + (f"+{norm}" if norm in _SCALING_NORMS else "")
    post_norm = getattr(sae.cfg, "post_norm_eps", None)  # FF-KV of a block with a post-MLP norm (Gemma-2)
    post_norm_w = getattr(sae, "post_norm_w", None) if post_norm is not None else None
    head_index = getattr(sae.cfg.metadata, "hook_head_index", None)
    return KeyValueView(
        keys=keys,
        values=sae.W_dec.detach(),
        b_enc=b_enc,
        b_dec=sae.b_dec.detach(),
        activation=activation,
        read_hook=read_hook,
        write_hook=write_hook,
        dictionary=sae,
        fixed_values=post_norm is None,
        head_index=None if head_index is None else int(head_index),
        value_source=None if post_norm is None else f"blocks.{hook_layer(write_hook)}.mlp.hook_post",
        post_norm_weight=None if post_norm_w is None else post_norm_w.detach(),
    )


def _through_W_O(view: KeyValueView, model: HookedTransformer) -> KeyValueView:
    """A ``hook_z`` view in the residual stream: values and b_dec through ``W_O`` (+ ``b_O``), written at
    ``hook_attn_out``; one head's keys zero-padded to the concatenated ``hook_z`` width.

    On a block with a norm after attention (Gemma-2 ``ln1_post``) ``hook_attn_out`` is that norm of ``Σ a_i v_i + b``,
    so the values are no fixed residual directions: the view then names ``attn.hook_z`` as the value source, with the
    head-space decoder rows (one head's zero-padded) as its tangents (:meth:`KeyValueView.source_tangents`)."""
    refuse_norm_after_only(model, "Mapping a hook_z SAE through W_O")
    layer = hook_layer(view.read_hook)
    assert layer is not None  # a hook_z view reads blocks.L.attn.hook_z
    attn = model.blocks[layer].attn
    W_O = attn.W_O.detach().float()  # [n_heads, d_head, d_model]
    n_heads, d_head, _ = W_O.shape
    keys, values, b_dec = view.keys.float(), view.values.float(), view.b_dec.float()
    if view.head_index is not None:
        if not 0 <= view.head_index < n_heads or view.d_in != d_head:
            raise ValueError(
                f"hook_head_index={view.head_index} with d_in={view.d_in} does not fit layer {layer}'s "
                f"{n_heads} heads of width {d_head}."
            )
        h = view.head_index
        keys, rows = (_pad_head(x, h, n_heads) for x in (keys, values))
        values = values @ W_O[h].to(values.device)
        b_dec = b_dec @ W_O[h].to(values.device)
    else:
        if view.d_in != n_heads * d_head:
            raise ValueError(
                f"A hook_z SAE of layer {layer} reads n_heads·d_head = {n_heads * d_head} values, not "
                f"{view.d_in}; for one head set cfg.metadata.hook_head_index."
            )
        rows = values
        values = torch.einsum("fhd,hdm->fm", values.reshape(-1, n_heads, d_head), W_O.to(values.device))
        b_dec = torch.einsum("hd,hdm->m", b_dec.reshape(n_heads, d_head), W_O.to(values.device))
    b_dec = b_dec + attn.b_O.detach().float().to(b_dec.device)
    post_norm = bool(getattr(model.cfg, "use_normalization_before_and_after", False))
    norm_weight = getattr(model.blocks[layer].ln1_post, "w", None) if post_norm else None
    return dataclasses.replace(
        view,
        keys=keys,
        values=values,
        b_dec=b_dec,
        write_hook=f"blocks.{layer}.hook_attn_out",
        fixed_values=not post_norm,
        value_source=view.read_hook if post_norm else None,
        source_rows=rows if post_norm else None,
        post_norm_weight=None if norm_weight is None else norm_weight.detach(),
    )


def _pad_head(rows: torch.Tensor, head: int, n_heads: int) -> torch.Tensor:
    """``[n, d_head]`` rows of one head placed in the concatenated ``[n, n_heads·d_head]`` hook_z basis."""
    padded = torch.zeros(rows.shape[0], n_heads, rows.shape[1], device=rows.device, dtype=rows.dtype)
    padded[:, head] = rows
    return padded.flatten(1)


def validate_view(view: KeyValueView, model: HookedTransformer) -> None:
    """Raise a clear error if a view's hooks are missing from ``model`` or its widths do not match them."""
    hooks = list(dict.fromkeys([view.read_hook, view.write_hook]))
    for name in hooks:
        check_hook(model, name)
    dims = hook_dims(model, hooks)
    if dims[view.read_hook] != view.d_in:
        raise InputError(
            f"d_in mismatch: the dictionary reads {view.d_in}-dim vectors but {view.read_hook} carries "
            f"{dims[view.read_hook]} (check cfg.d_in and cfg.metadata.hook_name; hook_z SAEs need reshape_activations)."
        )
    if dims[view.write_hook] != view.d_out:
        raise InputError(
            f"d_out mismatch: the dictionary writes {view.d_out}-dim vectors but {view.write_hook} carries "
            f"{dims[view.write_hook]} (check the decoder width and cfg.metadata.hook_name_out)."
        )
