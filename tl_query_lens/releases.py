"""SAELens ``SAE.from_pretrained(release, sae_id)`` for dictionaries this project fits or trains into the user cache.

SAELens 6.x resolves a release through ``get_pretrained_saes_directory()`` (a cached module-level dict of
``PretrainedSAELookup``) and loads it with ``NAMED_PRETRAINED_SAE_LOADERS[lookup.conversion_func]``. A
:class:`LocalReleases` family (the readout SAEs; the trained SAE/transcoder suite) adds its releases to that dict with
its own loader: the loader reads ``cache_dir()/<cache_subdir>/<release>/<sae_id>``, else tries the release's hub repo
(when one is listed and reachable), else raises an error that lists the cached ids and names the one command that
makes the missing dictionary. A release's ids are read from the cache at each lookup (:class:`ReleaseIds`), so a
dictionary written after this process registered the releases is reachable too; models with something cached but no
shipped entry get a release as well.

Shipped dictionaries (the embedded model's suite and readout SAE) travel inside the package, under
``tl_query_lens/release/<release>/<sae_id>/``: SAELens' ``cfg.json`` beside ``sae_weights.int8.safetensors``, whose
matrices are stored as int8 with one float32 scale per dictionary feature (``w ≈ q·s``, ``s = max|w|/127`` over the
feature's row of ``W_dec`` or column of ``W_enc``) and whose vectors stay float32. They are dequantised on load into
the dtype asked for. ``manifest.json`` of each release records the sha256 of every file; the loader checks a
dictionary's files against it before reading them, so a truncated or edited file raises :class:`CorruptFileError`
naming the file, never a wrong dictionary. Lookup order: a complete dictionary the user trained or fitted into the
cache, then the shipped one, then the hub repo. Inside ``with shipped_only():`` the cache is passed over, so a figure
documented for the shipped files (``tlql reproduce``) is measured on them even where the user has retrained the suite.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sae_lens.loading.pretrained_sae_loaders import (
    NAMED_PRETRAINED_SAE_LOADERS,
    get_sae_lens_config_from_disk,
    sae_lens_disk_loader,
)
from sae_lens.loading.pretrained_saes_directory import PretrainedSAELookup, get_pretrained_saes_directory
from sae_lens.saes.sae import str_to_dtype
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tl_query_lens.errors import CorruptFileError, MissingFileError, check_json_shape
from tl_query_lens.models import cache_dir
from tl_query_lens.paths import plain_name, shipped_ids, shipped_root
from tl_query_lens.tensor_checks import check_device

QUANTISED_WEIGHTS = "sae_weights.int8.safetensors"
MANIFEST = "manifest.json"
_SCALE = ".scale"
_INT8 = ".int8"


_SHIPPED_ONLY = contextvars.ContextVar("tlql_shipped_only", default=False)


@contextlib.contextmanager
def shipped_only() -> Iterator[None]:
    """Within this block, shipped releases load from the package's files, never from a same-named cache entry.

    Releases with no shipped copy of an id still load from the cache (or hub) as usual.
    """
    token = _SHIPPED_ONLY.set(True)
    try:
        yield
    finally:
        _SHIPPED_ONLY.reset(token)


def quantise_state(state: dict[str, torch.Tensor], d_sae: int) -> dict[str, torch.Tensor]:
    """int8 with one float32 scale per dictionary feature for every matrix with a ``d_sae`` axis; vectors float32.

    ``W_enc`` ``[d_in, d_sae]`` gets a scale per column, ``W_dec`` ``[d_sae, d_out]`` one per row: ``q = round(w/s)``,
    ``s = max|w|/127`` over the feature, so every feature keeps its own relative precision (≤ 1/254 of its
    largest weight).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu", torch.float32)
        if t.ndim == 2 and d_sae in t.shape:
            axis = 0 if t.shape[0] == d_sae else 1
            scale = t.abs().amax(dim=1 - axis, keepdim=True).clamp_min(1e-30) / 127.0
            out[name + _INT8] = torch.round(t / scale).clamp(-127, 127).to(torch.int8).contiguous()
            out[name + _SCALE] = scale.contiguous()
        else:
            out[name] = t.contiguous()
    return out


