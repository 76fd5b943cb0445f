"""The dictionaries of an atlas: specs expanded ('default', 'ffkv' over layers), loaded, named and checked."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value
from tl_query_lens.errors import InputError
from tl_query_lens.hooks import check_hook, hook_layer
from tl_query_lens.models import _ALIASES
from tl_query_lens.readout.registry import READOUT_RELEASES
from tl_query_lens.saes.registry import SAES_RELEASES, shipped_releases
from tl_query_lens.sources import DictionarySource, load_dictionary, parse_source

logger = logging.getLogger(__name__)


@dataclass
class AtlasDictionary:
    """One dictionary of the atlas.

    Attributes:
        slug: its id in the site and Neuronpedia's source id, ``"{layer}-{set}"`` (e.g. ``12-ffkv``, ``12-tlql-res``).
        label: a human name (``ffkv L12``). kind: ``"ffkv"``, ``"sae"``, ``"transcoder"`` or ``"readout"``.
        spec: the spec it was loaded from. layer: the layer of its read hook (n_layers for the final norm).
        sae: the loaded dictionary. view: its key–value view, built and checked once when it is loaded and passed
            to every step that needs it (the lens, the signatures, the neuron links).
    """

    slug: str
    label: str
    kind: str
    spec: str
    layer: int
    sae: Any
    view: KeyValueView

    @property
    def d_sae(self) -> int:
        return int(self.sae.cfg.d_sae)

    @property
    def read_hook(self) -> str:
        """The hook the dictionary reads."""
        return self.view.read_hook

    @property
    def write_hook(self) -> str:
        """The hook the dictionary's reconstruction replaces (in the residual stream for hook_z SAEs)."""
        return self.view.write_hook


def _set_name(source: DictionarySource, kind: str) -> str:
    if source.kind == "ffkv":
        return "ffkv" if source.variant == "vanilla" else f"ffkv-{source.variant}{source.k or ''}"
    if kind == "readout":
        return f"readout-{source.sae_id}"
    if source.kind == "pretrained" and source.location.startswith("tlql-saes-"):
        return "tlql-tc" if (source.sae_id or "").endswith(".transcoder") else "tlql-res"
    name = source.name.replace("blocks.", "").replace("hook_", "")
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "sae"


def expand_specs(specs: tuple[str, ...], model_name: str, layers: list[int]) -> list[DictionarySource]:
    """Parse every spec (an unknown one raises before anything loads); 'default' and 'ffkv' cover ``layers``.

    ``model_name`` may be the model's own name (``model.cfg.model_name``, e.g. 'SmolLM2-135M-Instruct'): the release
    lookups use the package's short name for it ('smollm2-135m'), as the releases are named.
    """
    model_name = _ALIASES.get(model_name.lower(), model_name)
    out: list[DictionarySource] = []
    for spec in specs:
        if spec == "default":
            out += [parse_source(f"ffkv:{layer}", "--dictionary") for layer in layers]
            suite = SAES_RELEASES.available_ids(model_name)
            readout = READOUT_RELEASES.available_ids(model_name)
            listed = _listed_ids(model_name)
            missing = [i for i in listed if i not in suite]
            if missing:
                logger.warning("default atlas: %s not available here (train them with tlql saes train)", missing)
            out += [parse_source(f"{SAES_RELEASES.release_name(model_name)}:{i}", "--dictionary") for i in suite]
            out += [parse_source(f"{READOUT_RELEASES.release_name(model_name)}:{i}", "--dictionary") for i in readout]
        elif spec == "ffkv":
            out += [parse_source(f"ffkv:{layer}", "--dictionary") for layer in layers]
        else:
            out.append(parse_source(spec, "--dictionary"))
    return out


def _listed_ids(model_name: str) -> list[str]:
    """The suite ids the package's release list names for ``model_name`` (trained or not)."""
    key = _ALIASES.get(model_name.lower(), model_name.lower())
    return list(shipped_releases().get(key, {}).get("sae_ids", []))


def _kind(sae: Any, source: DictionarySource) -> str:
    arch = sae.cfg.architecture()
    if source.kind == "ffkv" or arch == "ffkv":
        return "ffkv"
    if arch == "readout" or type(sae).__name__ == "ReadoutSAE":
        return "readout"
    if getattr(sae.cfg.metadata, "hook_name_out", None) or "transcoder" in arch:
        return "transcoder"
    return "sae"


def load_atlas_dictionaries(model: HookedTransformer, sources: list[DictionarySource]) -> list[AtlasDictionary]:
    """Load each source and check its hooks exist in ``model`` (a clear error before the corpus pass).

    Raises:
        InputError: a source that cannot be loaded, a hook the model lacks, a width that does not match, or two
            sources with the same id.
    """
    loaded = []
    for source in sources:
        sae = load_dictionary(source, model, device=str(model.cfg.device))
        hook = sae.cfg.metadata.hook_name
        try:
            check_hook(model, hook)
            out_hook = getattr(sae.cfg.metadata, "hook_name_out", None)
            if out_hook:
                check_hook(model, out_hook)
        except KeyError as err:
            raise InputError(f"--dictionary {source.spec!r}: {err.args[0] if err.args else err}") from None
        kind = _kind(sae, source)
        try:
            view = as_key_value(sae, model)
        except (ValueError, TypeError) as err:
            raise InputError(f"--dictionary {source.spec!r} does not fit this model: {err}") from None
        layer = hook_layer(view.read_hook)
        layer = model.cfg.n_layers if layer is None else layer
        set_name = _set_name(source, kind)
        label = f"{kind} L{layer}" + ("" if set_name in ("ffkv", "tlql-res", "tlql-tc") else f" {set_name}")
        loaded.append(AtlasDictionary(f"{layer}-{set_name}", label, kind, source.spec, layer, sae, view))
    slugs = [d.slug for d in loaded]
    twice = sorted({s for s in slugs if slugs.count(s) > 1})
    if twice:
        raise InputError(f"--dictionary names {twice} more than once; give each dictionary once.")
    return loaded


@torch.no_grad()
def encode(dictionary: AtlasDictionary, x: torch.Tensor) -> torch.Tensor:
    """Feature activations ``[batch, pos, d_sae]`` of the read hook's activation ``x``."""
    sae = dictionary.sae
    if x.ndim == 4:  # hook_z
        x = x.flatten(-2)
    return sae.encode(x.to(sae.W_enc.dtype if hasattr(sae, "W_enc") else x.dtype))
