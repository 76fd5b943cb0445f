"""Readout SAEs (Sparse Readout Prism, docs/design.md §6): a sparse dictionary of the LM head's rows and exact score decomposition.

The first name used from this package registers the SAELens architecture ``"readout"`` and this project's readout
releases, so ``SAE.load_from_disk(path)`` and ``SAE.from_pretrained("tlql-readout-<model>", sae_id)`` return a
:class:`~tl_query_lens.readout.sae.ReadoutSAE` (``import tl_query_lens.readout.config`` alone imports no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "ReadoutFitConfig": "tl_query_lens.readout.config",
    "Decomposition": "tl_query_lens.readout.decompose",
    "bind": "tl_query_lens.readout.decompose",
    "decompose": "tl_query_lens.readout.decompose",
    "decompose_rows": "tl_query_lens.readout.decompose",
    "feature_labels": "tl_query_lens.readout.decompose",
    "group_mean": "tl_query_lens.readout.decompose",
    "margin": "tl_query_lens.readout.decompose",
    "token_logit": "tl_query_lens.readout.decompose",
    "top1_vs_competitor": "tl_query_lens.readout.decompose",
    "vocab_mean_contrast": "tl_query_lens.readout.decompose",
    "ReadoutFit": "tl_query_lens.readout.fit",
    "fit_readout": "tl_query_lens.readout.fit",
    "readout_diagnostics": "tl_query_lens.readout.protocols",
    "cached_sae_path": "tl_query_lens.readout.registry",
    "describe_fit_source": "tl_query_lens.readout.registry",
    "fit_source": "tl_query_lens.readout.registry",
    "register_releases": "tl_query_lens.readout.registry",
    "ReadoutSAE": "tl_query_lens.readout.sae",
    "ReadoutSAEConfig": "tl_query_lens.readout.sae",
    "StateBank": "tl_query_lens.readout.states",
    "collect_states": "tl_query_lens.readout.states",
    "logit_lens": "tl_query_lens.readout.states",
}
__all__ = [
    "Decomposition",
    "ReadoutFit",
    "ReadoutFitConfig",
    "ReadoutSAE",
    "ReadoutSAEConfig",
    "StateBank",
    "bind",
    "cached_sae_path",
    "collect_states",
    "decompose",
    "decompose_rows",
    "describe_fit_source",
    "feature_labels",
    "fit_readout",
    "fit_source",
    "group_mean",
    "logit_lens",
    "margin",
    "readout_diagnostics",
    "register_releases",
    "token_logit",
    "top1_vs_competitor",
    "vocab_mean_contrast",
]

if TYPE_CHECKING:
    from tl_query_lens.readout.config import ReadoutFitConfig
    from tl_query_lens.readout.decompose import (
        Decomposition,
        bind,
        decompose,
        decompose_rows,
        feature_labels,
        group_mean,
        margin,
        token_logit,
        top1_vs_competitor,
        vocab_mean_contrast,
    )
    from tl_query_lens.readout.fit import ReadoutFit, fit_readout
    from tl_query_lens.readout.protocols import readout_diagnostics
    from tl_query_lens.readout.registry import cached_sae_path, describe_fit_source, fit_source, register_releases
    from tl_query_lens.readout.sae import ReadoutSAE, ReadoutSAEConfig
    from tl_query_lens.readout.states import StateBank, collect_states, logit_lens

__getattr__ = lazy_package(
    __name__,
    _EXPORTS,
    first=(
        "tl_query_lens.readout.registry",
        "tl_query_lens.readout.fit",
        "tl_query_lens.readout.decompose",
    ),
)
