"""Neuronpedia-style feature JSON: logit lists from value signatures, key lists, module shares, activation examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tl_query_lens.query_lens.result import Signatures
from tl_query_lens.results import write_json


def _strings(sig: Signatures, which: str) -> list[list[str]]:
    strings = getattr(sig, f"{which}_strings", None)
    if strings is not None:
        return strings
    return [[str(t) for t in row] for row in getattr(sig, f"{which}_ids").tolist()]


def neuronpedia_features(
    value: Signatures,
    *,
    model_id: str,
    sae_id: str,
    key: Signatures | None = None,
    activations: dict[int, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One Neuronpedia-style record per feature of a value-signature result.

    ``pos_str``/``pos_values`` and ``neg_str``/``neg_values`` carry the value signature (the method that produced it
    is named in ``query_lens.value_method``, so a logit-lens and a Query Lens export are told apart); the key
    signature, per-module shares and max-activating examples (``{"tokens": [...], "values": [...]}``) go beside them.
    """
    for name, sig in (("value", value), ("key", key)):
        if sig is not None and not isinstance(sig, Signatures):
            raise TypeError(
                f"{name} must be a Signatures result (QueryLens.{name}_signatures), got {type(sig).__name__}."
            )
    if value.side != "value" or (key is not None and key.side != "key"):
        raise ValueError("Pass value signatures as value= and key signatures as key=.")
    if key is not None and key.feature_ids.tolist() != value.feature_ids.tolist():
        raise ValueError("Key and value signatures must cover the same features in the same order.")
    layer = value.hook.split(".")[1] if value.hook.startswith("blocks.") else value.hook
    pos, neg = _strings(value, "top"), _strings(value, "bottom")
    key_pos = _strings(key, "top") if key is not None else None
    records = []
    for row, feature in enumerate(value.feature_ids.tolist()):
        extra: dict[str, Any] = {"value_method": value.method, "value_hook": value.hook}
        if key is not None:
            extra.update(
                key_method=key.method,
                key_hook=key.hook,
                key_top_str=key_pos[row],  # type: ignore[index]
                key_top_values=key.top_scores[row].tolist(),
            )
        if value.module_shares is not None and value.module_names is not None:
            extra["module_shares"] = dict(zip(value.module_names, value.module_shares[row].tolist()))
        examples = (activations or {}).get(feature, [])
        records.append(
            {
                "modelId": model_id,
                "layer": f"{layer}-{sae_id}",
                "index": str(feature),
                "pos_str": pos[row],
                "pos_values": value.top_scores[row].tolist(),
                "neg_str": neg[row],
                "neg_values": value.bottom_scores[row].tolist(),
                "activations": [{**ex, "maxValue": max(ex.get("values", [0.0]), default=0.0)} for ex in examples],
                "query_lens": extra,
            }
        )
    return records


def export_neuronpedia(path: str | Path, records: list[dict[str, Any]]) -> Path:
    """Write the records as one JSON list (atomic)."""
    return write_json(path, records)
