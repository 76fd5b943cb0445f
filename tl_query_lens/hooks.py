"""Hook-point checks shared by every method: names that exist, their widths, their layers, where they meet the residual."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

import torch
from transformer_lens import HookedTransformer

from tl_query_lens.errors import HookNotFoundError, UnsupportedModelError

_LAYER = re.compile(r"^blocks\.(\d+)\.")
# Where a module's output joins the residual stream: perturbing it equals perturbing that residual hook.
_RESIDUAL_OF_OUTPUT = {"hook_mlp_out": "hook_resid_post", "hook_attn_out": "hook_resid_mid"}


def check_hook(model: HookedTransformer, name: str) -> str:
    """Return ``name`` if the model has that hook point, else raise a HookNotFoundError (a KeyError) listing the closest
    valid names."""
    if name in model.hook_dict:
        return name
    close = difflib.get_close_matches(name, list(model.hook_dict), n=5, cutoff=0.5)
    examples = close or [n for n in model.hook_dict if n.startswith("blocks.0.")][:12]
    raise HookNotFoundError(
        f"Unknown hook {name!r} for this model ({model.cfg.n_layers} layers). "
        f"Did you mean one of {examples}? Build names with transformer_lens.utils.get_act_name, "
        f"e.g. get_act_name('resid_post', 3) -> 'blocks.3.hook_resid_post'."
    )


def hook_layer(name: str) -> int | None:
    """Layer index of a ``blocks.{l}.…`` hook, None for embedding / final hooks."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


@torch.no_grad()
def hook_dims(model: HookedTransformer, names: list[str]) -> dict[str, int]:
    """Width of the last axis of each hook's activation, probed with a one-token forward pass."""
    for name in names:
        check_hook(model, name)
    dims: dict[str, int] = {}

    def grab(act: torch.Tensor, hook) -> None:
        dims[hook.name] = int(act.shape[-1]) if act.ndim < 4 else int(act.shape[-2] * act.shape[-1])

    tokens = torch.zeros(1, 1, dtype=torch.long, device=model.cfg.device)
    model.run_with_hooks(tokens, fwd_hooks=[(n, grab) for n in names], stop_at_layer=stop_layer(names))
    return dims


def residual_hook_of(name: str, *, parallel: bool = False) -> str:
    """The residual-stream hook where a vector written at ``name`` enters the stream.

    ``blocks.l.hook_mlp_out`` → ``blocks.l.hook_resid_post``; ``blocks.l.hook_attn_out`` → ``blocks.l.hook_resid_mid``,
    or ``blocks.l.hook_resid_post`` in a block with parallel attention and MLP (``parallel=True``: GPT-J, Pythia —
    both modules read the block input, so block l's MLP never sees the attention write, and there is no resid_mid);
    residual hooks map to themselves.
    """
    layer = hook_layer(name)
    suffix = name.split(".")[-1]
    if layer is not None and suffix in _RESIDUAL_OF_OUTPUT:
        return f"blocks.{layer}.{'hook_resid_post' if parallel else _RESIDUAL_OF_OUTPUT[suffix]}"
    if suffix.startswith("hook_resid_") or name in {"hook_embed", "ln_final.hook_normalized"}:
        return name
    raise ValueError(
        f"Vectors written at {name!r} do not live in the residual stream; write hooks must be hook_resid_pre/mid/post, "
        "hook_mlp_out or hook_attn_out (hook_z SAEs: as_key_value(sae, model) maps their values through W_O)."
    )


def downstream_modules(value_hook: str, n_layers: int) -> list[str]:
    """Module operators (``blocks.k.attn`` / ``blocks.k.mlp``) a vector written at ``value_hook`` passes through."""
    layer = hook_layer(value_hook)
    suffix = value_hook.rsplit(".", 1)[-1]
    if layer is None or suffix not in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post"):
        raise ValueError(f"Value hooks are residual hooks blocks.l.hook_resid_pre/mid/post, not {value_hook!r}.")
    modules = {
        "hook_resid_pre": [f"blocks.{layer}.attn", f"blocks.{layer}.mlp"],
        "hook_resid_mid": [f"blocks.{layer}.mlp"],
        "hook_resid_post": [],
    }[suffix]
    return modules + [f"blocks.{k}.{m}" for k in range(layer + 1, n_layers) for m in ("attn", "mlp")]


# TransformerLens' OLMo-2/3 blocks (transformer_lens.utilities.architectures.POST_NORM_ARCHITECTURES) apply ln1 / ln2
# AFTER attention / the MLP, before hook_attn_out / hook_mlp_out, and no norm before them.
_NORM_AFTER_ONLY = {"Olmo2ForCausalLM", "Olmo3ForCausalLM"}


def refuse_norm_after_only(model, what: str) -> None:
    """Raise for OLMo-2/3-style blocks (a norm after each module and none before it), which ``what`` does not model:
    its reading of the module internals assumes a norm before the module (and Gemma-2's optional one after)."""
    arch = getattr(model.cfg, "original_architecture", None)
    if arch in _NORM_AFTER_ONLY:
        raise UnsupportedModelError(
            f"{what} is not supported on {arch} blocks (ln1 / ln2 after attention / the MLP, no norm before them). "
            "Dictionaries on residual hooks, hook_attn_out and hook_mlp_out work there (Query Lens, certification)."
        )


# Hooks before the first block: a pass that only needs them can stop at layer 0.
_EMBED_HOOKS = ("hook_embed", "hook_pos_embed", "hook_tokens")


def stop_layer(hooks: Iterable[str]) -> int | None:
    """The ``stop_at_layer`` that still runs every hook in ``hooks``: the deepest block + 1 (0 for embedding hooks),
    None (run to the end) when a hook lies after the blocks (``ln_final.*``, ``hook_unembed``)."""
    deepest = -1
    for name in hooks:
        layer = hook_layer(name)
        if layer is None:
            if not name.startswith(_EMBED_HOOKS):
                return None
            continue
        deepest = max(deepest, layer)
    return deepest + 1
