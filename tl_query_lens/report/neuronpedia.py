"""Neuronpedia's bulk-import layout: the rows of its ``Neuron`` and ``Activation`` tables, in batch JSONL.gz files.

Column names follow Neuronpedia's database schema (``apps/webapp/prisma/schema.prisma`` of
github.com/hijohnnylin/neuronpedia, models ``SourceRelease``, ``Model``, ``SourceSet``, ``Source``, ``Neuron`` and
``Activation``). Activations are rows of their own (never nested in a feature), each with ``maxValue``,
``maxValueTokenIndex``, ``minValue`` and ``creatorId``. Neuronpedia drops keys it does not know, so the Query Lens
extras (every signature, key signatures, module shares, links) go to a separate ``query_lens`` batch.

Layout written by :func:`write_bulk` under ``root``::

    release.jsonl  model.jsonl  sourceset.jsonl  source.jsonl
    v1/<modelId>/<sourceId>/features/batch-<i>.jsonl.gz
    v1/<modelId>/<sourceId>/activations/batch-<i>.jsonl.gz
    v1/<modelId>/<sourceId>/query_lens/batch-<i>.jsonl.gz

The source id is ``"{layer}-{set}"`` (e.g. ``12-ffkv``); feature ``index`` is a string. The atlas
(:mod:`tl_query_lens.atlas.exports`) fills it from its shards.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tl_query_lens.results import atomic_write_text

CREATOR = "tl_query_lens"
BATCH = 5000  # features per batch file, as in Neuronpedia's own exports


def model_id(name: str) -> str:
    """Neuronpedia's model id: letters, digits, '-' and '_', lower case."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)


def write_gz(path: Path, rows: list[dict]) -> Path:
    """Rows as gzip-compressed JSONL (written through a temporary file; no timestamp, so reruns give equal bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(gzip.compress(jsonl(rows).encode("utf-8"), 6, mtime=0))
    tmp.replace(path)
    return path


@dataclass
class SourceRows:
    """The rows of one source (dictionary): ``features`` (Neuron), ``activations`` (Activation), ``extras``."""

    source_id: str
    label: str
    features: list[dict[str, Any]] = field(default_factory=list)
    activations: list[dict[str, Any]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)


def neuron_row(
    mid: str,
    source: str,
    index: int,
    *,
    hook: str,
    max_act: float,
    pos: list[tuple[str, float]],
    neg: list[tuple[str, float]],
    frac_nonzero: float,
    freq_hist: tuple[list[float], list[float]],
    logits_hist: tuple[list[float], list[float]],
) -> dict[str, Any]:
    """One ``Neuron`` row; ``freq_hist`` / ``logits_hist`` are ``(bar values, bar heights)``."""
    return {
        "modelId": mid,
        "layer": source,
        "index": str(index),
        "sourceSetName": source.split("-", 1)[1],
        "creatorId": CREATOR,
        "hookName": hook,
        "maxActApprox": max_act,
        "pos_str": [s for s, _ in pos],
        "pos_values": [v for _, v in pos],
        "neg_str": [s for s, _ in neg],
        "neg_values": [v for _, v in neg],
        "frac_nonzero": frac_nonzero,
        "freq_hist_data_bar_heights": [float(h) for h in freq_hist[1]],
        "freq_hist_data_bar_values": list(freq_hist[0]),
        "logits_hist_data_bar_heights": [float(h) for h in logits_hist[1]],
        "logits_hist_data_bar_values": list(logits_hist[0]),
    }


def activation_row(
    mid: str,
    source: str,
    index: int,
    tokens: list[str],
    values: list[float],
    *,
    data_index: int | None = None,
    band: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One ``Activation`` row: a context's tokens and the feature's activation at each (``band``: its quantile bin)."""
    if len(tokens) != len(values) or not values:
        raise ValueError(
            f"An activation row needs one value per token, got {len(tokens)} tokens, {len(values)} values."
        )
    peak = max(range(len(values)), key=values.__getitem__)
    row = {
        "tokens": tokens,
        "values": values,
        "index": str(index),
        "layer": source,
        "modelId": mid,
        "maxValue": values[peak],
        "maxValueTokenIndex": peak,
        "minValue": min(values),
        "creatorId": CREATOR,
    }
    if data_index is not None:
        row["dataIndex"] = str(data_index)
    if band is not None:
        row["binMin"], row["binMax"] = band
    return row


def write_bulk(root: str | Path, model, sources: list[SourceRows], *, release: str | None = None) -> Path:
    """Write the layout of the module docstring for ``sources`` of ``model`` (a TransformerLens model)."""
    root = Path(root)
    mid = model_id(str(model.cfg.model_name))
    release = release or f"tlql-{mid}"
    sets = sorted({s.source_id.split("-", 1)[1] for s in sources})
    top = {
        "release.jsonl": [
            {
                "name": release,
                "description": "tl_query_lens dictionaries",
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
                "id": s.source_id,
                "modelId": mid,
                "setName": s.source_id.split("-", 1)[1],
                "creatorId": CREATOR,
                "hasDashboards": True,
                "notes": s.label,
            }
            for s in sources
        ],
    }
    for name, rows in top.items():
        atomic_write_text(root / name, jsonl(rows))
    for s in sources:
        if s.features:
            write_source(root, mid, s)
    return root


def write_source(root: str | Path, mid: str, s: SourceRows) -> Path:
    """The ``v1/<model>/<source>/`` batch files of one source (replacing any there before); returns that folder."""
    base = Path(root) / "v1" / mid / s.source_id
    if base.is_dir():
        shutil.rmtree(base)
    batch_of = {row["index"]: i // BATCH for i, row in enumerate(s.features)}
    for kind, rows in (("features", s.features), ("query_lens", s.extras)):
        for b in range(0, len(rows), BATCH):
            write_gz(base / kind / f"batch-{b // BATCH}.jsonl.gz", rows[b : b + BATCH])
    groups: dict[int, list[dict]] = {}
    for row in s.activations:  # the activations of the features of feature batch i go to batch i
        groups.setdefault(batch_of.get(row["index"], 0), []).append(row)
    for b, rows in sorted(groups.items()):
        write_gz(base / "activations" / f"batch-{b}.jsonl.gz", rows)
    return base
