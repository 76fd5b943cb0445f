"""Certification by proxy patching (docs/design.md §7, arXiv 2606.18383): risk bound, layer sweeps, shuffle ablation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "Certificate": "tl_query_lens.certify.certify",
    "certify": "tl_query_lens.certify.certify",
    "CertifyConfig": "tl_query_lens.certify.config",
    "Splice": "tl_query_lens.certify.losses",
    "smoothed_loss_bits": "tl_query_lens.certify.losses",
    "LayerSweep": "tl_query_lens.certify.sweep",
    "ShuffleAblation": "tl_query_lens.certify.sweep",
    "certify_layers": "tl_query_lens.certify.sweep",
    "shuffle_ablation": "tl_query_lens.certify.sweep",
}
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

if TYPE_CHECKING:
    from tl_query_lens.certify.certify import Certificate, certify
    from tl_query_lens.certify.config import CertifyConfig
    from tl_query_lens.certify.losses import Splice, smoothed_loss_bits
    from tl_query_lens.certify.sweep import LayerSweep, ShuffleAblation, certify_layers, shuffle_ablation

__getattr__ = lazy_package(__name__, _EXPORTS)
