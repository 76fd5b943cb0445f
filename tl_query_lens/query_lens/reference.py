"""The paper's per-feature Query Lens, written plainly: chained JVP / VJP block by block for ONE feature.

This is the independent reference the engine is tested and benchmarked against (arXiv 2606.07617 §3; docs/design.md §5).
It shares no code with ``tl_query_lens.operators``: it rebuilds the clean residual stream by calling
``model.embed`` / ``model.pos_embed`` / ``model.blocks[k]`` itself and pushes ONE tangent (value side) or ONE cotangent
(key side) through the blocks with ``torch.func.jvp`` / ``torch.func.vjp``. Cost per feature ≈ (L − l) block JVPs
(value) plus l block VJPs (key) over the whole corpus — the cost the engine's operators amortise over all features.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch.func import jvp, vjp
from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.hooks import hook_layer

_RESID = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")


def _parse(hook: str) -> tuple[int, str]:
    parts = hook.split(".")
    if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise NotImplementedError(f"The reference handles blocks.l.* hooks, not {hook!r}.")
    return int(parts[1]), ".".join(parts[2:])


def clean_stream(model: HookedTransformer, tokens: Int[torch.Tensor, "batch pos"]) -> list[torch.Tensor]:
    """``[resid_pre_0, …, resid_pre_{L-1}, resid_post_{L-1}]`` from the model's own pieces (no hooks, no cache)."""
    tokens = tokens.to(model.cfg.device)
    x = model.embed(tokens)
    if model.cfg.positional_embedding_type == "standard":
        x = x + model.pos_embed(tokens)
    elif model.cfg.positional_embedding_type != "rotary":
        raise NotImplementedError(f"positional_embedding_type={model.cfg.positional_embedding_type!r}")
    stream = [x]
    for block in model.blocks:
        x = block(x)
        stream.append(x)
    return stream


