"""Readout SAEs (Sparse Readout Prism, DESIGN §6): a sparse dictionary of the LM head's rows and exact score decomposition."""

from tl_query_lens.readout.fit import ReadoutFit, ReadoutFitConfig, fit_readout
from tl_query_lens.readout.sae import ReadoutSAE, ReadoutSAEConfig
from tl_query_lens.readout.states import StateBank, collect_states, logit_lens

__all__ = [
    "ReadoutFit",
    "ReadoutFitConfig",
    "ReadoutSAE",
    "ReadoutSAEConfig",
    "StateBank",
    "collect_states",
    "fit_readout",
    "logit_lens",
]
