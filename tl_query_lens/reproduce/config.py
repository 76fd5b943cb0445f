"""Options of ``tlql reproduce``, torch-free: the command line builds them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig
from tl_query_lens.errors import InputError


@dataclass
class ReproduceConfig:
    """Options of :func:`~tl_query_lens.reproduce.run.reproduce`.

    Attributes:
        size: ``"full"``: the sizes the docs document (hours on a 2-core CPU); ``"quick"``: a reduced version of
            every experiment (minutes), compared with the documented quick run.
        experiments: run only these experiments (empty: all); names from ``tl_query_lens.reproduce.EXPERIMENTS``
            (checked by :func:`~tl_query_lens.reproduce.run.check_experiments` before the first runs).
        out: folder of the experiments' results and of the table (CSV and markdown).
        record: write this run's figures into the package's ``documented.json`` as the documented values of
            ``size`` (for maintainers, after checking them; the docs quote that file).
    """

    size: Literal["quick", "full"] = "full"
    experiments: tuple[str, ...] = ()
    out: str = "results/reproduce"
    record: bool = False

    def __post_init__(self) -> None:
        self.experiments = tuple(self.experiments)
        if self.size not in ("quick", "full"):
            raise InputError(f"size must be 'quick' or 'full', got {self.size!r}.")


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
