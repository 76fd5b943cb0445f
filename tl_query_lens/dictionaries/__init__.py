"""Dictionaries as one key–value view; FF-KV registered with SAELens when a name of this package is first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "FFKV": "tl_query_lens.dictionaries.ffkv",
    "FFKVSAE": "tl_query_lens.dictionaries.ffkv",
    "FFKVSAEConfig": "tl_query_lens.dictionaries.ffkv",
    "mlp_read_hook": "tl_query_lens.dictionaries.ffkv",
    "KeyValueView": "tl_query_lens.dictionaries.key_value",
    "as_key_value": "tl_query_lens.dictionaries.key_value",
    "validate_view": "tl_query_lens.dictionaries.key_value",
    "topk_mask": "tl_query_lens.primitives",
}
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

if TYPE_CHECKING:
    from tl_query_lens.dictionaries.ffkv import FFKV, FFKVSAE, FFKVSAEConfig, mlp_read_hook
    from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value, validate_view
    from tl_query_lens.primitives import topk_mask

__getattr__ = lazy_package(__name__, _EXPORTS, first=("tl_query_lens.dictionaries.ffkv",))
