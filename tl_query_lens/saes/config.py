"""Options of the trained suite (training and the quality report), torch-free: the command line builds them before torch
loads (docs/saes.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.dictionaries.config import CompareConfig

Kind = Literal["sae", "transcoder"]
#: The training recipe's name: changed with code changes that alter trained weights (part of the checkpoint
#: fingerprint, :meth:`SAESuiteConfig.fingerprint`).
RECIPE = "transcoder-input-centred"


@dataclass
class SAESuiteConfig:
    """What to train (defaults: the shipped suite of the embedded model, docs/saes.md).

    Attributes:
        model: model name; names the release ``tlql-saes-<model>``.
        layers: layers of the residual SAEs (``blocks.L.hook_resid_post``) and transcoders (MLP input →
            ``blocks.L.hook_mlp_out``).
        kinds: which dictionaries to train per layer.
        d_sae: dictionary width.
        k: active features per token (TopK) of the residual SAEs.
        transcoder_k: active features per token of the transcoders (``None``: ``k``). The shipped suite uses 64:
            at k=32 the layer-12 and layer-24 transcoders stopped at CE recovered 0.843 / 0.811 after 2M tokens
            (docs/saes.md), while the residual SAEs reached 0.98-0.999 at k=32.
        corpus: corpus source of the train split (see :func:`tl_query_lens.load_corpus`).
        n_seqs: training sequences in the activation cache (``None``: every window of the train split).
        seq_len: tokens per sequence.
        training_tokens: activations each dictionary is trained on (epochs over the cache as needed).
        batch_size_tokens: activations per optimiser step.
        lr: Adam learning rate (SAELens' constant schedule with warm-up and a final linear decay).
        lr_warm_up_steps: warm-up steps.
        lr_decay_fraction: share of the steps over which the rate decays linearly to lr/10 at the end.
        dead_feature_window: steps without firing after which a feature counts as dead (feeds the AuxK loss).
        n_checkpoints: checkpoints (and exports) during training.
        seed: corpus sampling, initialisation and data-order seed.
        activation_batch_size: sequences per forward pass of the activation cache.
        exclude_first_positions: leading positions of every window left out of training. SmolLM2's first position
            is an attention sink whose residual norm is ~100x the others (98.9% of the layer-12 residual variance
            of the cache, docs/saes.md): trained on it, an SAE spends its variance budget on one position. SAEBench
            leaves BOS out of reconstruction for the same reason; our windows start mid-text, so the rule is by
            position.
        autocast: run the dictionaries' training steps under bf16 autocast (SAELens' ``SAETrainerConfig.autocast``:
            fp32 master weights and Adam state, bf16 matrix products). On this project's 2-core AMX CPU a training
            step ran 1.6-2.0x faster (``benchmarks/bench_training.py``, docs/saes.md); the same switch on CUDA.
        autocast_lm: run the model's activation pass under bf16 autocast (SAELens' ``autocast_lm``); the cached
            activations differ from fp32 ones by ~0.8 % (residual) and ~1.6 % (MLP output) relative norm.
        init_biases_from_mean: start the biases at the data mean (OpenAI's TopK recipe starts b_pre at the
            geometric median; SAELens 6 starts them at zero). The cached activations' mean carries 36-66% of their
            squared norm (docs/saes.md), so from zero a few features aligned with the mean win every token and the
            rest die: an SAE's ``b_dec`` starts at the scaled input mean; a transcoder subtracts a fixed input mean
            before its encoder (folded into ``b_enc`` on export) and its ``b_dec`` starts at the output mean.
    """

    model: str = "smollm2-135m"
    layers: tuple[int, ...] = (6, 12, 18, 24)
    kinds: tuple[Kind, ...] = ("sae", "transcoder")
    d_sae: int = 4608
    k: int = 32
    transcoder_k: int | None = 64
    corpus: str = "stdlib"
    n_seqs: int | None = 2048
    seq_len: int = 128
    training_tokens: int = 2_000_000
    batch_size_tokens: int = 1024
    lr: float = 5e-4
    lr_warm_up_steps: int = 100
    lr_decay_fraction: float = 0.2
    dead_feature_window: int = 200
    n_checkpoints: int = 20
    seed: int = 0
    activation_batch_size: int = 8
    exclude_first_positions: int = 1
    init_biases_from_mean: bool = True
    autocast: bool = True
    autocast_lm: bool = True

    RANGES: ClassVar[dict[str, str]] = {
        "layers": "[0, inf)",
        "d_sae": "[1, inf)",
        "k": "[1, inf)",
        "transcoder_k": "[1, inf)",
        "n_seqs": "[1, inf)",
        "seq_len": "[2, inf)",
        "training_tokens": "[1, inf)",
        "batch_size_tokens": "[1, inf)",
        "lr": "(0, inf)",
        "lr_warm_up_steps": "[0, inf)",
        "lr_decay_fraction": "[0, 1)",
        "dead_feature_window": "[1, inf)",
        "n_checkpoints": "[0, inf)",
        "seed": "[0, 4294967295]",
        "activation_batch_size": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.layers = tuple(int(x) for x in self.layers)
        self.kinds = tuple(self.kinds)
        if not self.layers:
            raise ValueError("layers is empty; give at least one layer, e.g. layers=(12,).")
        bad = [kind for kind in self.kinds if kind not in ("sae", "transcoder")]
        if bad or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of ('sae', 'transcoder'), got {self.kinds}.")
        if not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae={self.d_sae}, got {self.k}.")
        if self.transcoder_k is not None and not 0 < self.transcoder_k <= self.d_sae:
            raise ValueError(f"transcoder_k must be in 1..d_sae={self.d_sae} (or None for k), got {self.transcoder_k}.")
        if self.training_tokens < self.batch_size_tokens:
            raise ValueError(
                f"training_tokens={self.training_tokens} is less than one batch ({self.batch_size_tokens})."
            )
        if not 0 <= self.exclude_first_positions < self.seq_len:
            raise ValueError(
                f"exclude_first_positions must be in 0..seq_len-1={self.seq_len - 1}, got {self.exclude_first_positions}."
            )
        if not 0 <= self.lr_decay_fraction < 1:
            raise ValueError(f"lr_decay_fraction must be in [0, 1), got {self.lr_decay_fraction}.")

    @property
    def n_steps(self) -> int:
        """Optimiser steps: enough batches for at least ``training_tokens`` activations."""
        return -(-self.training_tokens // self.batch_size_tokens)

    def fingerprint(self) -> str:
        """Hash of everything that changes the trained weights (not ``n_checkpoints``)."""
        keys = {k: v for k, v in asdict(self).items() if k not in ("n_checkpoints", "activation_batch_size")}
        keys["recipe"] = RECIPE
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class SAEReportConfig:
    """Evaluation tokens of the report.

    Attributes:
        corpus: corpus source; its evaluation split is used (disjoint from training by document hash).
        n_seqs: evaluation sequences.
        seq_len: tokens per sequence.
        seed: which windows are drawn.
        batch_size: sequences per forward pass.
        exclude_first_positions: leading positions left unspliced and out of the statistics (see
            :func:`~tl_query_lens.saes.report.suite_quality`).
    """

    corpus: str = "stdlib"
    n_seqs: int = 64
    seq_len: int = 128
    seed: int = 0
    batch_size: int = 8
    exclude_first_positions: int = 1

    RANGES: ClassVar[dict[str, str]] = {
        "n_seqs": "[1, inf)",
        "seq_len": "[2, inf)",
        "seed": "[0, 4294967295]",
        "batch_size": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.n_seqs < 1 or self.seq_len < 2 or self.batch_size < 1:
            raise ValueError("n_seqs and batch_size must be >= 1 and seq_len >= 2 (CE needs a next token).")


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
