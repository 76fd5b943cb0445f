"""Exports of a built atlas: Neuronpedia's bulk-import layout and circuit-tracer feature cards.

Neuronpedia (``exports/neuronpedia/``), columns as in Neuronpedia's database schema
(``apps/webapp/prisma/schema.prisma``: models ``SourceRelease``, ``Model``, ``SourceSet``, ``Source``, ``Neuron``,
``Activation``)::

    release.jsonl  model.jsonl  sourceset.jsonl  source.jsonl
    v1/<modelId>/<sourceId>/features/batch-<i>.jsonl.gz      one Neuron row per feature
    v1/<modelId>/<sourceId>/activations/batch-<i>.jsonl.gz   one Activation row per context
    v1/<modelId>/<sourceId>/query_lens/batch-<i>.jsonl.gz    Query Lens extras (Neuronpedia drops unknown keys)

The source id is ``"{layer}-{set}"`` (the atlas slug). ``pos_str`` / ``neg_str`` carry the logit-lens value signature
(Neuronpedia's convention: weights only); the Query Lens signatures, key signatures and module shares go to the
extras. Contexts are the atlas windows (``values`` in activation units, not rounded to the page's 1/1000 steps
beyond 4 significant digits).

circuit-tracer (``exports/circuit-tracer/<slug>/<index>.json``): one feature card per feature in the schema its
frontend reads (``index``, ``examples_quantiles``, ``top_logits``, ``bottom_logits``, ``act_min``, ``act_max``,
``quantile_values``, ``histogram``, ``activation_frequency``, plus ``transcoder_id``).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path
from typing import Any

from tl_query_lens.atlas.records import sig_round
from tl_query_lens.atlas.site import read_shard
from tl_query_lens.results import atomic_write_text

CREATOR = "tl_query_lens"
BATCH = 5000  # features per batch file, as in Neuronpedia's exports


def model_id(name: str) -> str:
    """Neuronpedia's model id: letters, digits, '-' and '_', lower case."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)


def _write_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(gzip.compress(_jsonl(rows).encode("utf-8"), 6, mtime=0))
    tmp.replace(path)


def _centres(edges: list[float]) -> list[float]:
    return [sig_round((a + b) / 2) for a, b in itertools.pairwise(edges)]


def _context_values(ctx: dict, scale: float) -> list[float]:
    return [sig_round(q * scale / 1000) for q in ctx["q"]]


def neuron_row(mid: str, source: str, hook: str, feature: dict, strings: list[str]) -> dict[str, Any]:
    """One Neuronpedia ``Neuron`` row."""
    value = feature.get("sig", {}).get("LL_VALUE", {})
    hist, logits = feature["hist"], feature.get("logit_hist", {"edges": [], "counts": []})
    return {
        "modelId": mid,
        "layer": source,
        "index": str(feature["i"]),
        "sourceSetName": source.split("-", 1)[1],
        "creatorId": CREATOR,
        "hookName": hook,
        "maxActApprox": feature["max"] if feature["max"] is not None else 0.0,
        "pos_str": [strings[s] for s, _ in value.get("top", [])],
        "pos_values": [v for _, v in value.get("top", [])],
        "neg_str": [strings[s] for s, _ in value.get("bottom", [])],
        "neg_values": [v for _, v in value.get("bottom", [])],
        "frac_nonzero": feature["density"] or 0.0,
        "freq_hist_data_bar_heights": [float(c) for c in hist["counts"]],
        "freq_hist_data_bar_values": _centres(hist["edges"]),
        "logits_hist_data_bar_heights": [float(c) for c in logits["counts"]],
        "logits_hist_data_bar_values": _centres(logits["edges"]),
    }


def activation_rows(mid: str, source: str, feature: dict, strings: list[str]) -> list[dict[str, Any]]:
    """Neuronpedia ``Activation`` rows of a feature: its top contexts, then its band examples (with their bin)."""
    rows = []
    scale = feature["scale"] or 1.0
    groups = [(None, feature["top"])] + [(band, band["ex"]) for band in feature["bands"]]
    for band, contexts in groups:
        for ctx in contexts:
            values = _context_values(ctx, scale)
            row = {
                "tokens": [strings[t] for t in ctx["t"]],
                "values": values,
                "index": str(feature["i"]),
                "layer": source,
                "modelId": mid,
                "dataIndex": str(ctx["s"]),
                "maxValue": max(values),
                "maxValueTokenIndex": int(ctx["m"]),
                "minValue": min(values),
                "creatorId": CREATOR,
            }
            if band is not None:
                row.update(binMin=band["lo"], binMax=band["hi"])
            rows.append(row)
    return rows


