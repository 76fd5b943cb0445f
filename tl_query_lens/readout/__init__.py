"""Readout SAEs (Sparse Readout Prism, docs/design.md §6): a sparse dictionary of the LM head's rows and exact score decomposition.

Importing this package registers the SAELens architecture ``"readout"`` and this project's readout releases, so
``SAE.load_from_disk(path)`` and ``SAE.from_pretrained("tlql-readout-<model>", sae_id)`` return a :class:`ReadoutSAE`.
"""

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
from tl_query_lens.readout.fit import ReadoutFit, ReadoutFitConfig, fit_readout
from tl_query_lens.readout.protocols import readout_diagnostics
from tl_query_lens.readout.registry import cached_sae_path, describe_fit_source, fit_source, register_releases
from tl_query_lens.readout.sae import ReadoutSAE, ReadoutSAEConfig
from tl_query_lens.readout.states import StateBank, collect_states, logit_lens

register_releases()

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
