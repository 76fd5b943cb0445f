"""The release ``tlql-saes-<model>``: ``SAE.from_pretrained("tlql-saes-smollm2-135m", "blocks.12.hook_resid_post")``.

Uses the same :class:`tl_query_lens.releases.LocalReleases` mechanism as the readout SAEs. Ids: residual SAEs are
named by their hook (``blocks.L.hook_resid_post``), transcoders ``blocks.L.transcoder`` (they read the MLP input,
``blocks.L.ln2.hook_normalized``, and write ``blocks.L.hook_mlp_out``). The shipped list (``releases.json``) names
the embedded model's suite; suites trained for other models are found in the user cache.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from typing import Any, Literal

from transformer_lens import HookedTransformer

from tl_query_lens.dictionaries.ffkv import mlp_read_hook
from tl_query_lens.releases import LocalReleases

_ID = re.compile(r"^blocks\.(\d+)\.(hook_resid_post|transcoder)$")


def sae_id(kind: Literal["sae", "transcoder"], layer: int) -> str:
    """``blocks.L.hook_resid_post`` for a residual SAE, ``blocks.L.transcoder`` for a transcoder."""
    return f"blocks.{layer}.hook_resid_post" if kind == "sae" else f"blocks.{layer}.transcoder"


def parse_sae_id(name: str) -> tuple[Literal["sae", "transcoder"], int]:
    """Inverse of :func:`sae_id`; a clear error for anything else."""
    match = _ID.match(name)
    if not match:
        raise KeyError(
            f"Unknown dictionary id {name!r}; ids are 'blocks.L.hook_resid_post' (residual SAE) or "
            "'blocks.L.transcoder' (MLP transcoder), e.g. 'blocks.12.hook_resid_post'."
        )
    return ("sae" if match.group(2) == "hook_resid_post" else "transcoder"), int(match.group(1))


def suite_hooks(model: HookedTransformer, kind: Literal["sae", "transcoder"], layer: int) -> tuple[str, ...]:
    """The hooks a dictionary reads (and, for a transcoder, writes)."""
    if kind == "sae":
        return (f"blocks.{layer}.hook_resid_post",)
    return (mlp_read_hook(model, layer), f"blocks.{layer}.hook_mlp_out")


def train_command(model_name: str, sae_id_: str) -> str:
    layer = _ID.match(sae_id_)
    layers = f" --layers {layer.group(1)}" if layer else ""
    return f"tlql saes train --model {model_name}{layers}"


def shipped_releases() -> dict[str, dict[str, Any]]:
    """The release list shipped in the package (``tl_query_lens/saes/releases.json``)."""
    return json.loads(files("tl_query_lens.saes").joinpath("releases.json").read_text(encoding="utf-8"))


SAES_RELEASES = LocalReleases(
    prefix="tlql-saes-",
    cache_subdir="saes",
    loader_name="tlql_saes",
    command=train_command,
    shipped=shipped_releases,
    what="trained SAE or transcoder",
)


def register_releases(extra: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Add the suite releases to SAELens' pretrained directory; returns their names."""
    return SAES_RELEASES.register(extra)


register_releases()  # importing this module registers the releases (the package lists it in its `first` modules)
