"""SAEBench's core evaluation (``sae_bench.evals.core.main.run_evals``) of the residual SAEs, on the report's windows.

``tlql saes report --protocol saebench`` puts these figures beside the project's
(:func:`tl_query_lens.saes.report.suite_quality`), on the same windows, through the same :class:`WindowStore` as
SAELens' ``run_evals`` (:mod:`tl_query_lens.saes.saelens_eval`).

**The SAELens-6 adapter** (:func:`saebench_view`). SAEBench 0.6's ``run_evals`` reads the SAELens-5 fields
``sae.cfg.hook_name``, ``sae.cfg.hook_layer`` and ``sae.cfg.hook_head_index``; a SAELens 6 SAE keeps the hook name in
``sae.cfg.metadata`` and has no ``hook_layer``, so a direct call fails with ``AttributeError``. SAEBench's own entry
point (``multiple_evals``) first passes every SAE through ``sae_bench_utils.general_utils.load_and_format_sae``, which
sets those fields on the cfg in place (``hook_layer`` from the first number of the hook name). The adapter runs that
same SAEBench function on a shallow copy of the SAE with a copied cfg, so the weights are shared and the caller's
SAE and cfg stay as they were.

**The protocol** replays ``multiple_evals``' defaults: every position spliced
(``exclude_special_tokens_from_reconstruction=False``), the tokenizer's PAD, EOS and BOS ids left out of every
statistic (``ignore_tokens``), L2 norms, sparsity, variance, CE and KL on. The one change: the sparsity/variance
statistics use every batch (SAEBench's default is one), so they cover the same windows as the CE figures.

**SAEBench's explained variance is not a variance ratio.** It is ``1 − R / (S − m²)`` with ``R`` the mean of
``‖x − x̂‖²``, ``S`` the mean of ``‖x‖²`` and ``m`` the mean over batches and dimensions of ``E[x_d²]``, i.e. ``S / d``:
``mean_act_per_dimension`` holds means of *squares*, and ``torch.cat(...).mean(dim=0)`` collapses the ``d`` axis to
a scalar. The denominator should be ``S − ‖E[x]‖²``. Where ``S > d²`` (activations whose mean square per dimension
exceeds ``d``, such as SmolLM2's residual at the first position) the denominator is negative and the "explained
variance" exceeds 1. ``explained_variance_legacy`` (per-token ``1 − ‖x − x̂‖² / ‖x − x̄_batch‖²``, averaged) is kept
beside it.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import torch
from sae_lens import SAE, HookedSAETransformer

from tl_query_lens.saes.saelens_eval import SAELENS_COLUMNS, WindowStore, is_residual

logger = logging.getLogger(__name__)

#: Figures kept from SAEBench's ``run_evals`` (group, key) and their column names.
SAEBENCH_COLUMNS = {
    **SAELENS_COLUMNS,  # SAEBench's core eval reports the same groups and keys as SAELens' run_evals, plus these
    "explained_variance_legacy": ("reconstruction_quality", "explained_variance_legacy"),
    "mse": ("reconstruction_quality", "mse"),
    "cossim": ("reconstruction_quality", "cossim"),
    "l2_ratio": ("shrinkage", "l2_ratio"),
}


def saebench_view(sae: SAE) -> SAE:
    """``sae`` as SAEBench 0.6's core evaluation reads it: a shallow copy (same weights) whose copied cfg carries the
    SAELens-5 fields (``hook_name``, ``hook_layer``, ``hook_head_index``, ``model_name``, ...), set by SAEBench's own
    ``load_and_format_sae``. ``sae`` itself is left unchanged."""
    from sae_bench.sae_bench_utils.general_utils import load_and_format_sae

    view = copy.copy(sae)
    view.cfg = copy.copy(sae.cfg)
    with warnings.catch_warnings():
        # load_and_format_sae checks unit decoder norms to 1e-5 and warns; the core metrics do not depend on them
        warnings.filterwarnings("ignore", message="Decoder weights are not normalized")
        formatted = load_and_format_sae("tl_query_lens", view, str(next(sae.parameters()).device))
    assert formatted is not None  # an SAE object is always formatted
    return formatted[1]


def special_token_ids(model: HookedSAETransformer) -> set[int | None]:
    """The ids ``multiple_evals`` passes as ``ignore_tokens`` (PAD, EOS, BOS), without the ones the tokenizer lacks."""
    tok = model.tokenizer
    if tok is None:
        return set()
    return {i for i in (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) if i is not None}


@torch.no_grad()
def saebench_quality(
    model: HookedSAETransformer, saes: dict[str, SAE], tokens: torch.Tensor, *, batch_size: int = 8
) -> list[dict[str, Any]]:
    """SAEBench's core ``run_evals`` of every residual SAE of ``saes`` on ``tokens`` (whole batches of
    ``batch_size`` windows), one row per SAE (keys: ``sae_id``, ``n_tokens`` and :data:`SAEBENCH_COLUMNS`)."""
    from sae_bench.evals.core.eval_config import CoreEvalConfig
    from sae_bench.evals.core.main import run_evals

    batch_size = min(batch_size, tokens.shape[0])
    n_batches = tokens.shape[0] // batch_size
    device = next(model.parameters()).device
    store: Any = WindowStore(tokens[: n_batches * batch_size].to(device), batch_size)  # the members run_evals reads
    config = CoreEvalConfig(
        batch_size_prompts=batch_size,
        n_eval_reconstruction_batches=n_batches,
        n_eval_sparsity_variance_batches=n_batches,
        context_size=int(tokens.shape[1]),
        compute_kl=True,
        compute_ce_loss=True,
        compute_l2_norms=True,
        compute_sparsity_metrics=True,
        compute_variance_metrics=True,
    )
    ignore = special_token_ids(model)
    rows = []
    for sid, sae in saes.items():
        if not is_residual(sae):
            logger.info("SAEBench's run_evals skips %s: a transcoder writes at another hook than it reads", sid)
            continue
        store.reset_input_dataset()
        metrics, _ = run_evals(saebench_view(sae), store, model, config, ignore_tokens=ignore)
        row: dict[str, Any] = {"sae_id": sid, "n_tokens": n_batches * batch_size * tokens.shape[1]}
        row |= {name: float(metrics[group][key]) for name, (group, key) in SAEBENCH_COLUMNS.items()}
        rows.append(row)
    return rows
