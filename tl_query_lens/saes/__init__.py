"""Trained sparse dictionaries of the embedded model: TopK residual SAEs and TopK transcoders (docs/saes.md).

The first name used from this package registers the SAELens architecture ``"topk_transcoder"`` and the ``tlql-saes-*``
releases (``import tl_query_lens.saes.config`` alone imports no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "SAES_RELEASES": "tl_query_lens.saes.registry",
    "register_releases": "tl_query_lens.saes.registry",
    "sae_id": "tl_query_lens.saes.registry",
    "TopKTranscoder": "tl_query_lens.saes.transcoder",
    "TopKTranscoderConfig": "tl_query_lens.saes.transcoder",
}
__all__ = [
    "SAES_RELEASES",
    "TopKTranscoder",
    "TopKTranscoderConfig",
    "register_releases",
    "sae_id",
]

if TYPE_CHECKING:
    from tl_query_lens.saes.registry import SAES_RELEASES, register_releases, sae_id
    from tl_query_lens.saes.transcoder import TopKTranscoder, TopKTranscoderConfig

__getattr__ = lazy_package(
    __name__,
    _EXPORTS,
    first=(
        "tl_query_lens.saes.registry",
        "tl_query_lens.saes.transcoder",
    ),
)
