"""SAELens ``SAE.from_pretrained(release, sae_id)`` for dictionaries this project trains into the user cache.

SAELens 6.x resolves a release through ``get_pretrained_saes_directory()`` (a cached module-level dict of
``PretrainedSAELookup``) and loads it with ``NAMED_PRETRAINED_SAE_LOADERS[lookup.conversion_func]``. A
:class:`LocalReleases` family (the readout SAEs, the trained SAE/transcoder suite) adds its releases to that dict with
its own loader: the loader reads the dictionary from ``cache_dir()/<cache_subdir>/<release>/<sae_id>``, else tries
the release's hub repo (when one is listed and reachable), else raises an error naming the one command that trains it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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
        command: ``(model_name, sae_id) -> str``, the command that trains a missing dictionary.
        releases: ``() -> {model_name: {"model": ..., "repo_id": ..., "sae_ids": [...]}}``.
        what: a noun for messages ("readout SAE").
    """

    prefix: str
    cache_subdir: str
    loader_name: str
    command: Callable[[str, str], str]
    releases: Callable[[], dict[str, dict[str, Any]]]
    what: str

    def release_name(self, model_name: str) -> str:
        return self.prefix + model_name

    def root(self) -> Path:
        from tl_query_lens.models import cache_dir

        return cache_dir() / self.cache_subdir

    def cached_path(self, model_name: str, sae_id: str) -> Path:
        """``<cache>/<cache_subdir>/<release>/<sae_id>``."""
        return self.root() / self.release_name(model_name) / sae_id

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

                snap = Path(snapshot_download(repo_id, allow_patterns=[f"{folder_name}/*"],
                                              force_download=force_download))
                cfg, state = sae_lens_disk_loader(snap / folder_name, device=device, cfg_overrides=overrides)
                return cfg, state, None
            except (OSError, ValueError) as err:  # offline, missing repo or files
                hub_error = f"the hub repo {repo_id!r} was not reachable or lacks it ({type(err).__name__})"
        raise FileNotFoundError(
            f"No {self.what} {sae_id!r} for {model_name} in the user cache ({local}) and {hub_error}. "
            f"Train it with `{self.command(model_name, sae_id)}`."
        )

    def register(self, extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Add this family's releases (and ``extra``) to SAELens' pretrained directory; returns their names."""
        NAMED_PRETRAINED_SAE_LOADERS[self.loader_name] = self.loader
        directory = get_pretrained_saes_directory()
        names = []
        for model_name, entry in {**self.releases(), **(extra or {})}.items():
            release = self.release_name(model_name)
            directory[release] = PretrainedSAELookup(
                release=release,
                repo_id=entry.get("repo_id") or f"local/{release}",
                model=entry.get("model", model_name),
                conversion_func=self.loader_name,
                saes_map={sae_id: f"{model_name}/{sae_id}" for sae_id in entry["sae_ids"]},
                expected_var_explained={},
                expected_l0={},
                neuronpedia_id={},
                norm_scaling_factor={},
                config_overrides=None,
            )
            names.append(release)
        return names
