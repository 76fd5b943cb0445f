"""Cross-lens check (docs/design.md §6): do two Jacobian lenses fitted on different corpora share the dominant feature?

A Jacobian lens decodes a residual h at ``blocks.l.hook_resid_post`` as h̃ = LN_f(M_l h), with M_l the corpus-mean
value operator of the operator engine (docs/design.md §4; this module never computes Jacobians itself). Fit M_l on two
corpora, decode the same frozen states under both, take each lens' own top-1 token t and its vocabulary-mean
contrast score (α = e_t − 1/|V|), and compare the dominant readout features argmax_i |c_i|. Nulls: the dominant
feature of lens B on a *different* state (shuffled pairing), and of lens B's score for a random other token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tl_query_lens.primitives import cluster_bootstrap
from tl_query_lens.readout.decompose import decompose_rows, vocab_mean_contrast
from tl_query_lens.readout.sae import ReadoutSAE, check_compatible, unembedding_rows
from tl_query_lens.results import SavableResult


@dataclass
class CrossLensResult(SavableResult):
    """Agreement of dominant readout features between two lenses on the same frozen states.

    Attributes:
        hook: the residual hook the lenses decode.
        n_states: frozen states compared.
        token_disagreement: share of states whose top-1 tokens differ between the lenses.
        feature_agreement: share with the same dominant feature, and a cluster-bootstrap CI (cluster = sequence).
        null_shuffled: agreement with lens B's dominant feature on another state (shuffled pairing).
        null_random_token: agreement with lens B's dominant feature for a random other token's score.
        agreement_when_tokens_differ: feature agreement among the states whose tokens differ.
        dominant_a, dominant_b: dominant feature ids per state; tokens_a, tokens_b: top-1 tokens.
    """

    hook: str
    n_states: int
    token_disagreement: float
    feature_agreement: float
    feature_agreement_ci: list[float]
    null_shuffled: float
    null_random_token: float
    agreement_when_tokens_differ: float
    dominant_a: torch.Tensor
    dominant_b: torch.Tensor
    tokens_a: torch.Tensor
    tokens_b: torch.Tensor


def jacobian_lens(model, operator: torch.Tensor):
    """h ↦ LN_f(M h) for residuals [..., d_model] (M from ``value_operators``)."""
    M = operator.detach().to(model.W_U)
    ln = getattr(model, "ln_final", None)
    return lambda h: ln(h @ M.T) if ln is not None else h @ M.T


@torch.no_grad()
def dominant_features(sae: ReadoutSAE, rows: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """argmax_i |c_i| of the vocabulary-mean contrast of ``tokens[j]`` at ``states[j]``."""
    out = []
    for h, t in zip(states, tokens.tolist()):
        dec = decompose_rows(sae, h, vocab_mean_contrast(t, sae.cfg.d_vocab), rows, n_top=0)
        out.append(int(dec.contributions.abs().argmax()))
    return torch.tensor(out)


@torch.no_grad()
def cross_lens_check(
    model,
    sae: ReadoutSAE,
    resid: torch.Tensor,
    operator_a: torch.Tensor,
    operator_b: torch.Tensor,
    *,
    sequence: torch.Tensor | None = None,
    hook: str = "",
    seed: int = 0,
) -> CrossLensResult:
    """Compare dominant readout features of two Jacobian lenses on the same frozen residuals.

    Args:
        model: the model (LN_f, W_U).
        sae: readout SAE of ``model``.
        resid: frozen residuals [n, d_model] at ``hook``.
        operator_a, operator_b: value operators M_l fitted on two corpora.
        sequence: source sequence of each state (bootstrap clusters; default one cluster per state).
    """
    check_compatible(sae, model)
    rows = unembedding_rows(model)
    b_U = model.b_U.detach().float()
    h_a = jacobian_lens(model, operator_a)(resid.to(rows)).float()
    h_b = jacobian_lens(model, operator_b)(resid.to(rows)).float()
    tok_a = (h_a @ rows.T + b_U).argmax(-1).cpu()
    tok_b = (h_b @ rows.T + b_U).argmax(-1).cpu()
    dom_a = dominant_features(sae, rows, h_a, tok_a)
    dom_b = dominant_features(sae, rows, h_b, tok_b)
    gen = torch.Generator().manual_seed(seed)
    n = len(tok_a)
    perm = (torch.arange(n) + torch.randint(1, max(n, 2), (1,), generator=gen)) % n  # a derangement
    rand_tok = torch.randint(rows.shape[0], (n,), generator=gen)
    rand_tok = torch.where(rand_tok == tok_b, (rand_tok + 1) % rows.shape[0], rand_tok)
    dom_rand = dominant_features(sae, rows, h_b, rand_tok)
    agree = (dom_a == dom_b).float()
    differ = tok_a != tok_b
    clusters = sequence if sequence is not None else torch.arange(n)
    return CrossLensResult(
        hook=hook,
        n_states=n,
        token_disagreement=differ.float().mean().item(),
        feature_agreement=agree.mean().item(),
        feature_agreement_ci=cluster_bootstrap(agree, clusters.cpu()),
        null_shuffled=(dom_a == dom_b[perm]).float().mean().item(),
        null_random_token=(dom_a == dom_rand).float().mean().item(),
        agreement_when_tokens_differ=agree[differ].mean().item() if differ.any() else float("nan"),
        dominant_a=dom_a,
        dominant_b=dom_b,
        tokens_a=tok_a,
        tokens_b=tok_b,
    )
