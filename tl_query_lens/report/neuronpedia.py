"""Neuronpedia's bulk-import layout: one folder per source that a fresh instance's importer takes as it is.

Neuronpedia's importer (the webapp's admin import route) reads one source at a time from ``v1/<modelId>/<sourceId>/``:
the metadata ``release.jsonl``, ``model.jsonl``, ``sourceset.jsonl`` and ``source.jsonl`` (each line created through
the ORM, so only the table's own fields may appear), then every ``features/*.jsonl.gz`` into the ``Neuron`` table and
every ``activations/*.jsonl.gz`` into ``Activation`` by raw SQL. Its rules, which this module writes for:

* the columns of a batch are the keys of its **first line**: every activation line has the same keys, with ``null``
  where a field does not apply (``binMin`` / ``binMax`` of a top context, ``dataIndex`` when unknown);
* ``Activation.id`` is ``TEXT NOT NULL`` without a database default (the ``cuid()`` default lives in the ORM client),
  so every row carries an ``id``: cuid-shaped (``c`` + 24 base-36 characters) and derived from the row's place
  (model, source, feature, ordinal), so a rerun writes the same ids and a re-import skips rows it already holds;
* ``creatorId`` is a foreign key to ``User`` on every table: the default is the bot user that Neuronpedia's seed creates
  on a fresh instance (:data:`BOT_CREATOR`), which Neuronpedia's own exporters also default to;
* ``visibility`` defaults to ``PRIVATE`` in the schema, so the metadata rows say ``PUBLIC`` (configurable).

Column names follow Neuronpedia's database schema (``apps/webapp/prisma/schema.prisma`` of hijohnnylin/neuronpedia,
models ``SourceRelease``, ``Model``, ``SourceSet``, ``Source``, ``Neuron`` and ``Activation``). The Query Lens
extras (every signature, key signatures, module shares, links) go to a ``query_lens`` batch the importer ignores.

Layout written by :func:`write_source` under ``root``, per source::

    v1/<modelId>/<sourceId>/release.jsonl  model.jsonl  sourceset.jsonl  source.jsonl
    v1/<modelId>/<sourceId>/features/batch-<i>.jsonl.gz
    v1/<modelId>/<sourceId>/activations/batch-<i>.jsonl.gz
    v1/<modelId>/<sourceId>/query_lens/batch-<i>.jsonl.gz

The source id is ``"{layer}-{set}"`` (e.g. ``12-ffkv``); feature ``index`` is a string. The atlas
(:mod:`tl_query_lens.atlas.exports`) fills it from its shards.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tl_query_lens.atlas.config import BOT_CREATOR
from tl_query_lens.models import _ALIASES
from tl_query_lens.results import atomic_write_text

BATCH = 5000  # features per batch file, as in Neuronpedia's own exports
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
#: Display characters of :mod:`tl_query_lens.report.tokens` and the raw text they stand for.
_RAW = {"↵": "\n", "⇥": "\t", "␍": "\r"}


def model_id(name: str) -> str:
    """Neuronpedia's model id: the package's short name where it has one (as the releases are named), else the name
    with letters, digits, '-' and '_' only, lower case."""
    name = _ALIASES.get(name.lower(), name)
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")


def activation_id(*parts: object) -> str:
    """A cuid-shaped id (``c`` + 24 base-36 characters) that depends only on ``parts``."""
    number = int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode("utf-8")).digest()[:16], "big")
    digits = []
    for _ in range(24):
        number, rest = divmod(number, 36)
        digits.append(_BASE36[rest])
    return "c" + "".join(digits)


def raw_token(shown: str) -> str:
    """The text of a token as written for reading (:func:`tl_query_lens.report.tokens.readable`): newlines, tabs and
    carriage returns back as themselves, ``<0x07>``-style control characters as the character, ``∅`` as ''. Bytes of
    a partial UTF-8 character (``<0xE2>``) stay as written."""
    if shown == "∅":
        return ""
    text = "".join(_RAW.get(ch, ch) for ch in shown)
    return re.sub(r"<0x([01][0-9A-F]|7F)>", lambda m: chr(int(m.group(1), 16)), text)


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
class Release:
    """The metadata every source folder repeats: the model, the release name, the creator and the visibility."""

    model: Any  # a TransformerLens model (its cfg is read)
    name: str
    creator: str = BOT_CREATOR
    visibility: str = "PUBLIC"

    @property
    def model_id(self) -> str:
        return model_id(str(self.model.cfg.model_name))


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
    creator: str,
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
        "creatorId": creator,
        "hookName": hook,
        "maxActApprox": max_act,
        "pos_str": [raw_token(s) for s, _ in pos],
        "pos_values": [v for _, v in pos],
        "neg_str": [raw_token(s) for s, _ in neg],
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
    ordinal: int,
    tokens: list[str],
    values: list[float],
    *,
    creator: str,
    data_index: int | None = None,
    band: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One ``Activation`` row: a context's tokens (as written for reading; stored as raw text) and the feature's
    activation at each; ``ordinal``: the row's place among the feature's rows; ``band``: its quantile bin. Every row
    has the same keys (the importer takes a batch's columns from its first line)."""
    if len(tokens) != len(values) or not values:
        raise ValueError(
            f"An activation row needs one value per token, got {len(tokens)} tokens, {len(values)} values."
        )
    peak = max(range(len(values)), key=values.__getitem__)
    return {
        "id": activation_id(mid, source, index, ordinal),
        "tokens": [raw_token(t) for t in tokens],
        "values": values,
        "index": str(index),
        "layer": source,
        "modelId": mid,
        "dataIndex": None if data_index is None else str(data_index),
        "maxValue": values[peak],
        "maxValueTokenIndex": peak,
        "minValue": min(values),
        "creatorId": creator,
        "binMin": None if band is None else band[0],
        "binMax": None if band is None else band[1],
    }