def attn_update(block, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
    """Block k's attention write ``R_A(x) = attn(ln1(x))`` (what ``hook_attn_out`` carries)."""
    normed = block.ln1(x)
    out = block.attn(query_input=normed, key_input=normed, value_input=normed)
    return block.ln1_post(out) if block.cfg.use_normalization_before_and_after else out  # Gemma-2 post-norm


def mlp_update(block, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
    """Block k's MLP write ``R_M(x) = mlp(ln2(x))`` (what ``hook_mlp_out`` carries)."""
    out = block.mlp(block.ln2(x))
    return block.ln2_post(out) if block.cfg.use_normalization_before_and_after else out  # Gemma-2 post-norm


def mlp_input(block, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
    """The residual block k's MLP reads: ``resid_mid = x + R_A(x)``, or the block input ``x`` for parallel blocks."""
    return x if block.cfg.parallel_attn_mlp else x + attn_update(block, x)


def _captured(hook_point, run) -> torch.Tensor:
    """The value ``hook_point`` carries while ``run()`` executes, captured by a temporary torch forward hook."""
    grabbed: dict[str, torch.Tensor] = {}
    handle = hook_point.register_forward_hook(lambda module, args, out: grabbed.__setitem__("x", out))
    try:
        run()
    finally:
        handle.remove()
    return grabbed["x"]


def _read_function(model: HookedTransformer, read_hook: str):
    """``(start_index, f)``: the hook's value as a function of ``resid_pre_l`` (``stream[l]``)."""
    layer, name = _parse(read_hook)
    block = model.blocks[layer]

    functions = {
        "hook_resid_pre": lambda x: x,
        "hook_resid_post": lambda x: block(x),
        "ln1.hook_normalized": lambda x: _captured(block.ln1.hook_normalized, lambda: block.ln1(x)),
        "ln2.hook_normalized": lambda x: _captured(block.ln2.hook_normalized, lambda: block.ln2(mlp_input(block, x))),
        "attn.hook_z": lambda x: _captured(block.attn.hook_z, lambda: attn_update(block, x)),
        "hook_attn_out": lambda x: attn_update(block, x),
    }
    if not block.cfg.parallel_attn_mlp:
        functions["hook_resid_mid"] = lambda x: x + attn_update(block, x)
    if name not in functions:
        raise NotImplementedError(f"The reference reads {sorted(functions)} of a block, not {name!r}.")
    return layer, functions[name]


def _valid(tokens: torch.Tensor, skip_positions: int) -> torch.Tensor:
    mask = torch.zeros(tokens.shape, device=tokens.device)
    mask[:, skip_positions:] = 1.0
    return mask


def _final_norm(model: HookedTransformer, direction: Float[torch.Tensor, " d_model"]) -> torch.Tensor:
    return model.ln_final(direction[None, None])[0, 0]  # the final norm applied to the direction itself


def mlp_write_tangent(
    model: HookedTransformer, stream: list[torch.Tensor], layer: int, tangent: Float[torch.Tensor, " d_mlp"]
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Per-token tangent of block ``layer``'s MLP write (``hook_mlp_out``) for ``tangent`` added at every position of
    its ``mlp.hook_post``: one JVP of ``p ↦ ln2_post(p W_out + b_out)`` at the clean activations (post-norm blocks)."""
    block = model.blocks[layer]
    x = mlp_input(block, stream[layer])
    post = _captured(block.mlp.hook_post, lambda: block.mlp(block.ln2(x)))
    mlp: Any = block.mlp

    def write(p: torch.Tensor) -> torch.Tensor:
        out = p @ mlp.W_out + mlp.b_out
        return block.ln2_post(out) if block.cfg.use_normalization_before_and_after else out

    out = jvp(write, (post,), (tangent.to(post.dtype).expand_as(post).contiguous(),))[1]
    return out


def attn_write_tangent(
    model: HookedTransformer, stream: list[torch.Tensor], layer: int, tangent: Float[torch.Tensor, " n_heads_d_head"]
) -> Float[torch.Tensor, "batch pos d_model"]:
    """Per-token tangent of block ``layer``'s attention write (``hook_attn_out``) for ``tangent`` (concatenated heads)
    added at every position of its ``attn.hook_z``: one JVP of ``z ↦ ln1_post(Σ_h z_h W_O[h] + b_O)`` at the clean
    ``z`` (post-norm blocks)."""
    block = model.blocks[layer]
    z = _captured(block.attn.hook_z, lambda: attn_update(block, stream[layer]))
    attn = block.attn

    def write(z: torch.Tensor) -> torch.Tensor:
        out = torch.einsum("bphd,hdm->bpm", z, attn.W_O) + attn.b_O
        return block.ln1_post(out) if block.cfg.use_normalization_before_and_after else out

    out = jvp(write, (z,), (tangent.to(z.dtype).reshape(z.shape[2:]).expand_as(z).contiguous(),))[1]
    return out


def value_direction(
    model: HookedTransformer, stream: list[torch.Tensor], hook: str, v: torch.Tensor, mask: torch.Tensor, method: str
) -> Float[torch.Tensor, " d_model"]:
    """``M_l v`` (full: chained JVPs to the final residual) or ``v + Σ_k (J̄_A^k + J̄_M^k) v`` (first-order).

    ``v`` is one direction ``[d_model]`` at every position, or (full only) a per-token tangent ``[batch, pos, d_model]``.
    """
    layer, name = _parse(hook)
    if name not in _RESID:
        raise NotImplementedError(f"Values enter the residual stream; {hook!r} is not a residual hook.")
    tangent = v.expand_as(stream[0]).contiguous()
    n_valid = mask.sum()

    def mean(t):
        return (t * mask[..., None]).sum((0, 1)) / n_valid

    # modules downstream of the hook, in order: (kind, block index)
    first_block = layer + 1 if name == "hook_resid_post" else layer
    modules = [] if name != "hook_resid_mid" else [("mlp", layer)]
    start_attn = first_block if name != "hook_resid_mid" else layer + 1
    for k in range(start_attn, model.cfg.n_layers):
        modules += [("attn", k), ("mlp", k)]
    if method == "first_order":
        total = v.clone()
        for kind, k in modules:
            block = model.blocks[k]
            if kind == "attn":
                x_in = stream[k]
                out = jvp(lambda x, b=block: attn_update(b, x), (x_in,), (tangent,))[1]
            else:
                x_in = mlp_input(block, stream[k])
                out = jvp(lambda x, b=block: mlp_update(b, x), (x_in,), (tangent,))[1]
            total = total + mean(out)
        return total
    if method != "full":
        raise ValueError(f"method must be 'full' or 'first_order', not {method!r}.")
    if name == "hook_resid_mid":  # finish block `layer` from its resid_mid: x_mid + R_M(x_mid)
        block = model.blocks[layer]
        x_mid = stream[layer] + attn_update(block, stream[layer])
        tangent = jvp(lambda x: x + mlp_update(block, x), (x_mid,), (tangent,))[1]
    for k in range(start_attn, model.cfg.n_layers):
        tangent = jvp(model.blocks[k], (stream[k],), (tangent,))[1]
    return mean(tangent)


def key_gradient(
    model: HookedTransformer, stream: list[torch.Tensor], read_hook: str, key: torch.Tensor, mask: torch.Tensor
) -> Float[torch.Tensor, " d_model"]:
    """``ḡ = N_lᵀ k``: cotangent ``k`` at every valid position of the read hook, pulled back block by block to the
    token embeddings and summed over positions, divided by |T|."""
    layer, read = _read_function(model, read_hook)
    out, pull = vjp(read, stream[layer])[:2]
    cot = key.expand_as(out.flatten(2) if out.ndim == 4 else out) * mask[..., None]
    (cot,) = pull(cot.reshape(out.shape))
    for k in reversed(range(layer)):
        pull = vjp(model.blocks[k], stream[k])[1]
        (cot,) = pull(cot)
    return cot.sum((0, 1)) / mask.sum()  # ∂resid_pre_0/∂embed = I (positions are added, or rotary)


def query_lens_reference(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    dictionary: Any,
    feature: int,
    side: Literal["value", "key"] = "value",
    *,
    method: Literal["full", "first_order"] = "full",
    skip_positions: int = 0,
    clean: list[torch.Tensor] | None = None,
) -> Float[torch.Tensor, " d_vocab"]:
    """Full-vocabulary Query Lens scores of ONE feature, computed per feature (docs/design.md §5).

    value/full: ``s = W_U·LN_f(M_l v) + b_U``; value/first_order: ``s = W_U·LN_f(v + Σ_{k>l}(J̄_A^k + J̄_M^k) v)``;
    a post-norm FF-KV (``view.value_source``) pushes ``e_i / act_scale_i`` from ``mlp.hook_post`` instead of ``v``,
    a hook_z SAE of a post-norm block its head-space decoder row from ``attn.hook_z`` (first-order: ``v`` = the corpus
    mean of the per-token write tangent);
    key: ``s_t = ⟨N_lᵀ k, (e_t − c)/‖e_t − c‖⟩`` with c the mean embedding of the valid corpus tokens.
    LN_f is ``model.ln_final`` applied to the direction itself (not linearised). ``clean`` may pass the clean
    residual stream of ``tokens`` (:func:`clean_stream`) so a loop over features does not recompute it.
    """
    view = as_key_value(dictionary, model)
    (index,) = view.feature_ids([feature]).tolist()
    mask = _valid(tokens, skip_positions).to(model.cfg.device)
    with torch.no_grad():
        stream = [x.detach() for x in (clean if clean is not None else clean_stream(model, tokens))]
        if side == "value":
            v = view.values[index].to(model.cfg.dtype)
            if view.value_source is not None:  # post-norm block: a unit activation change at the source hook
                layer = hook_layer(view.write_hook)
                assert layer is not None  # post-norm writes are block hooks
                if view.value_source.endswith("attn.hook_z"):  # hook_z SAE: its head-space decoder row
                    row = view.source_rows[index].to(model.cfg.device)  # type: ignore[index]
                    v = attn_write_tangent(model, stream, layer, row)  # per token
                else:  # FF-KV: e_i / act_scale_i at mlp.hook_post
                    tangent = torch.zeros(view.d_sae, device=model.cfg.device, dtype=model.cfg.dtype)
                    tangent[index] = 1.0 / float(view.dictionary.act_scale[index])
                    v = mlp_write_tangent(model, stream, layer, tangent)  # per token
                if method == "first_order":
                    v = (v * mask[..., None]).sum((0, 1)) / mask.sum()  # the direct term: its corpus mean
            direction = value_direction(model, stream, view.value_hook, v, mask, method)
            scores = _final_norm(model, direction) @ model.W_U
            return scores + model.b_U if method == "full" else scores
        if side != "key":
            raise ValueError(f"side must be 'value' or 'key', not {side!r}.")
        g = key_gradient(model, stream, view.read_hook, view.keys[index].to(model.cfg.dtype), mask)
        W_E = model.W_E
        c = W_E[tokens[:, skip_positions:].reshape(-1).to(W_E.device)].mean(0)
        centred = W_E - c
        return (centred / centred.norm(dim=-1, keepdim=True)) @ g
