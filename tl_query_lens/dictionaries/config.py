"""Options of the dictionary methods (FF-KV splice summary, dictionary comparison, absorption, faithfulness), torch-free:
the command line builds them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.config import RunConfig, check_ranges


@dataclass
class FFKVSummaryConfig:
    """Options of :func:`~tl_query_lens.dictionaries.splice.ffkv_summary`.

    Attributes:
        k: TopK size of the sparse FF-KV splice.
        dense: also splice the vanilla (dense, exact) FF-KV dictionary.
        batch_size: sequences per forward pass.
    """

    k: int = 64
    dense: bool = True
    batch_size: int = 8

    RANGES: ClassVar[dict[str, str]] = {
        "k": "[1, inf)",
        "batch_size": "[1, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.k < 1 or self.batch_size < 1:
            raise ValueError(f"k and batch_size must be ≥ 1, got k={self.k}, batch_size={self.batch_size}.")


@dataclass
class AbsorptionConfig:
    """Options of the first-letter absorption metric (defaults: sae_bench 0.6.0 ``AbsorptionEvalConfig``).

    Attributes:
        n_words: words sampled from the vocabulary (SAEBench: all alphabetic tokens).
        train_fraction: share of words used to train the probes (SAEBench 0.8).
        template: prompt template; ``{word}`` is replaced by the word token.
        n_icl_examples: in-context examples per prompt (SAEBench 10).
        max_k: largest k of the k-sparse probes (SAEBench 10).
        f1_jump: F1 rise that makes a k-sparse probe's extra latent a split of the main feature (0.03).
        min_probe_f1: letters whose probe has test F1 above this are scored (0.6).
        min_letters: fewer qualifying letters → no score (SAEBench 20).
        full_cos: min cosine probe–top latent for full absorption (0.025).
        fraction_cos: min cosine probe–absorbing latent for the absorption fraction (0.1).
        projection_share: min share of the probe projection an absorber must carry (0.4).
        max_absorbers: latents that may share the absorbed projection (3).
        probe_epochs / probe_batch / probe_lr / probe_wd: the ground-truth probe (50, 64, 1e-2, 1e-4).
        sparse_l1 / sparse_epochs / sparse_batch: the L1 probe that ranks latents (0.01, 50, 4096).
        batch_size: prompts per forward pass.
        seed: word sampling, ICL examples, probe initialisation.
    """

    n_words: int = 2000
    train_fraction: float = 0.8
    template: str = " has the first letter:"
    n_icl_examples: int = 10
    max_k: int = 10
    f1_jump: float = 0.03
    min_probe_f1: float = 0.6
    min_letters: int = 20
    full_cos: float = 0.025
    fraction_cos: float = 0.1
    projection_share: float = 0.4
    max_absorbers: int = 3
    probe_epochs: int = 50
    probe_batch: int = 64
    probe_lr: float = 1e-2
    probe_wd: float = 1e-4
    sparse_l1: float = 0.01
    sparse_epochs: int = 50
    sparse_batch: int = 4096
    batch_size: int = 16
    seed: int = 0

    RANGES: ClassVar[dict[str, str]] = {
        "n_words": "[2, inf)",
        "train_fraction": "(0, 1)",
        "n_icl_examples": "[0, inf)",
        "max_k": "[1, inf)",
        "f1_jump": "[0, inf)",
        "min_probe_f1": "[0, 1]",
        "min_letters": "[1, inf)",
        "full_cos": "[-1, 1]",
        "fraction_cos": "[-1, 1]",
        "projection_share": "[0, 1]",
        "max_absorbers": "[1, inf)",
        "probe_epochs": "[1, inf)",
        "probe_batch": "[1, inf)",
        "probe_lr": "(0, inf)",
        "probe_wd": "[0, inf)",
        "sparse_l1": "[0, inf)",
        "sparse_epochs": "[1, inf)",
        "sparse_batch": "[1, inf)",
        "batch_size": "[1, inf)",
        "seed": "[0, 4294967295]",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.n_words < 2 or not 0 < self.train_fraction < 1:
            raise ValueError("AbsorptionConfig needs n_words ≥ 2 and 0 < train_fraction < 1.")
        if self.max_k < 1 or self.n_icl_examples < 0:
            raise ValueError("AbsorptionConfig needs max_k ≥ 1 and n_icl_examples ≥ 0.")


@dataclass
class FaithfulnessConfig:
    """Options of :func:`~tl_query_lens.dictionaries.faithfulness.transcoder_faithfulness`.

    Attributes:
        quantile: quantile of the null distribution (best cosines after random rotations) a match must exceed.
        n_rotations: random rotations of the transcoder's vectors that make the null distribution.
        chunk: rows per block of the all-pairs cosine search (memory grows with chunk x d_mlp).
        seed: seed of the random rotations.
    """

    quantile: float = 0.99
    n_rotations: int = 4
    chunk: int = 1024
    seed: int = 0

    RANGES: ClassVar[dict[str, str]] = {
        "quantile": "(0, 1)",
        "n_rotations": "[1, inf)",
        "chunk": "[1, inf)",
        "seed": "[0, 4294967295]",
    }

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class CompareConfig:
    """Options of :func:`~tl_query_lens.dictionaries.compare.compare_dictionaries`.

    Attributes:
        absorption: first-letter absorption options (``None`` skips absorption).
        faithfulness: transcoder-vs-FF-KV matching options.
        random_control: add FF-KV rows of a random-weights model of the same config (the paper's control).
        control_variants: FF-KV variants built on the random model.
        control_k: k of the random model's TopK FF-KV per layer (default: the k of the TopK FF-KV given for that
            layer, else 32).
        seed: the random model's weights.
        batch_size: sequences per forward pass of the splice metrics.
        exclude_first_positions: leading positions of every window left unspliced and unscored (SAEBench leaves
            BOS out; SmolLM2's first position is an attention sink, ``docs/saes.md``).
    """

    absorption: AbsorptionConfig | None = field(default_factory=AbsorptionConfig)
    faithfulness: FaithfulnessConfig = field(default_factory=FaithfulnessConfig)
    random_control: bool = True
    control_variants: tuple[str, ...] = ("vanilla", "topk")
    control_k: int | None = None
    seed: int = 0
    batch_size: int = 8
    exclude_first_positions: int = 1

    RANGES: ClassVar[dict[str, str]] = {
        "control_k": "[1, inf)",
        "seed": "[0, 4294967295]",
        "batch_size": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        bad = [v for v in self.control_variants if v not in ("vanilla", "topk", "normalized")]
        if bad:
            raise ValueError(f"control_variants must be FF-KV variants (vanilla/topk/normalized), got {bad}.")


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
