"""SAELens' own evaluation (``sae_lens.evals.run_evals``) of the residual SAEs, on the report's evaluation windows.

``tlql saes report --protocol saelens`` puts these figures beside the project's
(:func:`tl_query_lens.saes.report.suite_quality`). The windows are the same; the protocols differ in two ways:

* SAELens splices every position, the first included. The project keeps the first ``exclude_first_positions``
  positions clean (SmolLM2's first position is an attention sink; see ``SAESuiteConfig.exclude_first_positions``).
* SAELens leaves special tokens out by id (BOS, EOS, PAD: ``exclude_special_tokens=True``, its default) from the
  splice and from every statistic. The project leaves out nothing by id: its windows start mid-text, without BOS.

``run_evals`` reads its batches from an ``ActivationsStore``; :class:`WindowStore` hands it the report's windows in
order instead, through the members ``run_evals`` uses (``get_batch_tokens``, ``reset_input_dataset``,
``context_size`` and ``store_batch_size_prompts``). Transcoders are left out: ``run_evals`` splices the SAE's
output at its input hook, which is not where a transcoder writes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sae_lens import SAE, HookedSAETransformer
from sae_lens.evals import EvalConfig, run_evals
from sae_lens.training.activation_scaler import ActivationScaler

logger = logging.getLogger(__name__)

#: Figures kept from ``run_evals`` (group, key) and their column names.
SAELENS_COLUMNS = {
    "ce_recovered": ("model_performance_preservation", "ce_loss_score"),
    "ce_clean": ("model_performance_preservation", "ce_loss_without_sae"),
    "ce_spliced": ("model_performance_preservation", "ce_loss_with_sae"),
    "ce_zero": ("model_performance_preservation", "ce_loss_with_ablation"),
    "kl_score": ("model_behavior_preservation", "kl_div_score"),
    "kl": ("model_behavior_preservation", "kl_div_with_sae"),
    "explained_variance": ("reconstruction_quality", "explained_variance"),
    "mean_l0": ("sparsity", "l0"),
}


class WindowStore:
    """The part of SAELens' ``ActivationsStore`` that ``run_evals`` reads: fixed token windows, in order."""

    def __init__(self, tokens: torch.Tensor, batch_size: int) -> None:
        self.tokens = tokens
        self.context_size = int(tokens.shape[1])
        self.store_batch_size_prompts = batch_size
        self._next = 0

    def get_batch_tokens(self, batch_size: int | None = None, raise_at_epoch_end: bool = False) -> torch.Tensor:
        n = batch_size or self.store_batch_size_prompts
        if self._next + n > self.tokens.shape[0]:
            raise ValueError(f"Only {self.tokens.shape[0]} windows; batch {self._next // n} would run past them.")
        batch = self.tokens[self._next : self._next + n]
        self._next += n
        return batch

    def reset_input_dataset(self) -> None:
        self._next = 0


def is_residual(sae: SAE) -> bool:
    """Whether SAELens' ``run_evals`` measures ``sae`` as it is used: it reads and writes one hook."""
    return not getattr(sae.cfg.metadata, "hook_name_out", None)


@torch.no_grad()
def saelens_quality(
    model: HookedSAETransformer, saes: dict[str, SAE], tokens: torch.Tensor, *, batch_size: int = 8
) -> list[dict[str, Any]]:
    """``run_evals`` of every residual SAE of ``saes`` on ``tokens`` (whole batches of ``batch_size`` windows; the
    rest is left out, as ``run_evals`` counts whole batches), one row per SAE (keys: ``sae_id``, ``n_tokens`` and
    :data:`SAELENS_COLUMNS`)."""
    batch_size = min(batch_size, tokens.shape[0])
    n_batches = tokens.shape[0] // batch_size
    device = next(model.parameters()).device
    store = WindowStore(tokens[: n_batches * batch_size].to(device), batch_size)
    config = EvalConfig(
        batch_size_prompts=batch_size,
        n_eval_reconstruction_batches=n_batches,
        n_eval_sparsity_variance_batches=n_batches,
        compute_kl=True,
        compute_ce_loss=True,
        compute_sparsity_metrics=True,
        compute_variance_metrics=True,
    )
    special = model.tokenizer is not None  # SAELens' default; a model without a tokenizer has no special ids
    rows = []
    for sid, sae in saes.items():
        if not is_residual(sae):
            logger.info("run_evals skips %s: a transcoder writes at another hook than it reads", sid)
            continue
        store.reset_input_dataset()
        store_like: Any = store  # run_evals reads only the members WindowStore has
        metrics, _ = run_evals(sae, store_like, model, ActivationScaler(), config, exclude_special_tokens=special)
        row: dict[str, Any] = {"sae_id": sid, "n_tokens": n_batches * batch_size * tokens.shape[1]}
        row |= {name: float(metrics[group][key]) for name, (group, key) in SAELENS_COLUMNS.items()}
        rows.append(row)
    return rows
