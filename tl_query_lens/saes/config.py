"""Configs of the ``tlql saes`` commands (train, compare, report): each nests the run's options
(:class:`~tl_query_lens.config.RunConfig`) and the method's config; the command line builds them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.dictionaries.compare import CompareConfig
from tl_query_lens.saes.report import SAEReportConfig
from tl_query_lens.saes.train import SAESuiteConfig


@dataclass
class SAETrainCommandConfig:
    """``tlql saes train``: train (or resume) the SAE / transcoder suite into the user cache.

    Attributes:
        run: the device (the model, corpus, seed and sizes are the suite's), and where the run's record goes.
        suite: what to train.
        restart: start training again (earlier checkpoints are set aside) instead of resuming.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(
            device="cpu", corpus="stdlib", n_seqs=2048, seq_len=128, out="results/saes_train", wandb=False
        )
    )
    suite: SAESuiteConfig = field(default_factory=SAESuiteConfig)
    restart: bool = False

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("device", "out")
    ALIASES: ClassVar[dict[str, str]] = {"batch_size_tokens": "--batch-size"}
    #: ``--n-seqs 0`` means None: every window of the train split.
    NONE_AS: ClassVar[dict[str, int]] = {"n_seqs": 0}
    SHOWN: ClassVar[dict[str, str]] = {"n_seqs": "2048; 0: every window of the train split"}


@dataclass
class SAECompareCommandConfig:
    """``tlql saes compare``: FF-KV (vanilla / TopK / normalized) vs the suite's SAEs and transcoders vs a random model.

    Attributes:
        run: model, corpus, layers, sizes, output and W&B.
        compare: the comparison's options (absorption's among them).
        release: SAELens release whose SAEs / transcoders at --layers join the table ('' for none).
        dictionaries: more dictionaries: folders saved with save_model, '<release>:<sae_id>' or
            '<hf-org>/<repo>:<sae_id>'.
        k: TopK FF-KV size (default: the k of the layer's TopK SAE when loaded, else 32).
        absorption: score first-letter absorption.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/saes_compare", layers="6,12,18,24", n_seqs=32, seq_len=64)
    )
    compare: CompareConfig = field(default_factory=CompareConfig)
    release: str = "tlql-saes-smollm2-135m"
    dictionaries: tuple[str, ...] = ()
    k: int | None = None
    absorption: bool = True

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "n_seqs", "seq_len", "layers", "out", "wandb", "wandb_project",
    )  # fmt: skip
    ALIASES: ClassVar[dict[str, str]] = {"n_icl_examples": "--icl"}
    #: ``--batch-size`` feeds the splice metrics' batches and absorption's prompt batches alike.
    SHOWN: ClassVar[dict[str, str]] = {"batch_size": "8 sequences for the splice metrics, 16 prompts for absorption"}
    RANGES: ClassVar[dict[str, str]] = {"k": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class SAEReportCommandConfig:
    """``tlql saes report``: quality of each trained dictionary of the suite on the evaluation split.

    Attributes:
        run: model, device, output and W&B (the corpus, seed and sizes are the report's).
        report: the evaluation tokens of the report.
        ids: comma-separated dictionary ids of the model's release (tlql-saes-<model>), or 'all'.
        protocol: 'project' (this package's splice, first position clean), and comma-separated, beside it:
            'saelens' (SAELens' own run_evals of the residual SAEs on the same windows: every position spliced,
            special tokens left out by id), 'saebench' (SAEBench's core run_evals through the SAELens-6 adapter of
            tl_query_lens.saes.saebench_eval: every position spliced, special tokens out of the statistics).
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(
            device="cpu", corpus="stdlib", n_seqs=64, seq_len=128, out="results/saes_report"
        )
    )
    report: SAEReportConfig = field(default_factory=SAEReportConfig)
    ids: str = "all"
    protocol: str = "project"

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "device", "out", "wandb", "wandb_project")

    def __post_init__(self) -> None:
        names = self.protocols()
        if not names or not names <= {"project", "saelens", "saebench"}:
            raise ValueError(
                f"protocol must be project, saelens, saebench or a comma list of them, got {self.protocol!r}."
            )

    def protocols(self) -> set[str]:
        """The protocol names asked for."""
        return {p.strip() for p in self.protocol.split(",") if p.strip()}

    def id_list(self) -> list[str] | None:
        """The ids asked for (None: every id of the release)."""
        return None if self.ids == "all" else [i.strip() for i in self.ids.split(",") if i.strip()]