def query_lens_row(mid: str, source: str, feature: dict, strings: list[str]) -> dict[str, Any]:
    """The extras of one feature: every signature, module shares, links and readout tokens."""
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


def feature_card(slug: str, feature: dict, strings: list[str]) -> dict[str, Any]:
    """circuit-tracer's feature card of one feature."""
    scale = feature["scale"] or 1.0

    def example(ctx: dict) -> dict[str, Any]:
        return {
            "tokens": [strings[t] for t in ctx["t"]],
            "tokens_acts_list": _context_values(ctx, scale),
            "train_token_ind": int(ctx["m"]),
            "is_repeated_datapoint": False,
        }

    quantiles = [{"quantile_name": "Top activations", "examples": [example(c) for c in feature["top"]]}]
    quantiles += [{"quantile_name": b["name"], "examples": [example(c) for c in b["ex"]]} for b in feature["bands"]]
    value = feature.get("sig", {}).get("QL_VALUE") or feature.get("sig", {}).get("LL_VALUE") or {}
    return {
        "transcoder_id": slug,
        "index": int(feature["i"]),
        "examples_quantiles": quantiles,
        "top_logits": [strings[s] for s, _ in value.get("top", [])],
        "bottom_logits": [strings[s] for s, _ in value.get("bottom", [])],
        "act_min": feature["min"] if feature["min"] is not None else 0.0,
        "act_max": feature["max"] if feature["max"] is not None else 0.0,
        "quantile_values": [b["lo"] for b in feature["bands"]],
        "histogram": [float(c) for c in feature["hist"]["counts"]],
        "activation_frequency": feature["density"] or 0.0,
    }


def export_all(out: Path, model, entries: list[dict]) -> Path:
    """Write both exports of the atlas in ``out`` (``entries``: the index's dictionary entries)."""
    mid = model_id(str(model.cfg.model_name))
    root = out / "exports" / "neuronpedia"
    release = f"tlql-atlas-{mid}"
    sets = sorted({e["slug"].split("-", 1)[1] for e in entries})
    top = {
        "release.jsonl": [
            {
                "name": release,
                "description": "tl_query_lens feature atlas",
                "creatorName": CREATOR,
                "creatorId": CREATOR,
                "urls": [],
            }
        ],
        "model.jsonl": [
            {
                "id": mid,
                "displayName": str(model.cfg.model_name),
                "displayNameShort": mid,
                "creatorId": CREATOR,
                "tlensId": str(model.cfg.model_name),
                "dimension": model.cfg.d_model,
                "layers": model.cfg.n_layers,
                "neuronsPerLayer": model.cfg.d_mlp or 0,
                "owner": CREATOR,
            }
        ],
        "sourceset.jsonl": [
            {
                "modelId": mid,
                "name": s,
                "description": s,
                "creatorName": CREATOR,
                "creatorId": CREATOR,
                "releaseName": release,
                "urls": [],
            }
            for s in sets
        ],
        "source.jsonl": [
            {
                "id": e["slug"],
                "modelId": mid,
                "setName": e["slug"].split("-", 1)[1],
                "creatorId": CREATOR,
                "hasDashboards": True,
                "notes": e["label"],
            }
            for e in entries
        ],
    }
    for name, rows in top.items():
        atomic_write_text(root / name, _jsonl(rows))
    for e in entries:
        features, activations, extras = [], [], []
        cards = out / "exports" / "circuit-tracer" / e["slug"]
        for start, *_ in e["shards"]:
            shard = read_shard(out, e["slug"], start)
            strings = shard["strings"]
            for feature in shard["features"]:
                features.append(neuron_row(mid, e["slug"], e["read_hook"], feature, strings))
                activations.extend(activation_rows(mid, e["slug"], feature, strings))
                extras.append(query_lens_row(mid, e["slug"], feature, strings))
                card = feature_card(e["slug"], feature, strings)
                atomic_write_text(cards / f"{feature['i']}.json", json.dumps(card, ensure_ascii=False))
        base = root / "v1" / mid / e["slug"]
        for kind, rows in (("features", features), ("query_lens", extras)):
            for b in range(0, len(rows), BATCH):
                _write_gz(base / kind / f"batch-{b // BATCH}.jsonl.gz", rows[b : b + BATCH])
        per = [r for r in activations]
        # activation batches follow the feature batches: the rows of features [b*BATCH, (b+1)*BATCH)
        order = {str(f["index"]): i // BATCH for i, f in enumerate(features)}
        groups: dict[int, list[dict]] = {}
        for row in per:
            groups.setdefault(order[row["index"]], []).append(row)
        for b, rows in sorted(groups.items()):
            _write_gz(base / "activations" / f"batch-{b}.jsonl.gz", rows)
    return root
