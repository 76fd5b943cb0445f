"""Max-activating corpus contexts of dictionary features and the Table-1 input score (docs/design.md §5).

A *context* is one corpus sequence (a fixed-length window); its activation is the feature's maximum over positions
and its *top token* is the token at the argmax position. The input score of a token set T is the share of the top
tokens of the N most-activating contexts whose normalised string is among T's normalised strings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from tqdm import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value
from tl_query_lens.hooks import hook_layer
from tl_query_lens.primitives import stop_layer
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)

_SPACE_MARKERS = " \u0120\u2581\t\n"  # space, GPT-2 'Ġ', SentencePiece '▁', whitespace


def normalise_token(text: str) -> str:
    """Normalised token string: stripped, lower-cased, leading space / 'Ġ' / '▁' markers removed."""
    return text.strip().lstrip(_SPACE_MARKERS).strip().lower()


def token_strings(tokenizer, ids: Int[torch.Tensor, ...]) -> list[str]:
    """Normalised strings of a flat list of token ids (decoded one id at a time)."""
    return [normalise_token(tokenizer.decode([int(i)])) for i in ids.reshape(-1).tolist()]


@dataclass
class MaxActivations(SavableResult):
    """The top-N activating contexts of every feature of one dictionary.

    Attributes:
        seq: ``[d_sae, n_contexts]`` corpus row of each context, most activating first.
        pos: ``[d_sae, n_contexts]`` argmax position inside the context.
        token: ``[d_sae, n_contexts]`` token id at that position (the context's *top token*).
        activation: ``[d_sae, n_contexts]`` the feature's activation there.
        read_hook: hook the dictionary reads.
        corpus_fingerprint: fingerprint of the token corpus searched.
        n_active: ``[d_sae]`` corpus sequences in which the feature's activation exceeds 0 somewhere (empty when
            loaded from a result saved before this field existed).
    """

    seq: Int[torch.Tensor, "d_sae n_contexts"]
    pos: Int[torch.Tensor, "d_sae n_contexts"]
    token: Int[torch.Tensor, "d_sae n_contexts"]
    activation: Float[torch.Tensor, "d_sae n_contexts"]
    read_hook: str
    corpus_fingerprint: str
    n_active: Int[torch.Tensor, " d_sae"] = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    @property
    def n_contexts(self) -> int:
        return int(self.seq.shape[1])

    def scalars(self) -> dict[str, float]:
        """Features, contexts per feature, and features active somewhere in the corpus (when recorded)."""
        out = {"n_features": float(self.seq.shape[0]), "n_contexts": float(self.n_contexts)}
        if self.n_active.numel():
            out["n_features_active"] = float((self.n_active > 0).sum())
        return out


@torch.no_grad()
def max_activating_contexts(
    model: HookedTransformer,
    dictionary,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    n_contexts: int = 20,
    batch_size: int = 16,
    exclude_first_positions: int = 0,
) -> MaxActivations:
    """Top-``n_contexts`` corpus sequences of every feature by its maximum activation over positions.

    One pass over ``tokens`` serves all features of the dictionary (a running per-sequence max ``[n_seqs, d_sae]``).
    Nothing is cached: keep the result (it saves and loads) and pass it on as ``contexts=``.

    Args:
        model: the model the dictionary belongs to.
        dictionary: anything :func:`as_key_value` accepts.
        tokens: corpus sequences; each row is one context.
        n_contexts: N, contexts kept per feature (the paper uses N ≥ 20).
        batch_size: sequences per forward pass.
        exclude_first_positions: leading positions of every sequence left out of the search (and of ``n_active``):
            a residual SAE trained without position 0 (the attention sink, as SAEBench leaves out BOS) fires there
            on directions it never learnt, and such a context would say nothing about the feature.
    """
    view = as_key_value(dictionary, model)
    if tokens.ndim != 2 or tokens.shape[0] < n_contexts:
        raise ValueError(
            f"Need a [n_seqs, seq_len] corpus with at least n_contexts={n_contexts} rows, got shape "
            f"{tuple(tokens.shape)}; load more sequences with load_corpus(..., n_seqs=...)."
        )
    if not 0 <= exclude_first_positions < tokens.shape[1]:
        raise ValueError(
            f"exclude_first_positions={exclude_first_positions} must lie in 0..{tokens.shape[1] - 1} for sequences "
            f"of {tokens.shape[1]} tokens."
        )
    fingerprint = corpus_fingerprint(tokens)
    stop = stop_layer([view.read_hook])
    best = torch.empty(tokens.shape[0], view.d_sae)
    where = torch.empty(tokens.shape[0], view.d_sae, dtype=torch.long)
    captured: dict[str, torch.Tensor] = {}

    def grab(act: torch.Tensor, hook) -> None:
        captured["x"] = act

    for start in tqdm(range(0, tokens.shape[0], batch_size), desc="max-activating contexts", leave=False):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        model.run_with_hooks(batch, fwd_hooks=[(view.read_hook, grab)], stop_at_layer=stop)
        acts = view.encode(captured.pop("x")).float().cpu()[:, exclude_first_positions:]  # [b, pos, d_sae]
        value, index = acts.max(dim=1)
        index += exclude_first_positions
        best[start : start + batch.shape[0]] = value
        where[start : start + batch.shape[0]] = index
    top_act, top_seq = best.T.topk(n_contexts, dim=1)  # [d_sae, N]
    top_pos = where.T.gather(1, top_seq)
    return MaxActivations(
        seq=top_seq,
        pos=top_pos,
        token=tokens[top_seq, top_pos].cpu(),
        activation=top_act,
        read_hook=view.read_hook,
        corpus_fingerprint=fingerprint,
        n_active=(best > 0).sum(dim=0),
    )


def input_scores(
    tokenizer,
    top_tokens: Int[torch.Tensor, "n_features n_contexts"],
    signature_ids: Int[torch.Tensor, "n_features k"],
) -> Float[torch.Tensor, " n_features"]:
    """Input score I(T) per feature: share of max-activating top tokens whose normalised string is in T (docs/design.md §5).

    Args:
        tokenizer: decodes ids to strings.
        top_tokens: top token of each of the feature's N max-activating contexts.
        signature_ids: the k token ids T of a signature (any method).
    """
    if top_tokens.shape[0] != signature_ids.shape[0]:
        raise ValueError(
            f"top_tokens has {top_tokens.shape[0]} features but signature_ids has {signature_ids.shape[0]}; "
            "pass the rows of the same features in the same order."
        )
    n_ctx = top_tokens.shape[1]
    top_str = token_strings(tokenizer, top_tokens)
    sig_str = token_strings(tokenizer, signature_ids)
    k = signature_ids.shape[1]
    scores = []
    for f in range(top_tokens.shape[0]):
        wanted = set(sig_str[f * k : (f + 1) * k])
        hits = sum(s in wanted for s in top_str[f * n_ctx : (f + 1) * n_ctx])
        scores.append(hits / n_ctx)
    return torch.tensor(scores)


def output_scores(
    steered_top: Int[torch.Tensor, "n_features s"],
    signature_ids: Int[torch.Tensor, "n_features k"],
) -> Float[torch.Tensor, " n_features"]:
    """Output score O(T) = |S ∩ T| / |S| per feature, by token id (S = the steering top tokens, docs/design.md §5)."""
    if steered_top.shape[0] != signature_ids.shape[0]:
        raise ValueError("steered_top and signature_ids must have one row per feature, in the same order.")
    return torch.tensor(
        [len(set(s.tolist()) & set(t.tolist())) / s.numel() for s, t in zip(steered_top, signature_ids)]
    )


def view_start_layer(view: KeyValueView) -> int:
    """First layer whose computation a feature edit can change (resume a cached clean run from there)."""
    layers = [hook_layer(view.read_hook), hook_layer(view.write_hook)]
    return 0 if any(layer is None for layer in layers) else min(layers)  # type: ignore[type-var, return-value]
