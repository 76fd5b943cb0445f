"""``--dictionary``: FF-KV, saved SAE folders and SAELens releases, parsed and checked once for every subcommand.

An item is ``ffkv`` (the model's MLP at each of ``--layers``, as an FF-KV transcoder), a folder written by
``sae.save_model`` / the SAELens runner, or ``release:sae_id`` for ``SAE.from_pretrained(release, sae_id)`` (e.g.
``tlql-saes-smollm2-135m:blocks.12.hook_resid_post``). Items are comma-separated; the option may be repeated.
``tlql certify`` and ``tlql ql-evaluate`` both use :func:`parse_dictionaries` and :func:`load_dictionaries`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tl_query_lens.errors import InputError, MissingFileError, UnknownNameError

DICTIONARY_HELP = (
    "comma-separated, repeatable: 'ffkv' (the MLP at each of --layers as an FF-KV dictionary), folders of SAEs saved "
    "with save_model / the SAELens runner, and/or SAELens 'release:sae_id' (SAE.from_pretrained), e.g. "
    "'tlql-saes-smollm2-135m:blocks.12.hook_resid_post'; all share one model"
)


def add_dictionary_arg(parser: argparse.ArgumentParser) -> None:
    """The shared ``--dictionary`` option (repeatable; default ``ffkv``)."""
    parser.add_argument("--dictionary", action="append", default=None, help=DICTIONARY_HELP + " [ffkv]")


def dictionary_text(value: str | list[str] | None) -> str:
    """The items of ``--dictionary`` as one comma-separated string (every use joined; none given: ``"ffkv"``)."""
    if value is None:
        return "ffkv"
    return value if isinstance(value, str) else ",".join(value)


@dataclass(frozen=True)
class DictionarySource:
    """One ``--dictionary`` item.

    Attributes:
        item: the text as given.
        kind: ``"ffkv"``, ``"folder"`` (a saved SAE) or ``"pretrained"`` (``release:sae_id``).
    """

    item: str
    kind: Literal["ffkv", "folder", "pretrained"]

    @property
    def name(self) -> str:
        """The folder's name or the SAE id (``"ffkv"`` for FF-KV)."""
        if self.kind == "pretrained":
            return self.item.split(":", 1)[1]
        return Path(self.item).name if self.kind == "folder" else "ffkv"

    @property
    def group(self) -> str:
        """The family the item belongs to: ``"ffkv"``, the release, or the folder that holds the SAE folder."""
        if self.kind == "pretrained":
            return self.item.split(":", 1)[0]
        return Path(self.item).resolve().parent.name if self.kind == "folder" else "ffkv"


@dataclass
class LoadedDictionary:
    """A loaded dictionary: ``label`` (``"ffkv L12"`` / ``"sae L12 <name>"``), its ``group`` and the SAE."""

    label: str
    group: str
    sae: Any


def parse_dictionaries(text: str | list[str] | None, what: str = "--dictionary") -> list[DictionarySource]:
    """Split and check ``--dictionary`` without loading anything: folders are checked, releases looked up.

    Raises:
        InputError: an empty item; an item that is neither ``ffkv``, an existing folder nor ``release:sae_id``; a
            folder that holds no loadable SAE; a release SAELens does not know, or an id it does not list.
    """
    from tl_query_lens.dictionaries.saved import check_sae_folder

    text = dictionary_text(text)
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise InputError(f"{what} {text!r} has an empty item; give 'ffkv', SAE folders and/or 'release:sae_id'.")
    sources = []
    for item in items:
        if item == "ffkv":
            sources.append(DictionarySource(item, "ffkv"))
        elif Path(item).expanduser().exists():
            check_sae_folder(Path(item).expanduser())
            sources.append(DictionarySource(str(Path(item).expanduser()), "folder"))
        elif ":" in item and "/" not in item.split(":", 1)[0]:
            _check_release(item, what)
            sources.append(DictionarySource(item, "pretrained"))
        else:
            raise MissingFileError(
                f"{what} {item!r} is neither 'ffkv' nor an existing folder holding a saved SAE "
                "(sae.save_model(folder) / the SAELens runner) nor a SAELens 'release:sae_id'."
            )
    return sources


def _check_release(item: str, what: str) -> None:
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    from tl_query_lens.readout.registry import register_releases as register_readout
    from tl_query_lens.saes import register_releases as register_suite

    release, sae_id = item.split(":", 1)
    directory = get_pretrained_saes_directory()
    if release not in directory:  # a model's first dictionary may have been cached after the import registered them
        register_suite()
        register_readout()
    if release not in directory:
        local = sorted(name for name in directory if name.startswith("tlql-"))
        raise UnknownNameError(
            f"{what} {item!r}: {release!r} is not a SAELens release known here (this project's: {local}; "
            "SAELens' own are listed by sae_lens.loading.pretrained_saes_directory.get_pretrained_saes_directory())."
        )
    ids = directory[release].saes_map
    if not sae_id or sae_id not in ids:
        known = list(ids)
        raise UnknownNameError(
            f"{what} {item!r}: release {release!r} has no SAE id {sae_id!r}; its ids: {known[:12]}"
            + (f" (+{len(known) - 12} more)" if len(known) > 12 else "")
            + "."
        )


def load_dictionaries(sources: list[DictionarySource], model, layers: str) -> list[LoadedDictionary]:
    """Load every source: ``ffkv`` at each of ``layers`` (``FFKV.from_model(model, l, "vanilla")``), SAEs once each.

    Raises:
        InputError: a folder or release that cannot be loaded (the message names it and the fix).
    """
    from sae_lens import SAE

    from tl_query_lens import FFKV
    from tl_query_lens.cli.validate import parse_layers
    from tl_query_lens.dictionaries.saved import load_sae
    from tl_query_lens.hooks import hook_layer

    device = str(model.cfg.device)
    loaded = []
    for source in sources:
        if source.kind == "ffkv":
            for layer in parse_layers(layers, model.cfg.n_layers):
                loaded.append(LoadedDictionary(f"ffkv L{layer}", "ffkv", FFKV.from_model(model, layer, "vanilla")))
            continue
        if source.kind == "folder":
            sae = load_sae(source.item, device=device)  # checked; errors name the folder
        else:
            release, sae_id = source.item.split(":", 1)
            try:
                sae = SAE.from_pretrained(release, sae_id, device=device)
            except (OSError, ValueError, KeyError) as err:  # not cached / no hub here / a malformed entry
                raise MissingFileError(
                    f"--dictionary {source.item!r} could not be loaded by SAE.from_pretrained "
                    f"({type(err).__name__}: {err})"
                ) from err
        label = f"sae L{hook_layer(sae.cfg.metadata.hook_name)} {source.name}"
        loaded.append(LoadedDictionary(label, source.group, sae))
    labels = [d.label for d in loaded]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise InputError(f"--dictionary names {twice} more than once; give each dictionary once.")
    return loaded
