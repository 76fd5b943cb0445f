"""``tlql ql-channels`` (:class:`~tl_query_lens.query_lens.config.ChannelsCommandConfig`): the checks before the
model loads, the run, and its result (the channel analysis with the run's wall time)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from transformer_lens import HookedTransformer

from tl_query_lens import corpus
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.errors import InputError
from tl_query_lens.limits import ModelDims
from tl_query_lens.paths import check_folder
from tl_query_lens.presentation import Table
from tl_query_lens.query_lens.channels import ChannelAnalysis, SubspaceChannelsConfig, subspace_channels
from tl_query_lens.query_lens.config import ChannelsCommandConfig
from tl_query_lens.ranges import parse_layers
from tl_query_lens.results import SavableResult


@dataclass
class ChannelsRun(SavableResult):
    """What ``tlql ql-channels`` returns: the analysis (saved in ``<out>/channels``) and how long the run took.

    Attributes:
        channels: the channel analysis of the source layers.
        sources: the source layers.
        seconds: wall time of the run (operators, fits and permutations).
    """

    channels: ChannelAnalysis
    sources: list[int]
    seconds: float

    title: ClassVar[str] = "Subspace channels"

    def scalars(self) -> dict[str, float]:
        """The analysis' summary per fit (:meth:`ChannelAnalysis.scalars`) and ``total_s``."""
        return self.channels.scalars() | {"total_s": self.seconds}

    def tables(self) -> dict[str, Table]:
        return self.channels.tables()

    def figures(self) -> dict[str, Any]:
        return self.channels.figures()

    def summary_line(self) -> str:
        """The channels, and per fit the overlap of same- vs different-destination pairs and the held-out means."""
        res = self.channels
        lines = [
            f"{len(res.channels)} channels of source layer(s) {self.sources}, rank {res.rank}, {self.seconds:.0f} s"
        ]
        for fit, s in res.summary.items():
            means = {c: sum(res.metrics[fit][n][c] for n in res.channels) / len(res.channels) for c in res.METRICS}
            lines.append(
                f"  {fit}: OL same {s['ol_same']:.3f} ({s['n_same']} pairs) vs different {s['ol_different']:.3f} "
                f"({s['n_different']}), AUC {s['auc']:.3f}, p {s['p_value']:.2g}, random {s['ol_random']:.3f}; "
                "held-out " + ", ".join(f"{c} {v:.4g}" for c, v in means.items())
            )
        return "\n".join(lines)


def check_destinations(sources: list[int], n_layers: int, cfg: SubspaceChannelsConfig) -> None:
    """The channels of ``sources`` need blocks after them, and for ``--destination layer`` at least two destination
    layers (the overlap of same- and different-destination pairs is compared)."""
    allowed = set(cfg.operator_layers) if cfg.operator_layers else set(range(n_layers))
    blocks = {b for s in sources for b in range(s + 1, n_layers)} & allowed
    if not blocks:
        raise InputError(
            f"--sources {','.join(map(str, sources))}: no block after them (among --operator-layers) receives their "
            f"channels; the model has layers 0..{n_layers - 1}, so choose earlier source layers."
        )
    shown = ",".join(map(str, sources))
    if cfg.destination == "layer" and len(blocks) == 1:
        raise InputError(
            f"--sources {shown} send their channels to block {min(blocks)} only, so --destination layer has no "
            f"different-destination pairs to compare; choose source layers before {min(blocks) - 1}."
        )
    shared = [b for b in blocks if sum(s < b for s in sources) >= 2]
    if cfg.destination == "module" and not shared:
        raise InputError(
            f"--destination module compares channels of different source layers into one module, but --sources "
            f"{shown} share no block after them; give at least two source layers before the last block (e.g. "
            "--sources 6,12) or use --destination layer."
        )


def _layers(cfg: ChannelsCommandConfig, n_layers: int | None) -> list[int]:
    """The source layers, with ``--operator-layers`` checked against the model too; the destinations where the
    model's depth is known."""
    sources = parse_layers(cfg.run.layers, n_layers, "--sources")
    operator_layers = cfg.channels.operator_layers
    parse_layers(",".join(map(str, operator_layers or ())) or "all", n_layers, "--operator-layers")
    if n_layers is not None:
        check_destinations(sources, n_layers, cfg.channels)
    return sources


def check_ql_channels(cfg: ChannelsCommandConfig, dims: ModelDims | None) -> None:
    """``tlql ql-channels`` before the model loads: the operator cache folder, the source and operator layers."""
    if cfg.channels.engine.cache_dir is not None:
        check_folder(cfg.channels.engine.cache_dir, "--cache-dir")
    _layers(cfg, dims.n_layers if dims else None)


def run_ql_channels(model: HookedTransformer, cfg: ChannelsCommandConfig) -> ChannelsRun:
    """``tlql ql-channels``: the FF-KV dictionary of each source layer, the module operators of the blocks after
    them on ``--op-seqs`` train windows (kept in ``--cache-dir``, default ``<out>/operators``), and the channel fits
    (:func:`~tl_query_lens.query_lens.channels.subspace_channels`)."""
    start = time.time()
    run, channels = cfg.run, cfg.channels
    if channels.engine.cache_dir is None:
        channels = replace(channels, engine=replace(channels.engine, cache_dir=str(Path(run.out) / "operators")))
    sources = _layers(cfg, model.cfg.n_layers)
    tokens = corpus.load_corpus(run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="train", seed=run.seed)
    dictionaries = {layer: FFKV.from_model(model, layer) for layer in sources}
    result = subspace_channels(model, dictionaries, tokens, cfg=channels)
    return ChannelsRun(channels=result, sources=sources, seconds=time.time() - start)
