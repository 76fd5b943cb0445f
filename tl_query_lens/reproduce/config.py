"""The config of ``tlql reproduce`` (the command line builds it before the experiments run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.config import RunConfig
from tl_query_lens.reproduce.run import ReproduceConfig


@dataclass
class ReproduceCommandConfig:
    """``tlql reproduce``: every reproduction row re-measured and set beside the paper and the docs.

    Attributes:
        run: model, device, the results folder and W&B.
        reproduce: which experiments, at which size, and whether to record the figures.
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(out="results/reproduce"))
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "device", "out", "wandb", "wandb_project")

    @classmethod
    def quick(cls) -> ReproduceCommandConfig:
        """A reduced version of every experiment (12 min 48 s on a shared 2-core CPU, docs/reproduction.md),
        compared with the documented quick run."""
        return cls(reproduce=ReproduceConfig(size="quick"))
