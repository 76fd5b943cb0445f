"""Feature clamping with the error term kept, KL-matched steering and the ZO / TC baselines (docs/design.md §5).

Clamping feature i to α adds (α − a_i(x))·v_i at the dictionary's write hook on every position, where a_i(x) is the
feature's activation on the current input: the spliced dictionary with its error term, edited in one feature.
A feature edit cannot change anything before its layer, so teacher-forced runs cache the clean residual at that layer
and resume from it (``start_at_layer``); generation uses TransformerLens' key–value cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer, TransformerLensKeyValueCache

from tl_query_lens.dictionaries.key_value import KeyValueView
from tl_query_lens.primitives import clean_run, kl_divergence, run_from_residual, splice_hooks
from tl_query_lens.query_lens.max_activating import MaxActivations, view_start_layer


def clamp_hooks(
    view: KeyValueView,
    features: Int[torch.Tensor, " batch"],
    alphas: Float[torch.Tensor, " batch"],
) -> list[tuple[str, Callable]]:
    """Forward hooks that clamp, in batch row b, feature ``features[b]`` to ``alphas[b]`` on every position.

    The write-hook activation becomes y + (α − a_i(x))·v_i, so the dictionary's error term is kept and every other
    feature is untouched. α = 0 is zero-ablation. Where the write passes through a per-token norm (post-norm blocks,
    ``view.value_source``), the same change is made before the norm, at the source hook: y_src + (α − a_i(x))·t_i
    with ``t_i`` the feature's source tangent (``e_i / act_scale_i`` at ``mlp.hook_post``, the head-space decoder row
    at ``attn.hook_z``), so the norm sees the clamped feature.
    """
    target = view.value_source or view.write_hook
    values = view.source_tangents(features) if view.value_source else view.values[features]  # [batch, d]

    def edit(x: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        acts = view.encode(x)  # [batch, pos, d_sae]
        idx = features.to(acts.device)[:, None, None].expand(-1, acts.shape[1], 1)
        a = acts.gather(-1, idx)  # [batch, pos, 1]
        delta = (alphas.to(acts)[:, None, None] - a) * values.to(acts)[:, None, :]
        return act + delta.reshape(act.shape).to(act.dtype)  # hook_z: [batch, pos, head, d_head]

    return splice_hooks(view.read_hook, target, edit)


class TeacherForced:
    """Clean logits of fixed sequences plus the clean residual where a feature edit starts, to re-run edits cheaply."""

    @torch.no_grad()
    def __init__(self, model: HookedTransformer, tokens: Int[torch.Tensor, "batch pos"], start_layer: int) -> None:
        self.model, self.start = model, start_layer
        self.tokens = tokens.to(model.cfg.device)
        logits, self.resid = clean_run(model, self.tokens, [start_layer])
        self.logprobs = logits.float().log_softmax(-1)

    @torch.no_grad()
    def steered_logprobs(self, view: KeyValueView, features: torch.Tensor, alphas: torch.Tensor, rows: torch.Tensor):
        """Log-probs with row ``rows[b]`` of the sequences steered by (features[b], alphas[b])."""
        hooks = clamp_hooks(view, features, alphas)
        logits = run_from_residual(self.model, self.tokens, self.resid, self.start, hooks, rows=rows)
        return logits.float().log_softmax(-1)


def kl_per_row(clean: torch.Tensor, steered: torch.Tensor) -> Float[torch.Tensor, " batch"]:
    """KL(clean ‖ steered) of next-token distributions, averaged over positions (inputs are log-probs)."""
    return kl_divergence(clean, steered).mean(-1)


@torch.no_grad()
def sample_continuations(
    model: HookedTransformer,
    prompt: Int[torch.Tensor, "*n_prompts pos"],
    n_rows: int,
    *,
    n_generate: int,
    temperature: float,
    generator: torch.Generator,
    hooks: list | None = None,
) -> Int[torch.Tensor, "batch pos"]:
    """Sample ``n_generate`` tokens after ``prompt`` for ``n_rows`` rows (KV cache; ``hooks`` act on every position).

    ``prompt`` is one prompt ``[pos]`` or equal-length prompts ``[g, pos]``; row ``j·n_rows + i`` continues prompt j.
    """
    device = model.cfg.device
    prompts = prompt.to(device).reshape(-1, prompt.shape[-1])
    tokens = prompts.repeat_interleave(n_rows, dim=0)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, device, len(tokens))
    step_input = tokens
    with model.hooks(fwd_hooks=hooks or []):
        for _ in range(n_generate):
            # an explicit all-ones mask: no position is treated as padding (TL would otherwise mask pad-token ids)
            mask = torch.ones_like(step_input)
            logits = model(step_input, past_kv_cache=cache, attention_mask=mask)[:, -1].float()
            probs = (logits / temperature).softmax(-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(device)
            tokens = torch.cat([tokens, nxt], dim=1)
            step_input = nxt
    return tokens


MAX_BATCH_ROWS = 128  # rows of one batched steering pass: ~0.5 GB of float32 log-probs per 22 positions


def prompt_batches(
    prompts: Sequence[Int[torch.Tensor, " pos"]], rows_per_prompt: int, max_rows: int = MAX_BATCH_ROWS
) -> list[list[int]]:
    """Indices of ``prompts`` grouped for one batched pass each: equal token length (no padding, so every row is the
    exact computation of its prompt alone), at most ``max_rows // rows_per_prompt`` prompts (≥ 1), groups in the
    order of their first prompt. Prompts of distinct lengths give one group each, in their own order."""
    per = max(1, max_rows // max(1, rows_per_prompt))
    groups: dict[int, list[list[int]]] = {}
    order: list[list[int]] = []
    for j, p in enumerate(prompts):
        chunks = groups.setdefault(len(p), [])
        if not chunks or len(chunks[-1]) == per:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(j)
    return order


def rank_percentiles(logprobs: Float[torch.Tensor, "... d_vocab"]) -> Float[torch.Tensor, "... d_vocab"]:
    """Rank of every token in its distribution as a percentile in [0, 1] (1 = most likely)."""
    order = logprobs.argsort(-1)
    # the inverse permutation of the sort order, by scatter (one sort instead of argsort(argsort(x)))
    ranks = torch.empty_like(order).scatter_(
        -1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order)
    )
    return ranks.float() / (logprobs.shape[-1] - 1)


@torch.no_grad()
def zero_ablation_signatures(
    model: HookedTransformer,
    view: KeyValueView,
    features: Int[torch.Tensor, " n"],
    contexts: MaxActivations,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    k: int = 25,
) -> Int[torch.Tensor, "n k"]:
    """ZO baseline: top tokens of y(a_clean) − y(0) at the argmax position, averaged over max-activating contexts.

    The feature is zero-ablated on every position of the context (the logit read at the argmax position only
    depends on positions up to it, so contexts are truncated there).
    """
    start = view_start_layer(view)
    out = []
    for f in features.tolist():
        seq, pos = contexts.seq[f], contexts.pos[f]
        batch = tokens[seq, : int(pos.max()) + 1]
        run = TeacherForced(model, batch, start)
        rows = torch.arange(batch.shape[0])
        ablated = run.steered_logprobs(view, torch.full_like(rows, f), torch.zeros(len(rows)), rows)
        # logit differences = log-prob differences up to a per-position constant, which leaves the ranking unchanged
        at = pos.to(run.logprobs.device)
        delta = (run.logprobs[rows, at] - ablated[rows, at]).mean(0)
        out.append(delta.topk(k).indices.cpu())
    return torch.stack(out)


@torch.no_grad()
def clamp_signatures(
    model: HookedTransformer,
    view: KeyValueView,
    features: Int[torch.Tensor, " n"],
    sequences: Sequence[Int[torch.Tensor, " pos"]],
    *,
    values: Sequence[float] = (1.0, 5.0, 10.0),
    k: int = 25,
) -> Int[torch.Tensor, "n k"]:
    """TC baseline: top tokens of the mean logit change when the feature is clamped to each a in ``values``.

    Logit changes are averaged over positions of the teacher-forced ``sequences`` (neutral prompts with clean
    continuations) and over the clamp values.
    """
    start = view_start_layer(view)
    n, vals = len(features), torch.tensor(list(values), dtype=torch.float32)
    total = torch.zeros(n, model.cfg.d_vocab)
    for seq in sequences:
        run = TeacherForced(model, seq[None], start)
        feats = features.repeat_interleave(len(vals))
        alphas = vals.repeat(n)
        rows = torch.zeros(len(feats), dtype=torch.long)
        logits_clean = run.logprobs  # log-softmax shift is constant per position: rankings of Δlogit preserved
        steered = run.steered_logprobs(view, feats, alphas, rows)
        delta = (steered - logits_clean).mean(1).reshape(n, len(vals), -1).mean(1)
        total += delta.cpu()
    return total.topk(k, dim=-1).indices