def dequantise_state(
    stored: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`quantise_state`: ``q·s`` (computed in float32, then cast to ``dtype``)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in stored.items():
        if name.endswith(_SCALE):
            continue
        if name.endswith(_INT8):
            base = name.removesuffix(_INT8)
            value = tensor.to(torch.float32) * stored[base + _SCALE]
        else:
            base, value = name, tensor
        state[base] = value.to(device=device, dtype=dtype)
    return state


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(release_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the sha256 and size of every file under ``release_dir`` (but the manifest) in ``manifest.json``."""
    files = {
        p.relative_to(release_dir).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(release_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"files": files, **(extra or {})}
    (release_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def verify_shipped(release_dir: Path, sae_id: str) -> None:
    """Check the files of ``sae_id`` against the release manifest; :class:`CorruptFileError` names the first bad one."""
    restore = (
        "Restore the file from the repository (`git checkout -- tl_query_lens/release`) or reinstall the package "
        "(`pip install --force-reinstall tl_query_lens`); nothing was loaded."
    )
    manifest_path = release_dir / MANIFEST
    try:
        record = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CorruptFileError(manifest_path, f"the release manifest cannot be read ({err})", restore) from err
    files = check_json_shape(record, manifest_path, restore, keys=("files",))["files"]
    check_json_shape(files, manifest_path, restore)
    own = {name: entry for name, entry in files.items() if name.split("/", 1)[0] == sae_id}
    unlisted = [f"{sae_id}/{name}" for name in ("cfg.json", QUANTISED_WEIGHTS) if f"{sae_id}/{name}" not in own]
    if unlisted:  # the loader reads these two whatever the manifest lists
        raise CorruptFileError(manifest_path, f"lists no checksum of {unlisted}", restore)
    for name, entry in own.items():
        path = release_dir / name
        if not isinstance(entry, dict) or not {"bytes", "sha256"} <= entry.keys():
            raise CorruptFileError(manifest_path, f"its entry for {name!r} lacks 'bytes' and 'sha256'", restore)
        if not path.is_file():
            raise CorruptFileError(path, "the file is missing", restore)
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise CorruptFileError(
                path, f"its sha256 does not match the release manifest ({entry['bytes']} bytes expected)", restore
            )


def read_shipped(
    release_dir: Path, sae_id: str, device: str = "cpu", cfg_overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Verify, then read a shipped dictionary as SAELens' ``(cfg_dict, state_dict)`` in the dtype asked for."""
    verify_shipped(release_dir, sae_id)
    folder = release_dir / sae_id
    cfg = get_sae_lens_config_from_disk(folder, device, cfg_overrides)
    try:
        stored = load_file(str(folder / QUANTISED_WEIGHTS))
    except (OSError, SafetensorError) as err:  # checksum matched but unreadable: a packing bug, still name it
        raise CorruptFileError(folder / QUANTISED_WEIGHTS, f"unreadable ({err})", "repack the release") from err
    return cfg, dequantise_state(stored, str_to_dtype(cfg.get("dtype", "float32")), device)


def write_shipped(sae_folder: Path, release_dir: Path, sae_id: str, *, drop: Collection[str] = ()) -> Path:
    """Pack one SAELens folder (``cfg.json`` + ``sae_weights.safetensors``) into ``release_dir/sae_id``.

    ``drop``: tensors left out because the dictionary recomputes them on load (a readout SAE's row codes)."""
    cfg = json.loads((Path(sae_folder) / "cfg.json").read_text(encoding="utf-8"))
    state = {k: v for k, v in load_file(str(Path(sae_folder) / "sae_weights.safetensors")).items() if k not in drop}
    out = release_dir / sae_id
    out.mkdir(parents=True, exist_ok=True)
    cfg["dtype"] = "float32"
    (out / "cfg.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    save_file(
        quantise_state(state, int(cfg["d_sae"])), str(out / QUANTISED_WEIGHTS), metadata={"format": "int8-per-feature"}
    )
    return out


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
        return cache_dir() / self.cache_subdir

    def cached_path(self, model_name: str, sae_id: str) -> Path:
        """``<cache>/<cache_subdir>/<release>/<sae_id>`` (both plain names: nothing is read or written outside the
        cache)."""
        release = plain_name(self.release_name(model_name), "model name")
        return self.root() / release / plain_name(sae_id, "sae_id")

    def cached_ids(self, model_name: str) -> list[str]:
        """Ids of ``model_name``'s dictionaries in the user cache (folders holding a ``cfg.json``)."""
        release_dir = self.root() / self.release_name(model_name)
        if not release_dir.is_dir():
            return []
        return sorted(p.name for p in release_dir.iterdir() if (p / "cfg.json").is_file())

    def shipped_dir(self, model_name: str) -> Path:
        """``tl_query_lens/release/<release>``: the dictionaries of this release that travel with the package."""
        return shipped_root() / self.release_name(model_name)

    def shipped_ids(self, model_name: str) -> list[str]:
        """Ids packed into the package for ``model_name`` (folders holding a ``cfg.json``)."""
        return shipped_ids(self.shipped_dir(model_name))

    def available_ids(self, model_name: str) -> list[str]:
        """Every id that loads without a hub: shipped and cached."""
        return sorted({*self.shipped_ids(model_name), *self.cached_ids(model_name)})

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
        """SAELens loader: ``folder_name`` is ``"<model>/<sae_id>"``; the user cache, the shipped files, the hub repo."""
        model_name, _, sae_id = folder_name.partition("/")
        check_device(device, "device")
        local = self.cached_path(model_name, sae_id)
        overrides = {k: v for k, v in (cfg_overrides or {}).items() if k in ("device", "dtype")}
        shipped = self.shipped_dir(model_name)
        is_shipped = (shipped / sae_id / "cfg.json").exists()
        if (local / "cfg.json").exists() and not force_download and not (is_shipped and _SHIPPED_ONLY.get()):
            logger.info("loading %s/%s from the user cache (%s)", self.release_name(model_name), sae_id, local)
            return (*self._read_cached(local, model_name, sae_id, is_shipped, device, overrides), None)
        if is_shipped:
            logger.info("loading %s/%s shipped with the package (%s)", self.release_name(model_name), sae_id, shipped)
            cfg, state = read_shipped(shipped, sae_id, device=device, cfg_overrides=overrides)
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
        cached_ids = ", ".join(self.cached_ids(model_name)) or "none yet"
        shipped_ids = ", ".join(self.shipped_ids(model_name)) or "none"
        raise MissingFileError(
            f"No {self.what} {sae_id!r} for {model_name}: not shipped with the package, not in the user cache "
            f"({local}), and {hub_error}. Cached ids for release {self.release_name(model_name)!r}: {cached_ids}; "
            f"shipped ids: {shipped_ids}. {self.verb} it with `{self.command(model_name, sae_id)}`."
        )

    def _read_cached(
        self, local: Path, model_name: str, sae_id: str, is_shipped: bool, device: str, overrides: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """Read a user-cache copy; one that is incomplete or corrupt is named with how to remove it, never skipped
        for the shipped files silently (it shadows them)."""
        shadow = " It shadows the dictionary shipped with the package." if is_shipped else ""
        fix = (
            f"Remove it (`rm -r {local}`) to use the shipped one, or {self.verb.lower()} it again with "
            f"`{self.command(model_name, sae_id)}`."
            if is_shipped
            else f"Remove it (`rm -r {local}`) and {self.verb.lower()} it again with `{self.command(model_name, sae_id)}`."
        )
        weights = local / "sae_weights.safetensors"
        if not weights.is_file():
            raise CorruptFileError(local, f"the user-cache copy of {sae_id!r} lacks {weights.name}.{shadow}", fix)
        try:
            return sae_lens_disk_loader(local, device=device, cfg_overrides=overrides)
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as err:
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
            raise CorruptFileError(
                local, f"the user-cache copy of {sae_id!r} is unreadable ({reason}).{shadow}", fix
            ) from err

    def register(self, extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Add this family's releases (shipped, cached, and ``extra``) to SAELens' directory; returns their names."""
        NAMED_PRETRAINED_SAE_LOADERS[self.loader_name] = self.loader
        directory = get_pretrained_saes_directory()
        names = []
        cached: dict[str, dict[str, Any]] = {model: {"sae_ids": []} for model in self.cached_models()}
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
        return list(
            dict.fromkeys(
                [
                    *self.shipped,
                    *self.family.shipped_ids(self.model_name),
                    *self.family.cached_ids(self.model_name),
                ]
            )
        )

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
