"""Certification by proxy patching (docs/design.md §7, arXiv 2606.18383): risk bound, layer sweeps, shuffle ablation."""

from tl_query_lens.certify.certify import Certificate, CertifyConfig, certify
from tl_query_lens.certify.losses import Splice, smoothed_loss_bits
from tl_query_lens.certify.sweep import LayerSweep, ShuffleAblation, certify_layers, shuffle_ablation

__all__ = [
    "Certificate",
    "CertifyConfig",
    "LayerSweep",
    "ShuffleAblation",
    "Splice",
    "certify",
    "certify_layers",
    "shuffle_ablation",
    "smoothed_loss_bits",
]
