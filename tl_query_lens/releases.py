"""SAELens ``SAE.from_pretrained(release, sae_id)`` for dictionaries this project fits or trains into the user cache.

SAELens 6.x resolves a release through ``get_pretrained_saes_directory()`` (a cached module-level dict of
``PretrainedSAELookup``) and loads it with ``NAMED_PRETRAINED_SAE_LOADERS[lookup.conversion_func]``. A
:class:`LocalReleases` family (the readout SAEs; the trained SAE/transcoder suite) adds its releases to that dict with
its own loader: the loader reads ``cache_dir()/<cache_subdir>/<release>/<sae_id>``, else tries the release's hub repo
(when one is listed and reachable), else raises an error that lists the cached ids and names the one command that
makes the missing dictionary. A release's ids are read from the cache at each lookup (:class:`ReleaseIds`), so a
dictionary written after this process registered the releases is reachable too; models with something cached but no
shipped entry get a release as well.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sae_lens.loading.pretrained_sae_loaders import NAMED_PRETRAINED_SAE_LOADERS, sae_lens_disk_loader
from sae_lens.loading.pretrained_saes_directory import PretrainedSAELookup, get_pretrained_saes_directory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalReleases:
    """A family of releases kept in the user cache.

    Attributes:
        prefix: release name prefix; the release of model ``m`` is ``prefix + m``.
        cache_subdir: folder under the user cache that holds ``<release>/<sae_id>/``.
        loader_name: the key of this family's loader in SAELens' ``NAMED_PRETRAINED_SAE_LOADERS``.
        command: ``(model_name, sae_id) -> str``, the command that makes a missing dictionary.
        shipped: ``() -> {model_name: {"model": ..., "repo_id": ..., "sae_ids": [...]}}`` (the package's list).
        what: a noun for messages ("readout SAE").
        verb: how the command makes it ("Fit", "Train").
    """

    prefix: str
    cache_subdir: str
    loader_name: str
    command: Callable[[str, str], str]
    shipped: Callable[[], dict[str, dict[str, Any]]]
    what: str
    verb: str = "Train"

    def release_name(self, model_name: str) -> str:
        return self.prefix + model_name

    def root(self) -> Path:
        from tl_query_lens.models import cache_dir

        return cache_dir() / self.cache_subdir

    def cached_path(self, model_name: str, sae_id: str) -> Path:
        """``<cache>/<cache_subdir>/<release>/<sae_id>``."""
        return self.root() / self.release_name(model_name) / sae_id

    def cached_ids(self, model_name: str) -> list[str]:
        """Ids of ``model_name``'s dictionaries in the user cache (folders holding a ``cfg.json``)."""
        release_dir = self.root() / self.release_name(model_name)
        if not release_dir.is_dir():
            return []
        return sorted(p.name for p in release_dir.iterdir() if (p / "cfg.json").is_file())

    def cached_models(self) -> list[str]:
        root = self.root()
        if not root.is_dir():
            return []
        return sorted(p.name.removeprefix(self.prefix) for p in root.glob(self.prefix + "*") if p.is_dir())

    def loader(
        self,
        repo_id: str,
        folder_name: str,
        device: str = "cpu",
        force_download: bool = False,
        cfg_overrides: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor | None]:
        """SAELens loader: ``folder_name`` is ``"<model>/<sae_id>"``; the user cache first, then the hub repo."""
        model_name, _, sae_id = folder_name.partition("/")
        local = self.cached_path(model_name, sae_id)
        overrides = {k: v for k, v in (cfg_overrides or {}).items() if k in ("device", "dtype")}
        if (local / "cfg.json").exists() and not force_download:
            cfg, state = sae_lens_disk_loader(local, device=device, cfg_overrides=overrides)
            return cfg, state, None
        hub_error = "no hub repo is listed for it"
        if repo_id and not repo_id.startswith("local/"):
            try:
                from huggingface_hub import snapshot_download

                snap = Path(
                    snapshot_download(repo_id, allow_patterns=[f"{folder_name}/*"], force_download=force_download)
                )
                cfg, state = sae_lens_disk_loader(snap / folder_name, device=device, cfg_overrides=overrides)
                return cfg, state, None
            except (OSError, ValueError) as err:  # offline, missing repo or files
                hub_error = f"the hub repo {repo_id!r} was not reachable or lacks it ({type(err).__name__})"
        cached = ", ".join(self.cached_ids(model_name)) or "none yet"
        raise FileNotFoundError(
            f"No {self.what} {sae_id!r} for {model_name} in the user cache ({local}) and {hub_error}. Cached ids for "
            f"release {self.release_name(model_name)!r}: {cached}. {self.verb} it with "
            f"`{self.command(model_name, sae_id)}`."
        )

    def register(self, extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Add this family's releases (shipped, cached, and ``extra``) to SAELens' directory; returns their names."""
        NAMED_PRETRAINED_SAE_LOADERS[self.loader_name] = self.loader
        directory = get_pretrained_saes_directory()
        names = []
        cached = {model: {"sae_ids": []} for model in self.cached_models()}
        for model_name, entry in {**cached, **self.shipped(), **(extra or {})}.items():
            release = self.release_name(model_name)
            directory[release] = PretrainedSAELookup(
                release=release,
                repo_id=entry.get("repo_id") or f"local/{release}",
                model=entry.get("model", model_name),
                conversion_func=self.loader_name,
                saes_map=ReleaseIds(self, model_name, entry["sae_ids"]),
                expected_var_explained={},
                expected_l0={},
                neuronpedia_id={},
                norm_scaling_factor={},
                config_overrides=None,
            )
            names.append(release)
        return names


class ReleaseIds(Mapping[str, str]):
    """``saes_map`` of a release (id → ``"<model>/<id>"``): the shipped ids plus the ones cached right now.

    Membership is granted to every id, so SAELens hands unknown ids to the family's loader, whose error lists what
    is cached; iteration (``keys()``, ``list(...)``) gives the shipped and cached ids only.
    """

    def __init__(self, family: LocalReleases, model_name: str, shipped: list[str]):
        self.family, self.model_name, self.shipped = family, model_name, list(shipped)

    def _ids(self) -> list[str]:
        return list(dict.fromkeys([*self.shipped, *self.family.cached_ids(self.model_name)]))

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