def _up(x: float) -> float:
    """The next 4-significant-digit number above ``x``."""
    if x == 0:
        return 1e-4
    step = 10 ** (math.floor(math.log10(abs(x))) - 3)
    return float(f"{x + step:.4g}")


def containing_bin(lo: float, hi: float, peaks: list[float]) -> tuple[float, float]:
    """A bin ``[binMin, binMax)`` that holds the band ``[lo, hi]`` and every row maximum in ``peaks`` (the rows'
    values are quantised, so a row can sit on or just past the band's edge)."""
    low, top = min([lo, *peaks]), max([hi, *peaks])
    return low, (_up(top) if any(p >= top for p in peaks) else top)


def metadata(release: Release, source_id: str, label: str) -> dict[str, list[dict[str, Any]]]:
    """The four metadata files of one source folder (only fields of their tables: the importer creates them through
    the ORM, which rejects unknown fields)."""
    mid, cfg = release.model_id, release.model.cfg
    set_name = source_id.split("-", 1)[1]
    common = {"creatorId": release.creator, "visibility": release.visibility}
    return {
        "release.jsonl": [
            {"name": release.name, "description": "tl_query_lens dictionaries", "creatorName": "tl_query_lens"}
            | common
            | {"urls": []}
        ],
        "model.jsonl": [
            {
                "id": mid,
                "displayName": str(cfg.model_name),
                "displayNameShort": mid,
                "tlensId": str(cfg.model_name),
                "dimension": int(cfg.d_model),
                "layers": int(cfg.n_layers),
                "neuronsPerLayer": int(cfg.d_mlp or 0),
                "owner": "tl_query_lens",
            }
            | common
        ],
        "sourceset.jsonl": [
            {
                "modelId": mid,
                "name": set_name,
                "description": set_name,
                "creatorName": "tl_query_lens",
                "releaseName": release.name,
                "urls": [],
            }
            | common
        ],
        "source.jsonl": [
            {"id": source_id, "modelId": mid, "setName": set_name, "hasDashboards": True, "notes": label} | common
        ],
    }


def write_source(root: str | Path, release: Release, s: SourceRows) -> Path:
    """The folder ``v1/<model>/<source>/`` of one source (replacing any there before); returns that folder."""
    base = Path(root) / "v1" / release.model_id / s.source_id
    if base.is_dir():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    for name, rows in metadata(release, s.source_id, s.label).items():
        atomic_write_text(base / name, jsonl(rows))
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
