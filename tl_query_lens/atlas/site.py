"""The static site: data as JavaScript files (``<script src>`` loads them from file://, where ``fetch`` is blocked),
the page's HTML, CSS and JavaScript copied from ``static/``, and the search index.

Layout of ``out/``::

    index.html  atlas.js  atlas.css         the application (hash routes: #d/<slug>, #f/<slug>/<feature>, #q/<text>)
    data/index.js                            ATLAS.index({...}): model, dictionaries, their pages' tables
    data/search.js                           ATLAS.search({...}): token string → features, ranked by weight
    data/<slug>/<start>.js                   ATLAS.shard("<slug>", <start>, {strings, features})
    shards/<slug>/<start>.json               the same shard for Python (exports, resuming), with its fingerprint
"""

from __future__ import annotations

import json
import os
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


def write_shard(out: Path, slug: str, start: int, strings: list[str], features: list[dict], meta: dict) -> None:
    """The JSON copy first, the JavaScript last: a shard whose JSON exists but whose JS does not is redone."""
    js, raw = shard_paths(out, slug, start)
    payload = {"strings": strings, "features": features}
    atomic_write_text(raw, json.dumps({**meta, **payload}, separators=(",", ":"), ensure_ascii=False))
    atomic_write_text(js, js_call("shard", slug, start, payload))


def read_shard(out: Path, slug: str, start: int) -> dict | None:
    """A finished shard's JSON (None when it is missing or unfinished)."""
    js, raw = shard_paths(out, slug, start)
    if not (js.is_file() and raw.is_file()):
        return None
    try:
        return json.loads(raw.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


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


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def free_bytes(folder: Path) -> int:
    """Free space where ``folder`` is (or would be created)."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def clear_partial(out: Path) -> None:
    """Remove temporary files a killed run left behind."""
    for tmp in out.rglob(".*.tmp"):
        try:
            os.remove(tmp)
        except OSError:
            pass
