"""Configs of the dictionary commands, torch-free (the command line builds them before torch loads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.config import RunConfig
from tl_query_lens.dictionaries.splice import FFKVSummaryConfig


@dataclass
class FFKVCommandConfig:
    """``tlql ffkv``: FF-KV dictionaries of chosen layers, summarised on the corpus (alive rate, L0, EV, CE change).

    Attributes:
        run: model, corpus, layers, sizes, output and W&B.
        summary: the summary's options.
        save_dictionaries: also save each layer's TopK FF-KV dictionary in SAELens format (<out>/layer<L>/sae).
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/ffkv", layers="0,6,12,18,24,29", n_seqs=32, seq_len=64)
    )
    summary: FFKVSummaryConfig = field(default_factory=FFKVSummaryConfig)
    save_dictionaries: bool = False

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "n_seqs", "seq_len", "layers", "out", "wandb", "wandb_project",
    )  # fmt: skip
