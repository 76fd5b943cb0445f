"""The static site: data as JavaScript files (``<script src>`` loads them from file://, where ``fetch`` is blocked),
the page's HTML, CSS and JavaScript copied from ``static/``, and the search index.

Layout of ``out/``::

    index.html  atlas.js  atlas.css         the application (hash routes: #d/<slug>[/<page>], #f/<slug>/<feature>, #q/<text>)
    data/index.js                            ATLAS.index({...}): model, dictionaries, their pages' tables
    data/search.js                           ATLAS.search({...}): token string → features, ranked by weight
    data/<slug>/<start>.js                   ATLAS.shard("<slug>", <start>, {strings, features})
    shards/<slug>/<start>.json               the same shard for Python (exports, resuming), with its fingerprint
    meta/<slug>/<start>.json                 its fingerprint, feature ids, search postings and sizes (resuming, the index)
    operators/                               the Query Lens operators (``operator_cache``), reused by later builds
    exports/stamps/<slug>.json               the shards a dictionary's exports were written from (not rewritten)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

from tl_query_lens.results import atomic_write_text

STATIC = ("index.html", "atlas.js", "atlas.css")


def js_call(function: str, *args: Any) -> str:
    """``ATLAS.<function>(args…);`` with JSON arguments (``</`` escaped so a token cannot close a script tag)."""
    body = ",".join(json.dumps(a, separators=(",", ":"), ensure_ascii=False, allow_nan=False) for a in args)
    safe = body.replace("</", "<\\/")
    return f"ATLAS.{function}({safe});\n"


def shard_paths(out: Path, slug: str, start: int) -> tuple[Path, Path]:
    """``(data/<slug>/<start>.js, shards/<slug>/<start>.json)``."""
    return out / "data" / slug / f"{start}.js", out / "shards" / slug / f"{start}.json"


def _meta_path(out: Path, slug: str, start: int) -> Path:
    return out / "meta" / slug / f"{start}.json"


def write_shard(out: Path, slug: str, start: int, strings: list[str], features: list[dict], meta: dict) -> None:
    """The JSON copy first, then the JavaScript, then the small ``meta/<slug>/<start>.json`` (``meta`` plus the JavaScript file's
    raw and gzip sizes): a shard whose JavaScript is missing is redone; a missing sidecar is rebuilt from the JSON."""
    js, raw = shard_paths(out, slug, start)
    payload = {"strings": strings, "features": features}
    body = json.dumps({**meta, **payload}, separators=(",", ":"), ensure_ascii=False)
    atomic_write_text(raw, body)
    text = js_call("shard", slug, start, payload)
    atomic_write_text(js, text)
    _write_meta(out, slug, start, meta, text.encode("utf-8"), body.encode("utf-8"))


def _write_meta(out: Path, slug: str, start: int, meta: dict, js_bytes: bytes, raw_bytes: bytes) -> dict:
    """The sidecar: ``meta``'s keys, the JavaScript's sizes, and the SHA-256 of both shard files (a resume reuses
    a shard only when both files still match: a truncated or edited file is rebuilt)."""
    sizes = {
        "js_bytes": len(js_bytes),
        "js_gzip_bytes": len(gzip.compress(js_bytes, 6)),
        "js_sha256": hashlib.sha256(js_bytes).hexdigest(),
        "json_sha256": hashlib.sha256(raw_bytes).hexdigest(),
    }
    record = {**{k: meta[k] for k in META_KEYS if k in meta}, **sizes}
    atomic_write_text(_meta_path(out, slug, start), json.dumps(record, separators=(",", ":"), ensure_ascii=False))
    return record


#: What a shard's ``meta/`` file holds besides the sizes: enough to decide whether it is finished and to build the
#: search index without reading the shard's features.
META_KEYS = ("fingerprint", "ids", "postings", "n_positions")


def read_shard(out: Path, slug: str, start: int) -> dict | None:
    """A finished shard's JSON (None when it is missing or unfinished)."""
    js, raw = shard_paths(out, slug, start)
    if not (js.is_file() and raw.is_file()):
        return None
    try:
        return json.loads(raw.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_shard_meta(out: Path, slug: str, start: int) -> dict | None:
    """A finished shard's ``meta/<slug>/<start>.json`` (None when the shard is missing or unfinished). A shard written before the
    sidecar existed is read once in full and given one."""
    js, raw = shard_paths(out, slug, start)
    if not (js.is_file() and raw.is_file()):
        return None
    path = _meta_path(out, slug, start)
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    shard = read_shard(out, slug, start)
    if shard is None or not all(k in shard for k in META_KEYS):
        return None
    return _write_meta(out, slug, start, shard, js.read_bytes(), raw.read_bytes())


def write_static(out: Path) -> None:
    """Copy the application files."""
    root = files("tl_query_lens.atlas").joinpath("static")
    for name in STATIC:
        atomic_write_text(out / name, root.joinpath(name).read_text(encoding="utf-8"))


def search_index(postings: dict[str, list[tuple[str, int, float]]]) -> dict[str, Any]:
    """``{"keys": [token…], "refs": [[dict_index, feature, weight, …]…], "dicts": [slug…]}``, keys sorted, each
    token's features best first."""
    slugs = sorted({slug for refs in postings.values() for slug, _, _ in refs})
    where = {s: i for i, s in enumerate(slugs)}
    keys = sorted(postings)
    refs = []
    for key in keys:
        ranked = sorted(postings[key], key=lambda r: (-r[2], where[r[0]], r[1]))
        refs.append([x for slug, f, w in ranked for x in (where[slug], f, w)])
    return {"dicts": slugs, "keys": keys, "refs": refs}


def feature_runs(ids: list[int]) -> list[list[int]]:
    """The built feature ids as ``[first, last]`` runs of consecutive ids, ascending (the index's ``built`` list: the
    dictionary page lists these and ← / → step through them, so no link leads to a feature that was not built)."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def free_bytes(folder: Path) -> int:
    """Free space where ``folder`` is (or would be created)."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free
