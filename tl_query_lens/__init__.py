"""tl_query_lens: Query Lens, FF-KV, readout SAEs and certification for TransformerLens / SAELens.

The public names below load on first use (``tl_query_lens.FFKV`` imports torch, TransformerLens and SAELens then),
so ``import tl_query_lens`` and the ``tlql`` command line start at once. The first public name used imports all of
them, which registers this package's SAELens architectures (``ffkv``, ``readout``, ``topk_transcoder``) and its
local releases, as importing the package did before.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "certify": "tl_query_lens.certify",
    "certify_layers": "tl_query_lens.certify",
    "shuffle_ablation": "tl_query_lens.certify",
    "load_corpus": "tl_query_lens.corpus",
    "FFKV": "tl_query_lens.dictionaries",
    "FFKVSAE": "tl_query_lens.dictionaries",
    "FFKVSAEConfig": "tl_query_lens.dictionaries",
    "KeyValueView": "tl_query_lens.dictionaries",
    "as_key_value": "tl_query_lens.dictionaries",
    "load_model": "tl_query_lens.models",
    "QueryLens": "tl_query_lens.query_lens",
    "query_lens_reference": "tl_query_lens.query_lens",
    "ReadoutSAE": "tl_query_lens.readout",
    "ReadoutSAEConfig": "tl_query_lens.readout",
    "TopKTranscoder": "tl_query_lens.saes",  # registers "topk_transcoder" and the tlql-saes releases
}

__all__ = [
    "FFKV",
    "FFKVSAE",
    "FFKVSAEConfig",
    "KeyValueView",
    "QueryLens",
    "ReadoutSAE",
    "ReadoutSAEConfig",
    "TopKTranscoder",
    "as_key_value",
    "certify",
    "certify_layers",
    "load_corpus",
    "load_model",
    "query_lens_reference",
    "shuffle_ablation",
]

if TYPE_CHECKING:
    from tl_query_lens.certify import certify, certify_layers, shuffle_ablation
    from tl_query_lens.corpus import load_corpus
    from tl_query_lens.dictionaries import FFKV, FFKVSAE, FFKVSAEConfig, KeyValueView, as_key_value
    from tl_query_lens.models import load_model
    from tl_query_lens.query_lens import QueryLens, query_lens_reference
    from tl_query_lens.readout import ReadoutSAE, ReadoutSAEConfig
    from tl_query_lens.saes import TopKTranscoder


def load_all() -> None:
    """Import every public name (and so register the SAELens architectures and releases of this package)."""
    for name, module in _EXPORTS.items():
        globals().setdefault(name, getattr(importlib.import_module(module), name))


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tl_query_lens' has no attribute {name!r}")
    load_all()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # importing the subpackage ``certify`` must not hide the function ``certify``
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
