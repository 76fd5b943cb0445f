"""Where a dictionary comes from, written as one string, parsed and loaded in one place.

Accepted forms (comma-separated where a list is taken):

* ``ffkv`` — the model's MLP as an FF-KV dictionary at each layer asked for; ``ffkv:<layer>`` at one layer, and
  ``ffkv:<layer>:<variant>[:<k>]`` with variant ``vanilla``, ``topk`` (``k`` active features, default 32) or
  ``normalized``;
* a folder written by ``sae.save_model(folder)`` or the SAELens runner (``SAE.load_from_disk``);
* ``<release>:<sae_id>`` of SAELens' pretrained directory, this package's own releases included
  (``SAE.from_pretrained``), e.g. ``tlql-saes-smollm2-135m:blocks.12.hook_resid_post``;
* ``<hf-org>/<repo>:<sae_id>``, an SAELens-format SAE on the Hugging Face hub (``SAE.from_pretrained``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sae_lens import SAE
from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory
from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.dictionaries.saved import check_sae_folder, load_sae
from tl_query_lens.errors import InputError, MissingFileError, OutOfRangeError, UnknownNameError
from tl_query_lens.hooks import hook_layer
from tl_query_lens.readout import register_releases as register_readout
from tl_query_lens.saes import register_releases as register_suite

FORMS = (
    "'ffkv' (the MLP of each layer asked for), 'ffkv:<layer>[:vanilla|topk|normalized[:<k>]]', a folder written by "
    "sae.save_model, '<release>:<sae_id>' (SAE.from_pretrained) or '<hf-org>/<repo>:<sae_id>'"
)
VARIANTS = ("vanilla", "topk", "normalized")


@dataclass(frozen=True)
class DictionarySource:
    """One parsed dictionary spec.

    Attributes:
        spec: the text as given. kind: ``"ffkv"``, ``"folder"`` or ``"pretrained"`` (a release or a hub repo).
        location: the folder, or the release / hub repo. sae_id: the id in the release (pretrained only).
        layer / variant / k: an FF-KV spec's layer (None: each layer asked for), variant and TopK size.
    """

    spec: str
    kind: Literal["ffkv", "folder", "pretrained"]
    location: str = ""
    sae_id: str | None = None
    layer: int | None = None
    variant: str = "vanilla"
    k: int | None = None

    @property
    def name(self) -> str:
        """The folder's name, the SAE id, or ``"ffkv"``."""
        return {"ffkv": "ffkv", "folder": Path(self.location).name}.get(self.kind, self.sae_id or "")

    @property
    def group(self) -> str:
        """The family: ``"ffkv"``, the release, or the folder that holds the SAE folder."""
        return {"ffkv": "ffkv", "folder": Path(self.location).resolve().parent.name}.get(self.kind, self.location)


@dataclass
class LoadedDictionary:
    """A loaded dictionary: ``label`` (``"ffkv L12"`` / ``"sae L12 <name>"``), its ``group`` and the SAE."""

    label: str
    group: str
    sae: Any


def parse_source(spec: str, what: str = "--dictionary") -> DictionarySource:
    """Parse and check one spec without loading weights: folders are checked, releases and their ids looked up.

    Raises:
        InputError: a spec of none of the accepted forms (the message lists them), an FF-KV spec with a bad layer,
            variant or k, a folder that holds no loadable SAE, a release SAELens does not know, or an id the
            release does not list (the message lists those it has).
    """
    register_suite()  # this package's releases (importing readout/ and saes/ registered their architectures)
    register_readout()
    text = spec.strip()
    head, _, rest = text.partition(":")
    if head == "ffkv":
        return _parse_ffkv(text, rest, what)
    try:
        is_path = bool(text) and Path(text).expanduser().exists()
    except OSError as err:  # e.g. a name longer than the file system allows
        raise InputError(f"{what} {spec[:80]!r}… cannot be a path here ({err.strerror}); give a shorter one.") from None
    if is_path:
        check_sae_folder(Path(text).expanduser())
        return DictionarySource(text, "folder", str(Path(text).expanduser()))
    if head and rest and not head.startswith((".", "/", "~")):
        if head.count("/") != 1:
            _check_release(head, rest, what)
        return DictionarySource(text, "pretrained", head, rest)
    raise MissingFileError(f"{what} {spec!r} is neither 'ffkv' nor an existing folder; accepted forms: {FORMS}.")


def _parse_ffkv(text: str, rest: str, what: str) -> DictionarySource:
    parts = rest.split(":") if rest else []
    variant = parts[1] if len(parts) > 1 else "vanilla"
    digits = re.compile(r"[0-9]{1,9}")  # ASCII digits only: '²'.isdigit() is True but int('²') fails
    ok = bool(len(parts) < 1 or digits.fullmatch(parts[0])) and variant in VARIANTS
    ok = ok and bool(len(parts) < 3 or digits.fullmatch(parts[2]))
    if not ok or len(parts) > 3 or (len(parts) == 3 and variant != "topk"):
        raise InputError(f"{what} {text!r} is not an FF-KV spec; accepted forms: {FORMS}.")
    k = int(parts[2]) if len(parts) == 3 else (32 if variant == "topk" else None)
    if k is not None and k < 1:
        raise InputError(
            f"{what} {text!r}: k must be ≥ 1 (the features kept per token), e.g. 'ffkv:{parts[0]}:topk:32'."
        )
    return DictionarySource(text, "ffkv", layer=int(parts[0]) if parts else None, variant=variant, k=k)


