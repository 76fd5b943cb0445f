"""Configs of the Query Lens commands: what the command line builds before the model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.config import RunConfig
from tl_query_lens.query_lens.channels import SubspaceChannelsConfig


@dataclass
class ChannelsCommandConfig:
    """``tlql ql-channels``: subspace channels of the FF-KV value vectors of the source layers ``--sources`` through
    the module operators of the blocks after them (docs/query_lens_evaluation.md).

    Attributes:
        run: model, corpus of the operators (``--op-seqs`` windows of ``--op-seq-len`` tokens), source layers,
            output and W&B.
        channels: the channel fits and the operator engine.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/ql_channels", layers="18", n_seqs=2, seq_len=32)
    )
    channels: SubspaceChannelsConfig = field(default_factory=SubspaceChannelsConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "n_seqs", "seq_len", "layers", "out", "wandb", "wandb_project",
    )  # fmt: skip
    ALIASES: ClassVar[dict[str, str]] = {"layers": "--sources", "n_seqs": "--op-seqs", "seq_len": "--op-seq-len"}
    SHOWN: ClassVar[dict[str, str]] = {"cache_dir": "<--out>/operators"}
