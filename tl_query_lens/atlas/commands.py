"""``tlql atlas`` (:class:`~tl_query_lens.atlas.config.AtlasCommandConfig`): the checks before the model loads and
the build; under ``torchrun`` every rank builds its share and rank 0's result is presented."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from transformer_lens import HookedTransformer

from tl_query_lens.atlas.build import AtlasResult, build_atlas
from tl_query_lens.atlas.config import AtlasCommandConfig
from tl_query_lens.checks import check_context
from tl_query_lens.limits import ModelDims, check_limits


def check_atlas(cfg: AtlasCommandConfig, dims: ModelDims | None) -> None:
    """``tlql atlas`` before the model loads: window lengths against the context, ``--k-tokens`` against the
    vocabulary (the dictionaries, hooks, folder and disk space are checked by the build before its corpus pass)."""
    atlas = cfg.atlas
    check_context(dims, seq_len=atlas.seq_len, operator_seq_len=atlas.operator_seq_len)
    check_limits(dims, {"--k-tokens": (atlas.k_tokens, "d_vocab")}, cfg.run.model)


def run_atlas(model: HookedTransformer, cfg: AtlasCommandConfig) -> AtlasResult:
    """``tlql atlas``: :func:`~tl_query_lens.atlas.build.build_atlas` of ``cfg.atlas`` in ``--out`` (``run.out``),
    resuming the shards already there; the runner presents the result in ``<out>/result``."""
    atlas = replace(cfg.atlas, out=Path(cfg.run.out))
    return build_atlas(model, atlas.dictionary, atlas)
