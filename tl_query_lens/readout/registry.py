"""SAELens ``SAE.from_pretrained(release, sae_id)`` for this project's readout SAEs (DESIGN §6).

SAELens 6.x resolves a release through ``get_pretrained_saes_directory()`` (a cached module-level dict of
``PretrainedSAELookup``) and loads it with ``NAMED_PRETRAINED_SAE_LOADERS[lookup.conversion_func]``. On import we add
the releases listed in ``releases.json`` (shipped with the package) to that dict, with the loader ``"tlql_readout"``:
it reads a dictionary fitted locally into the user cache (``tl_query_lens.models.cache_dir()/readout``), else tries
the release's hub repo (when one is listed and reachable), else raises an error that lists the cached ids and says
how to fit the missing one. A release's ids are read from the cache at each lookup, so every cached fit — ``cpu``,
``quick`` (``tlql demo --quick``), ``paper``, or any ``--sae-id`` given to ``tlql readout fit`` — is reachable, also
when it was fitted after this process registered the releases; models with a cached fit but no shipped entry get a
release too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from sae_lens.loading.pretrained_sae_loaders import NAMED_PRETRAINED_SAE_LOADERS, sae_lens_disk_loader
from sae_lens.loading.pretrained_saes_directory import PretrainedSAELookup, get_pretrained_saes_directory

logger = logging.getLogger(__name__)

LOADER_NAME = "tlql_readout"
RELEASE_PREFIX = "tlql-readout-"


def shipped_releases() -> dict[str, dict[str, Any]]:
    """The release list shipped in the package (``tl_query_lens/readout/releases.json``)."""
    return json.loads(files("tl_query_lens.readout").joinpath("releases.json").read_text(encoding="utf-8"))


def release_name(model_name: str) -> str:
    return RELEASE_PREFIX + model_name


def cached_sae_path(model_name: str, sae_id: str) -> Path:
    """Where a locally fitted readout SAE of ``model_name`` lives: ``<cache>/readout/<release>/<sae_id>``."""
    from tl_query_lens.models import cache_dir

    return cache_dir() / "readout" / release_name(model_name) / sae_id


def cached_ids(model_name: str) -> list[str]:
    """The ids of the readout SAEs of ``model_name`` fitted into the user cache (folders holding a ``cfg.json``)."""
    release_dir = cached_sae_path(model_name, "_").parent
    if not release_dir.is_dir():
        return []
    return sorted(p.name for p in release_dir.iterdir() if (p / "cfg.json").is_file())


def fit_command(model_name: str, sae_id: str, preset: str | None = None) -> str:
    preset = preset or (sae_id if sae_id in ("cpu", "paper") else "cpu")
    return f"tlql readout fit --model {model_name} --preset {preset} --sae-id {sae_id}"


class ReleaseIds(Mapping[str, str]):
    """``saes_map`` of a readout release (id → ``"<model>/<id>"``): the shipped ids plus the ones cached right now.

    Membership is granted to every id, so SAELens hands unknown ids to :func:`readout_loader`, whose error lists
    what is cached; iteration (``keys()``, ``list(...)``) gives the shipped and cached ids only.
    """

    def __init__(self, model_name: str, shipped: list[str]):
        self.model_name, self.shipped = model_name, list(shipped)

    def _ids(self) -> list[str]:
        return list(dict.fromkeys([*self.shipped, *cached_ids(self.model_name)]))

    def __contains__(self, sae_id: object) -> bool:
        return isinstance(sae_id, str) and bool(sae_id) and "/" not in sae_id

    def __getitem__(self, sae_id: str) -> str:
        if sae_id not in self:
            raise KeyError(sae_id)
        return f"{self.model_name}/{sae_id}"

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())


def readout_loader(
    repo_id: str,
    folder_name: str,
    device: str = "cpu",
    force_download: bool = False,
    cfg_overrides: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor | None]:
    """SAELens loader: ``folder_name`` is ``"<model>/<sae_id>"``; the user cache first, then the hub repo."""
    model_name, _, sae_id = folder_name.partition("/")
    local = cached_sae_path(model_name, sae_id)
    overrides = {k: v for k, v in (cfg_overrides or {}).items() if k in ("device", "dtype")}
    if (local / "cfg.json").exists() and not force_download:
        cfg, state = sae_lens_disk_loader(local, device=device, cfg_overrides=overrides)
        return cfg, state, None
    hub_error = "no hub repo is listed for it"
    if repo_id and not repo_id.startswith("local/"):
        try:
            from huggingface_hub import snapshot_download

            snap = Path(snapshot_download(repo_id, allow_patterns=[f"{folder_name}/*"], force_download=force_download))
            cfg, state = sae_lens_disk_loader(snap / folder_name, device=device, cfg_overrides=overrides)
            return cfg, state, None
        except (OSError, ValueError) as err:  # offline, missing repo or files
            hub_error = f"the hub repo {repo_id!r} was not reachable or lacks it ({type(err).__name__})"
    cached = ", ".join(cached_ids(model_name)) or "none yet"
    raise FileNotFoundError(
        f"No readout SAE {sae_id!r} for {model_name} in the user cache ({local}) and {hub_error}. Cached ids for "
        f"release {release_name(model_name)!r}: {cached}. Fit it with `{fit_command(model_name, sae_id)}` "
        f"(or ReadoutSAE.fit(model) then sae.save_model('{local}'))."
    )


def register_releases(extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Add the shipped (and ``extra``) readout releases to SAELens' pretrained directory; returns their names."""
    NAMED_PRETRAINED_SAE_LOADERS.setdefault(LOADER_NAME, readout_loader)
    directory = get_pretrained_saes_directory()
    names = []
    cached_models = {p.name.removeprefix(RELEASE_PREFIX): {"sae_ids": []} for p in _cached_release_dirs()}
    for model_name, entry in {**cached_models, **shipped_releases(), **(extra or {})}.items():
        release = release_name(model_name)
        directory[release] = PretrainedSAELookup(
            release=release,
            repo_id=entry.get("repo_id") or f"local/{release}",
            model=entry.get("model", model_name),
            conversion_func=LOADER_NAME,
            saes_map=ReleaseIds(model_name, entry["sae_ids"]),
            expected_var_explained={},
            expected_l0={},
            neuronpedia_id={},
            norm_scaling_factor={},
            config_overrides=None,
        )
        names.append(release)
    return names


def _cached_release_dirs() -> list[Path]:
    from tl_query_lens.models import cache_dir

    root = cache_dir() / "readout"
    return sorted(p for p in root.glob(RELEASE_PREFIX + "*") if p.is_dir()) if root.is_dir() else []
