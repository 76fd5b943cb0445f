"""Dictionaries as one key–value view; FF-KV registered with SAELens on import."""

from tl_query_lens.dictionaries.ffkv import FFKV, FFKVSAE, FFKVSAEConfig, mlp_read_hook
from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value, validate_view
from tl_query_lens.primitives import topk_mask

__all__ = [
    "FFKV",
    "FFKVSAE",
    "FFKVSAEConfig",
    "KeyValueView",
    "as_key_value",
    "mlp_read_hook",
    "topk_mask",
    "validate_view",
]
