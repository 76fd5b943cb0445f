"""Splice metrics of any dictionary: sparsity, explained variance at the write hook, CE-loss change of the splice."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Int
from sae_lens import SAE, HookedSAETransformer

from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import check_outputs
from tl_query_lens.operators.engine import check_tokens
from tl_query_lens.results import SavableResult


@dataclass
class SpliceMetrics(SavableResult):
    """Corpus statistics of a dictionary spliced into the model (no error term).

    Attributes:
        alive_rate: share of features nonzero on at least one token.
        mean_l0: mean number of nonzero features per token.
        explained_variance: 1 − Σ‖y − ŷ‖² / Σ‖y − ȳ‖² at the write hook (y = clean activation).
        ce_clean / ce_spliced: mean next-token cross-entropy (nats) without / with the splice.
        ce_delta: ce_spliced − ce_clean.
        kl: mean KL(clean ‖ spliced) of next-token distributions (nats).
        n_tokens: tokens scored.
    """

    alive_rate: float
    mean_l0: float
    explained_variance: float
    ce_clean: float
    ce_spliced: float
    ce_delta: float
    kl: float
    n_tokens: int


@torch.no_grad()
def splice_metrics(
    model: HookedSAETransformer,
    sae: SAE,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    batch_size: int = 8,
) -> SpliceMetrics:
    """Measure a dictionary's fidelity on ``tokens`` (clean run vs. ``run_with_saes`` without the error term)."""
    view = as_key_value(sae, model)
    tokens = check_tokens(model, tokens)
    fired = torch.zeros(view.d_sae, dtype=torch.bool)
    l0_sum = sse = ce_clean = ce_spliced = kl_sum = 0.0
    y_sum = y_sq = 0.0
    n_tok = 0
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        logits, cache = model.run_with_cache(batch, names_filter=[view.read_hook, view.write_hook])
        x, y = cache[view.read_hook], cache[view.write_hook]
        acts = sae.encode(x)
        y_hat = sae.decode(acts)
        nonzero = acts != 0
        fired |= nonzero.reshape(-1, view.d_sae).any(0).cpu()
        l0_sum += nonzero.sum().item()
        sse += (y - y_hat).pow(2).sum().item()
        y_sum = y_sum + y.reshape(-1, y.shape[-1]).sum(0).double()
        y_sq += y.double().pow(2).sum().item()
        n_tok += y.shape[0] * y.shape[1]
        spliced = model.run_with_saes(batch, saes=[sae], use_error_term=False)
        ce_clean += _ce_sum(logits, batch)
        ce_spliced += _ce_sum(spliced, batch)
        logp, logq = logits.log_softmax(-1), spliced.log_softmax(-1)
        kl_sum += (logp.exp() * (logp - logq)).sum().item()
    n_pred = tokens.shape[0] * (tokens.shape[1] - 1)
    sst = y_sq - (y_sum.pow(2).sum() / n_tok).item()
    metrics = SpliceMetrics(
        alive_rate=fired.float().mean().item(),
        mean_l0=l0_sum / n_tok,
        explained_variance=1.0 - sse / max(sst, 1e-30),
        ce_clean=ce_clean / n_pred,
        ce_spliced=ce_spliced / n_pred,
        ce_delta=(ce_spliced - ce_clean) / n_pred,
        kl=kl_sum / n_tok,
        n_tokens=n_tok,
    )
    return check_outputs(metrics, "splice_metrics", hint="The clean or spliced forward pass produced non-finite "
                         "activations or logits: check the model's weights and dtype (the dictionary's weights "
                         "were checked on entry).")


def _ce_sum(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1), reduction="sum"
    ).item()
