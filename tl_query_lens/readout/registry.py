"""SAELens ``SAE.from_pretrained(release, sae_id)`` for this project's readout SAEs (docs/design.md §6).

The releases listed in ``releases.json`` (shipped with the package), and every model with a readout fit in the user
cache, are registered on import as a :class:`tl_query_lens.releases.LocalReleases` family with the loader
``"tlql_readout"``: it reads a dictionary fitted locally into ``cache_dir()/readout``, else tries the release's hub
repo (when one is listed and reachable), else raises an error that lists the cached ids and says how to fit the
missing one. The package ships ``small`` (the default preset's fit) for the embedded model. Ids are read from the
cache at each lookup, so every cached fit — ``small``, ``quick``
(``tlql demo --quick``), ``paper``, or any ``--sae-id`` given to ``tlql readout fit`` — is reachable, also when it was
fitted after this process registered the releases.
"""

from __future__ import annotations

import hashlib
import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch

from tl_query_lens.readout.config import RELEASE_PREFIX
from tl_query_lens.releases import LocalReleases, ReleaseIds

LOADER_NAME = "tlql_readout"


def shipped_releases() -> dict[str, dict[str, Any]]:
    """The release list shipped in the package (``tl_query_lens/readout/releases.json``)."""
    return json.loads(files("tl_query_lens.readout").joinpath("releases.json").read_text(encoding="utf-8"))


def fit_command(model_name: str, sae_id: str, preset: str | None = None) -> str:
    preset = preset or (sae_id if sae_id in ("small", "paper") else "small")
    return f"tlql readout fit --model {model_name} --preset {preset} --sae-id {sae_id}"


READOUT_RELEASES = LocalReleases(
    prefix=RELEASE_PREFIX,
    cache_subdir="readout",
    loader_name=LOADER_NAME,
    command=fit_command,
    shipped=shipped_releases,
    what="readout SAE",
    verb="Fit",
)


def release_name(model_name: str) -> str:
    return READOUT_RELEASES.release_name(model_name)


def cached_sae_path(model_name: str, sae_id: str) -> Path:
    """Where a locally fitted readout SAE of ``model_name`` lives: ``<cache>/readout/<release>/<sae_id>``."""
    return READOUT_RELEASES.cached_path(model_name, sae_id)


def cached_ids(model_name: str) -> list[str]:
    """The ids of the readout SAEs of ``model_name`` fitted into the user cache (folders holding a ``cfg.json``)."""
    return READOUT_RELEASES.cached_ids(model_name)


def fit_source(model_name: str, sae_id: str | None = None, sae_path: str | Path | None = None) -> dict[str, Any]:
    """Which readout fit a load of ``sae_path`` (a folder) or ``sae_id`` (the release) reads, in the release
    loader's order (user cache, then the package), and how it was fitted: ``{"where", "path", "weights_sha256",
    "readout_fit"}``; ``readout_fit`` is the provenance stored by :func:`~tl_query_lens.readout.fit.fit_readout`
    (empty for fits made before it was recorded). ``where`` is ``"folder"``, ``"user cache"``, ``"package"`` or
    ``"not found"``."""
    if sae_path is not None:
        folder, where = Path(sae_path).expanduser(), "folder"
    else:
        folder, where = cached_sae_path(model_name, sae_id or "small"), "user cache"
        if not (folder / "cfg.json").is_file():
            folder, where = READOUT_RELEASES.shipped_dir(model_name) / (sae_id or "small"), "package"
    if not (folder / "cfg.json").is_file():
        return {"where": "not found", "path": str(folder), "weights_sha256": None, "readout_fit": {}}
    cfg = json.loads((folder / "cfg.json").read_text(encoding="utf-8"))
    weights = sorted(folder.glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in weights:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return {
        "where": where,
        "path": str(folder),
        "weights_sha256": digest.hexdigest() if weights else None,
        "readout_fit": dict((cfg.get("metadata") or {}).get("readout_fit") or {}),
    }


def describe_fit_source(source: dict[str, Any], label: str) -> str:
    """One line saying which fit was read and how it was made (for ``tlql readout eval`` / ``tlql reproduce``)."""
    head = f"Readout SAE {label}: {source['where']} {source['path']}"
    if source["weights_sha256"]:
        head += f" (weights sha256 {source['weights_sha256'][:12]})"
    fit = source["readout_fit"]
    if not fit:
        return head + "; no fit provenance recorded (fitted before seed/threads/versions were kept)"
    config, versions = fit.get("config", {}), fit.get("versions", {})
    return (
        f"{head}; fitted {fit.get('started_utc', '?')}: seed {fit.get('seed')}, {fit.get('torch_threads')} torch "
        f"thread(s), {fit.get('steps_done', config.get('steps'))} of {config.get('steps')} steps, width "
        f"{config.get('width') or str(config.get('width_mult')) + '×d'}, k {config.get('k')}, torch "
        f"{versions.get('torch')}, sae-lens {versions.get('sae-lens')}, tl_query_lens {versions.get('tl_query_lens')}, "
        f"{fit.get('device')} ({fit.get('cpu_capability')})"
    )


def readout_loader(
    repo_id: str,
    folder_name: str,
    device: str = "cpu",
    force_download: bool = False,
    cfg_overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor | None]:
    """SAELens loader: ``folder_name`` is ``"<model>/<sae_id>"``; the user cache first, then the hub repo."""
    return READOUT_RELEASES.loader(repo_id, folder_name, device, force_download, cfg_overrides)


def register_releases(extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Add the shipped, cached (and ``extra``) readout releases to SAELens' pretrained directory; returns their names."""
    return READOUT_RELEASES.register(extra)


__all__ = [
    "READOUT_RELEASES",
    "ReleaseIds",
    "cached_ids",
    "cached_sae_path",
    "describe_fit_source",
    "fit_command",
    "fit_source",
    "readout_loader",
    "register_releases",
    "release_name",
    "shipped_releases",
]


register_releases()  # importing this module registers the releases (the package lists it in its `first` modules)