def check_ffkv_layer(source: DictionarySource, n_layers: int, what: str = "--dictionary") -> None:
    """Refuse an FF-KV spec whose layer the model does not have (before the model loads, where its size is known)."""
    if source.kind == "ffkv" and source.layer is not None and not 0 <= source.layer < n_layers:
        raise OutOfRangeError(
            f"{what} {source.spec!r}: layer {source.layer} is out of range; the model has layers 0..{n_layers - 1}."
        )


def _check_release(release: str, sae_id: str, what: str) -> None:
    directory = get_pretrained_saes_directory()
    if release not in directory:  # a dictionary cached after the releases were registered
        register_suite()
        register_readout()
    if release not in directory:
        local = sorted(name for name in directory if name.startswith("tlql-"))
        raise UnknownNameError(
            f"{what} '{release}:{sae_id}': {release!r} is not a SAELens release known here (this project's: {local};"
            " SAELens' own: sae_lens.loading.pretrained_saes_directory.get_pretrained_saes_directory())."
        )
    if sae_id not in directory[release].saes_map:  # shipped ids, and the ones cached now
        ids = list(directory[release].saes_map)
        more = f" (+{len(ids) - 12} more)" if len(ids) > 12 else ""
        raise UnknownNameError(
            f"{what} '{release}:{sae_id}': release {release!r} has no SAE id {sae_id!r}; valid ids: {ids[:12]}{more}."
        )


def release_ids(release: str) -> list[str]:
    """The SAE ids a release lists (``[]`` when SAELens does not know it)."""
    lookup = get_pretrained_saes_directory().get(release)
    return list(lookup.saes_map) if lookup is not None else []


def release_sources(release: str, ids: Iterable[str] | None = None, what: str = "--ids") -> list[DictionarySource]:
    """``<release>:<id>`` for every id the release lists, or for ``ids`` (each must be listed: shipped or cached).

    Raises:
        UnknownNameError: an id the release does not list (the message names the valid ones).
    """
    valid = release_ids(release)
    unknown = [i for i in ids or [] if i not in valid]
    if unknown:
        raise UnknownNameError(f"{what}: unknown dictionary ids {unknown} for {release}; valid ids: {valid}.")
    return [parse_source(f"{release}:{i}", what) for i in (ids or valid)]


def load_dictionary(
    source: str | DictionarySource,
    model: HookedTransformer | None = None,
    *,
    layer: int | None = None,
    device: str | None = None,
) -> SAE:
    """Load one dictionary (``source`` a spec or a parsed one); an FF-KV spec needs ``model`` (and ``layer`` when the
    spec names none). ``device``: default the model's, else ``"cpu"``.

    Raises:
        InputError: as :func:`parse_source`, and a folder, release or hub repo that cannot be loaded.
    """
    source = parse_source(source) if isinstance(source, str) else source
    device = device or (str(model.cfg.device) if model is not None else "cpu")
    if source.kind == "ffkv":
        layer = source.layer if source.layer is not None else layer
        if model is None or layer is None:
            raise InputError(f"{source.spec!r} needs the model and a layer (e.g. 'ffkv:12').")
        check_ffkv_layer(source, int(model.cfg.n_layers))
        return (
            FFKV.from_model(model, layer, source.variant, source.k)  # type: ignore[arg-type]
            if source.k
            else FFKV.from_model(model, layer, source.variant)  # type: ignore[arg-type]
        )
    if source.kind == "folder":
        return load_sae(source.location, device=device)
    try:
        return SAE.from_pretrained(source.location, source.sae_id, device=device)
    except (OSError, ValueError, KeyError) as err:  # not cached / no hub here / a malformed entry
        raise MissingFileError(
            f"{source.spec!r} could not be loaded by SAE.from_pretrained ({type(err).__name__}: {err})"
        ) from err


def parse_sources(text: str | Iterable[str] | None, what: str = "--dictionary") -> list[DictionarySource]:
    """Comma-separated specs (several strings joined; None: ``"ffkv"``), each parsed by :func:`parse_source`."""
    text = "ffkv" if text is None else text if isinstance(text, str) else ",".join(text)
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise InputError(f"{what} {text!r} has an empty item; accepted forms: {FORMS}.")
    return [parse_source(item, what) for item in items]


def load_sources(
    sources: list[DictionarySource], model: HookedTransformer, layers: Iterable[int]
) -> list[LoadedDictionary]:
    """Every source loaded and labelled: ``ffkv`` at each of ``layers`` (``"ffkv L12"``), other FF-KV specs and SAEs
    once each (``"sae L12 <name>"``; ``"ffkv L12 topk32"`` for a non-vanilla FF-KV).

    Raises:
        InputError: a source that cannot be loaded, or two sources with the same label.
    """
    loaded = []
    for source in sources:
        if source.kind == "ffkv":
            suffix = "" if source.variant == "vanilla" else f" {source.variant}{source.k or ''}"
            for layer in [source.layer] if source.layer is not None else layers:
                sae = load_dictionary(source, model, layer=layer)
                loaded.append(LoadedDictionary(f"ffkv L{layer}{suffix}", "ffkv", sae))
            continue
        sae = load_dictionary(source, model)
        loaded.append(
            LoadedDictionary(f"sae L{hook_layer(sae.cfg.metadata.hook_name)} {source.name}", source.group, sae)
        )
    labels = [d.label for d in loaded]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise InputError(f"--dictionary names {twice} more than once; give each dictionary once.")
    return loaded
