"""Decoded states h̃ = T_l(h_l) from any TL hook: through the final norm (logit lens) or through a fitted lens."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from tqdm import tqdm

from tl_query_lens.errors import NonFiniteError
from tl_query_lens.hooks import check_hook
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)

Lens = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class StateBank(SavableResult):
    """Decoded states with where they came from and their top-1 token under the dense head.

    Attributes:
        states: h̃, one row per (sequence, position, hook).
        sequence: index of the source sequence (the bootstrap cluster).
        position: token position.
        hook_index: index into ``hooks``.
        top1: argmax_t h̃·w_t + b_U (dense head).
        hooks: hook names the states were read at.
    """

    states: Float[torch.Tensor, "n d_model"]
    sequence: Int[torch.Tensor, " n"]
    position: Int[torch.Tensor, " n"]
    hook_index: Int[torch.Tensor, " n"]
    top1: Int[torch.Tensor, " n"]
    hooks: list[str]

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def subset(self, index: torch.Tensor) -> StateBank:
        return StateBank(
            self.states[index],
            self.sequence[index],
            self.position[index],
            self.hook_index[index],
            self.top1[index],
            list(self.hooks),
        )

    def scalars(self) -> dict[str, float]:
        """How many states, sequences and hooks the bank holds."""
        n_seqs = int(self.sequence.unique().numel()) if self.sequence.numel() else 0
        return {"n_states": float(len(self)), "n_sequences": float(n_seqs), "n_hooks": float(len(self.hooks))}


def logit_lens(model) -> Lens:
    """h̃ = LN_f(resid): the final norm (TL ``ln_final``; identity for models without one)."""
    ln = getattr(model, "ln_final", None)
    return (lambda x: x) if ln is None else (lambda x: ln(x))


def default_state_hooks(model, n: int = 4) -> list[str]:
    """``n`` residual hooks evenly spaced over the second half of the model, always including the last layer."""
    n_layers = model.cfg.n_layers
    layers = torch.linspace(n_layers // 2, n_layers - 1, min(n, n_layers - n_layers // 2)).round().long().unique()
    return [f"blocks.{int(layer)}.hook_resid_post" for layer in layers]


def check_state(h: torch.Tensor, d_model: int) -> torch.Tensor:
    """Validate decoded states: last axis d_model, finite values."""
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor of decoded states [..., d_model], got {type(h).__name__}.")
    if h.shape[-1] != d_model:
        raise ValueError(
            f"h has last dimension {h.shape[-1]} but the readout SAE has d_model={d_model}; pass decoded "
            f"states h̃ = LN_f(resid) (or a lens output) of the model the dictionary was fitted to."
        )
    if not torch.isfinite(h).all():
        raise NonFiniteError(
            "h contains NaN or inf; decode states from a finite forward pass (check the lens / dtype)."
        )
    return h


@torch.no_grad()
def collect_states(
    model,
    tokens: Int[torch.Tensor, "batch pos"],
    hooks: Sequence[str] | None = None,
    *,
    lens: Lens | dict[str, Lens] | None = None,
    skip_first: int = 1,
    batch_size: int = 8,
) -> StateBank:
    """Run ``model`` on ``tokens`` and decode the residual at ``hooks`` through ``lens`` (logit lens by default).

    Args:
        model: a TransformerLens model.
        tokens: token ids.
        hooks: TL hook names carrying d_model states (default :func:`default_state_hooks`).
        lens: one callable for every hook, a dict hook → callable (a fitted lens per layer), or None (logit lens).
        skip_first: drop the first positions (attention-sink states).
        batch_size: sequences per forward pass.
    """
    hooks = list(hooks or default_state_hooks(model))
    for name in hooks:
        check_hook(model, name)
    decoders = {name: (lens[name] if isinstance(lens, dict) else lens or logit_lens(model)) for name in hooks}
    W_U, b_U = model.W_U.detach(), model.b_U.detach()
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("h", "seq", "pos", "hook", "top1")}
    tokens = tokens.to(model.cfg.device)
    for start in tqdm(range(0, tokens.shape[0], batch_size), desc="decoded states", leave=False):
        batch = tokens[start : start + batch_size]
        _, cache = model.run_with_cache(batch, names_filter=hooks, return_type=None)
        for j, name in enumerate(hooks):
            resid = cache[name][:, skip_first:]
            h = decoders[name](resid).reshape(-1, resid.shape[-1]).float()
            n_seq, n_pos = resid.shape[:2]
            out["h"].append(h)
            out["seq"].append((torch.arange(n_seq, device=h.device) + start).repeat_interleave(n_pos))
            out["pos"].append((torch.arange(n_pos, device=h.device) + skip_first).repeat(n_seq))
            out["hook"].append(torch.full((h.shape[0],), j, device=h.device))
            out["top1"].append((h @ W_U.float() + b_U.float()).argmax(-1))
    cat = {k: torch.cat(v).cpu() for k, v in out.items()}
    return StateBank(cat["h"], cat["seq"], cat["pos"], cat["hook"], cat["top1"], hooks)
