"""Exports of a built atlas: Neuronpedia's bulk-import layout and circuit-tracer feature cards.

Neuronpedia (``exports/neuronpedia/v1/<modelId>/<sourceId>/``): the layout and columns of
:mod:`tl_query_lens.report.neuronpedia`. One ``Neuron`` row per feature, whose ``pos_str`` / ``neg_str`` carry the
logit-lens value signature (Neuronpedia's convention: weights only); one ``Activation`` row per context (the top
contexts, then the quantile-band examples with a ``binMin`` / ``binMax`` that holds them); the Query Lens signatures,
key signatures, module shares, links and readout tokens in the ``query_lens`` extras. The source id is the atlas slug
``"{layer}-{set}"``.

circuit-tracer (``exports/circuit-tracer/<set>/<cantor(layer, index)>.json``): one feature card per feature, in the
layout and semantics of :mod:`tl_query_lens.atlas.cards`.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

from tl_query_lens.atlas.cards import cantor, feature_card, place, uncantor
from tl_query_lens.atlas.config import BOT_CREATOR
from tl_query_lens.atlas.records import sig_round
from tl_query_lens.atlas.site import read_shard
from tl_query_lens.report.neuronpedia import (
    Release,
    SourceRows,
    activation_row,
    containing_bin,
    model_id,
    neuron_row,
    write_source,
)
from tl_query_lens.results import atomic_write_text


def _centres(edges: list[float]) -> list[float]:
    return [sig_round((a + b) / 2) for a, b in pairwise(edges)]


def _context_values(ctx: dict, scale: float) -> list[float]:
    return [sig_round(q * scale / 1000) for q in ctx["q"]]


def _neuron(mid: str, creator: str, source: str, hook: str, feature: dict, strings: list[str]) -> dict[str, Any]:
    value = feature.get("sig", {}).get("LL_VALUE", {})
    hist, logits = feature["hist"], feature.get("logit_hist", {"edges": [], "counts": []})
    return neuron_row(
        mid,
        source,
        feature["i"],
        creator=creator,
        hook=hook,
        max_act=feature["max"] if feature["max"] is not None else 0.0,
        pos=[(strings[s], v) for s, v in value.get("top", [])],
        neg=[(strings[s], v) for s, v in value.get("bottom", [])],
        frac_nonzero=feature["density"] or 0.0,
        freq_hist=(_centres(hist["edges"]), hist["counts"]),
        logits_hist=(_centres(logits["edges"]), logits["counts"]),
    )


def _activations(mid: str, creator: str, source: str, feature: dict, strings: list[str]) -> list[dict[str, Any]]:
    """The feature's top contexts, then its band examples with a bin that holds them."""
    scale = feature["scale"] or 1.0
    groups: list[tuple[tuple[float, float] | None, list[dict]]] = [(None, feature["top"])]
    for b in feature["bands"]:
        peaks = [max(_context_values(ctx, scale)) for ctx in b["ex"]]
        groups.append((containing_bin(b["lo"], b["hi"], peaks), b["ex"]))
    rows: list[dict[str, Any]] = []
    for band, contexts in groups:
        for ctx in contexts:
            tokens = [strings[t] for t in ctx["t"]]
            values = _context_values(ctx, scale)
            rows.append(
                activation_row(
                    mid,
                    source,
                    feature["i"],
                    len(rows),
                    tokens,
                    values,
                    creator=creator,
                    data_index=ctx["s"],
                    band=band,
                )
            )
    return rows


def _extras(mid: str, source: str, feature: dict, strings: list[str]) -> dict[str, Any]:
    sig = {
        name: {side: [[strings[s], v] for s, v in entry[side]] for side in ("top", "bottom") if side in entry}
        for name, entry in feature.get("sig", {}).items()
    }
    return {
        "modelId": mid,
        "layer": source,
        "index": str(feature["i"]),
        "signatures": sig,
        "module_shares": feature.get("shares", []),
        "links": feature.get("links", []),
        "readout_tokens": [[strings[s], v] for s, v in feature.get("readout", [])],
    }


def export_all(
    out: Path,
    model,
    entries: list[dict],
    fingerprints: dict[str, str] | None = None,
    *,
    creator: str = BOT_CREATOR,
    visibility: str = "PUBLIC",
) -> Path:
    """Write both exports of the atlas in ``out`` (``entries``: the index's dictionary entries); returns the
    Neuronpedia root (``exports/neuronpedia``, one ``v1/<modelId>/<sourceId>/`` folder per dictionary).

    ``creator`` / ``visibility``: the Neuronpedia user id and visibility of every row. ``fingerprints`` (slug → the
    inputs' fingerprint of its shards): a dictionary whose exports were written from the same shards with the same
    settings (``exports/stamps/<slug>.json``) is not written again, so adding a dictionary to a built atlas writes
    only its own files."""
    root = out / "exports" / "neuronpedia"
    mid = model_id(str(model.cfg.model_name))
    release = Release(model, f"tlql-atlas-{mid}", creator, visibility)
    for e in entries:
        rows = SourceRows(e["slug"], e["label"])
        stamp_path = out / "exports" / "stamps" / f"{e['slug']}.json"
        stamp = {
            "fingerprint": (fingerprints or {}).get(e["slug"]),
            "shards": e["shards"],
            "model": mid,
            "creator": creator,
            "visibility": visibility,
        }
        if stamp["fingerprint"] is not None and stamp_path.is_file():
            try:
                if json.loads(stamp_path.read_text(encoding="utf-8")) == stamp:
                    continue
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass
        stamp_path.unlink(missing_ok=True)
        set_name, layer = place(e["slug"]) or (e["slug"], 0)
        cards = out / "exports" / "circuit-tracer" / set_name
        cards.mkdir(parents=True, exist_ok=True)
        for old in cards.glob("*.json"):  # this layer's cards of an earlier build
            if old.stem.isdigit() and uncantor(int(old.stem))[0] == layer:
                old.unlink()
        for start, *_ in e["shards"]:
            shard = read_shard(out, e["slug"], start)
            assert shard is not None, f"shard {start} of {e['slug']} vanished during the export"
            strings = shard["strings"]
            for feature in shard["features"]:
                rows.features.append(_neuron(mid, creator, e["slug"], e["read_hook"], feature, strings))
                rows.activations.extend(_activations(mid, creator, e["slug"], feature, strings))
                rows.extras.append(_extras(mid, e["slug"], feature, strings))
                card = feature_card(e["slug"], feature, strings, _context_values)
                name = f"{cantor(layer, feature['i'])}.json"
                (cards / name).write_text(json.dumps(card, ensure_ascii=False, allow_nan=False), encoding="utf-8")
        write_source(root, release, rows)
        atomic_write_text(stamp_path, json.dumps(stamp))  # last: a stopped export is redone
    for stale in ("release.jsonl", "model.jsonl", "sourceset.jsonl", "source.jsonl"):
        (root / stale).unlink(missing_ok=True)  # the top-level files of the layout before the per-source one
    return root
