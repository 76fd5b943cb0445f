"""tl_query_lens: Query Lens, FF-KV, readout SAEs and certification for TransformerLens / SAELens."""

from tl_query_lens.certify import certify, certify_layers, shuffle_ablation
from tl_query_lens.corpus import load_corpus
from tl_query_lens.dictionaries import FFKV, FFKVSAE, FFKVSAEConfig, KeyValueView, as_key_value
from tl_query_lens.models import load_model
from tl_query_lens.query_lens import QueryLens, query_lens_reference
from tl_query_lens.readout import ReadoutSAE, ReadoutSAEConfig
from tl_query_lens.saes import TopKTranscoder  # registers "topk_transcoder" and the tlql-saes releases

__version__ = "0.1.0"

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
