"""tl_query_lens: Query Lens, FF-KV, readout SAEs and certification for TransformerLens / SAELens.

The public names below load on first use (``tl_query_lens.FFKV`` imports torch, TransformerLens and SAELens then),
so ``import tl_query_lens`` and the ``tlql`` command line start at once. The first public name used imports all of
the modules in :data:`REGISTERING`, which register this package's SAELens architectures (``ffkv``, ``readout``,
``topk_transcoder``) and its local releases, as importing the package did before (:mod:`tl_query_lens.lazy`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

__version__ = "0.1.0"

_EXPORTS = {
    "certify": "tl_query_lens.certify.certify",
    "certify_layers": "tl_query_lens.certify.sweep",
    "shuffle_ablation": "tl_query_lens.certify.sweep",
    "load_corpus": "tl_query_lens.corpus",
    "FFKV": "tl_query_lens.dictionaries.ffkv",
    "FFKVSAE": "tl_query_lens.dictionaries.ffkv",
    "FFKVSAEConfig": "tl_query_lens.dictionaries.ffkv",
    "KeyValueView": "tl_query_lens.dictionaries.key_value",
    "as_key_value": "tl_query_lens.dictionaries.key_value",
    "load_model": "tl_query_lens.models",
    "QueryLens": "tl_query_lens.query_lens.lens",
    "query_lens_reference": "tl_query_lens.query_lens.reference",
    "ReadoutSAE": "tl_query_lens.readout.sae",
    "ReadoutSAEConfig": "tl_query_lens.readout.sae",
    "TopKTranscoder": "tl_query_lens.saes.transcoder",
}
#: The modules that register this package's SAELens architectures (``ffkv``, ``readout``, ``topk_transcoder``), its
#: local releases (``tlql-readout-*``, ``tlql-saes-*``) and the methods ``ReadoutSAE.fit`` / ``.decompose`` when
#: they are imported; the first public name read imports them all.
REGISTERING = (
    "tl_query_lens.dictionaries.ffkv",
    "tl_query_lens.readout.registry",
    "tl_query_lens.readout.fit",
    "tl_query_lens.readout.decompose",
    "tl_query_lens.saes.registry",
    "tl_query_lens.saes.transcoder",
)

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
    from tl_query_lens.certify.certify import certify
    from tl_query_lens.certify.sweep import certify_layers, shuffle_ablation
    from tl_query_lens.corpus import load_corpus
    from tl_query_lens.dictionaries.ffkv import FFKV, FFKVSAE, FFKVSAEConfig
    from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value
    from tl_query_lens.models import load_model
    from tl_query_lens.query_lens.lens import QueryLens
    from tl_query_lens.query_lens.reference import query_lens_reference
    from tl_query_lens.readout.sae import ReadoutSAE, ReadoutSAEConfig
    from tl_query_lens.saes.transcoder import TopKTranscoder


def load_all() -> None:
    """Import every public name (and so register the SAELens architectures and releases of this package)."""
    for name in _EXPORTS:
        getattr(sys.modules[__name__], name)


__getattr__ = lazy_package(__name__, _EXPORTS, first=REGISTERING)
