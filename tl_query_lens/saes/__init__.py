"""Trained sparse dictionaries of the embedded model: TopK residual SAEs and TopK transcoders (docs/saes.md)."""

from tl_query_lens.saes import transcoder as _transcoder  # noqa: F401  (registers "topk_transcoder")
from tl_query_lens.saes.registry import SAES_RELEASES, register_releases, sae_id
from tl_query_lens.saes.transcoder import TopKTranscoder, TopKTranscoderConfig

register_releases()

__all__ = ["SAES_RELEASES", "TopKTranscoder", "TopKTranscoderConfig", "register_releases", "sae_id"]
