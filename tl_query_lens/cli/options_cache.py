"""Fast start-up: a subcommand's configured parser is kept in the user cache, so ``tlql <command> --help`` and
argument errors answer without importing the configs (which import torch, TransformerLens and SAELens).

The options of a subcommand are made from its config dataclasses (:mod:`tl_query_lens.cli.options`), which live
beside their methods and import torch. The first time a subcommand is parsed its parser is configured as usual and
then pickled to ``<cache>/cli/<command>-<key>.pickle``; later runs load it instead. The key hashes the source of
every module of this package, the Python version and the versions of the libraries whose values can reach a
config, so any edit or upgrade configures afresh (and the stale files are removed); a file that cannot be read is
ignored. ``TLQL_NO_OPTIONS_CACHE=1`` turns the cache off. The numeric ranges of the options travel with the parser
(``tlql_ranges``, recorded by ``add_options`` from each config's ``RANGES``), so :func:`check_ranges` refuses an
out-of-range number before any config is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import math
import os
import pickle
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from tl_query_lens.cli.subcommand import configure

_IDENTITY = "argparse-identity"
_VERSIONED = ("torch", "transformer_lens", "sae_lens")


def _cache_root() -> Path:
    """As :func:`tl_query_lens.models.cache_dir` (which imports torch): ``$TLQL_CACHE`` or the XDG cache."""
    root = os.environ.get("TLQL_CACHE")
    if root:
        return Path(root) / "cli"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tl_query_lens" / "cli"


@cache
def source_key() -> str:
    """Hash of this package's Python sources, the Python version and the versions of the heavy libraries."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    for name in _VERSIONED:  # an upgrade rewrites the package's __init__.py (importlib.metadata is slow to import)
        with contextlib.suppress(ImportError, ValueError, OSError, AttributeError):
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:  # not installed
                continue
            stat = os.stat(spec.origin)
            digest.update(f"{name}:{spec.origin}:{stat.st_mtime_ns}:{stat.st_size}".encode())
    return digest.hexdigest()[:16]


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> str | None:  # argparse registers a local function (not picklable)
        return _IDENTITY if getattr(obj, "__qualname__", "") == "ArgumentParser.__init__.<locals>.identity" else None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        if pid != _IDENTITY:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return argparse.ArgumentParser()._registries["type"][None]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def configure_cached(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """Configure subcommand ``name`` of ``parser``: from the cache when it holds this source's parser, else by
    importing its configs (then cached). Returns the subcommand's parser."""
    action = _subparsers(parser)
    sub = action.choices[name]
    if "tlql_configure" not in sub.__dict__:
        return sub
    path = None
    if not os.environ.get("TLQL_NO_OPTIONS_CACHE"):
        with contextlib.suppress(OSError):
            path = _cache_root() / f"{name}-{source_key()}.pickle"
    if path is not None and path.is_file():
        try:
            cached = _Unpickler(io.BytesIO(path.read_bytes())).load()
        except Exception:  # noqa: BLE001  (a cache that cannot be read is rebuilt, never fatal)
            cached = None
        if isinstance(cached, argparse.ArgumentParser):
            action.choices[name] = cached
            return cached
    configure(sub)
    if path is not None:
        _store(path, sub, name)
    return sub


def _store(path: Path, sub: argparse.ArgumentParser, name: str) -> None:
    """Write the pickle atomically; remove this command's files of other sources. Failures only cost speed."""
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(sub)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(buffer.getvalue())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for old in path.parent.glob(f"{name}-*.pickle"):
            if old != path:
                old.unlink(missing_ok=True)


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first parsed number outside its option's range, as a message naming the option; None when all fit."""
    from tl_query_lens.config import describe_interval, in_interval

    sub = _subparsers(parser).choices.get(getattr(args, "command", None) or "")
    nested = [a for a in (sub._actions if sub else []) if isinstance(a, argparse._SubParsersAction)]
    if nested and getattr(args, "action", None):
        sub = nested[0].choices.get(args.action)
    for dest, interval in (getattr(sub, "tlql_ranges", None) or {}).items():
        value = getattr(args, dest, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # None (the default), or a list checked by its config
        if not (math.isfinite(value) and in_interval(value, interval)):
            flag = "--" + dest.replace("_", "-")
            return f"{flag} must {describe_interval(interval, value)}, got {value!r}."
    return None
