"""Options of readout-SAE fits, evaluations, the paper's diagnostics and the cross-lens prompts, torch-free: the command
line builds them before torch loads (docs/readout.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.paths import plain_name
from tl_query_lens.protocols import ProtocolName, resolve_protocol

#: Prefix of the readout releases' names (``tlql-readout-<model>``, :data:`~tl_query_lens.readout.registry.READOUT_RELEASES`).
RELEASE_PREFIX = "tlql-readout-"

Preset = Literal["small", "paper", "cpu"]


BASELINE_ORDER = (
    "shuffled_codes",
    "random_support",
    "pca256",
    "hard_assignment",
    "kmeans_ridge_small",
    "kmeans_ridge_full",
    "knn_basis",
    "nearest_row_ridge",
)


ReadoutProtocol = ProtocolName


PAPER_BASELINES = (
    "pca256",
    "hard_assignment",
    "kmeans_abs_cos_small",
    "kmeans_abs_cos_full",
    "knn_basis_excl_contrast",
    "nearest_row_ridge_excl_contrast",
)
"""The authors' row-geometry baselines (their direct-geometry grid), cheapest first."""


OWN_VARIANTS = ("kmeans_ridge_small", "kmeans_ridge_full", "knn_basis", "nearest_row_ridge")
"""This project's readings of the same baselines, scorable on the paper's pool by name (not in the margin)."""


CrossLensProtocol = ProtocolName


@dataclass
class ReadoutFitConfig:
    """Hyper-parameters of a readout-SAE fit. ``preset="paper"`` is the paper's GPU recipe (32×d, k=256, 20k steps).

    Attributes:
        width: dictionary size F (None: ``width_mult`` × d_model).
        width_mult: F / d_model when ``width`` is None.
        k: TopK budget.
        steps: optimiser steps.
        batch_rows: rows per step.
        batch_pairs: (state, top-1 token) pairs per step for the prism term.
        lr, weight_decay, clip: AdamW learning rate, weight decay, gradient-norm clip.
        lambda_prism, code_l2: loss weights.
        frequency_share: share of each row batch drawn by top-``top_n`` frequency (the rest uniform).
        top_n: how many top tokens per state count for the frequency.
        corpus, n_seqs, seq_len: the corpus (train split) read when no tokens are given.
        rare_rows: after the fit, a feature used by 1..rare_rows−1 vocabulary rows counts as rare (0: dead).
            During training the window rates count fires over the rows of the last ``log_every`` steps:
            dead = no fire, rare = fired on under 1e-4 of those rows.
        log_every: steps between logged scalars.
        max_seconds: stop early once the fit has run this long (wall clock); the steps done are recorded.
        seed: RNG seed.
    """

    width: int | None = None
    width_mult: int = 4
    k: int = 128
    steps: int = 1000
    batch_rows: int = 512
    batch_pairs: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    clip: float = 1.0
    lambda_prism: float = 1e-3
    code_l2: float = 1e-6
    frequency_share: float = 0.5
    top_n: int = 8
    corpus: str = "embedded"
    n_seqs: int = 32
    seq_len: int = 32
    rare_rows: int = 10
    log_every: int = 50
    max_seconds: float | None = None
    seed: int = 0

    RANGES: ClassVar[dict[str, str]] = {
        "width": "[1, inf)",
        "width_mult": "[1, inf)",
        "k": "[1, inf)",
        "steps": "[1, inf)",
        "batch_rows": "[1, inf)",
        "batch_pairs": "[1, inf)",
        "lr": "(0, inf)",
        "weight_decay": "[0, inf)",
        "clip": "(0, inf)",
        "lambda_prism": "[0, inf)",
        "code_l2": "[0, inf)",
        "frequency_share": "[0, 1]",
        "top_n": "[1, inf)",
        "n_seqs": "[1, inf)",
        "seq_len": "[1, inf)",
        "rare_rows": "[0, inf)",
        "log_every": "[1, inf)",
        "max_seconds": "(0, inf)",
        "seed": "[0, 4294967295]",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        for name in (
            "width_mult",
            "k",
            "steps",
            "batch_rows",
            "batch_pairs",
            "top_n",
            "n_seqs",
            "seq_len",
            "log_every",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ReadoutFitConfig.{name} must be positive, got {getattr(self, name)}.")
        if self.width is not None and self.width < self.k:
            raise ValueError(f"width={self.width} must be at least k={self.k}.")
        if not 0.0 <= self.frequency_share <= 1.0:
            raise ValueError(f"frequency_share must be in [0, 1], got {self.frequency_share}.")
        if min(self.lr, self.clip) <= 0 or min(self.weight_decay, self.lambda_prism, self.code_l2) < 0:
            raise ValueError("lr and clip must be positive; weight_decay, lambda_prism and code_l2 non-negative.")

    @classmethod
    def preset(cls, name: Preset = "small", **overrides) -> ReadoutFitConfig:
        """``"small"``: sized for a 2-core CPU on a 49k-vocabulary, d=576 model (the shipped release's ``small``);
        ``"paper"``: 32×d, k=256, 20k steps, 4096 rows per step (a GPU job). ``"cpu"`` is the old name of ``"small"``."""
        if name in ("small", "cpu"):
            return cls(**overrides)
        if name == "paper":
            return cls(
                **{"width_mult": 32, "k": 256, "steps": 20_000, "batch_rows": 4096, "batch_pairs": 1024, **overrides}
            )
        raise ValueError(f"Unknown preset {name!r}; choose 'small' or 'paper'.")


@dataclass
class ReadoutEvalConfig:
    """Options of :func:`~tl_query_lens.readout.evaluate.evaluate_readout`.

    Attributes:
        baselines: row-geometry baselines, run in this order (cheapest first by default).
        ablation_states: states of the ablation regression (0: skip it).
        n_boot: bootstrap resamples of the CIs.
        kmeans_widths: centroids of the small / full k-means baselines (default: width/4 and the SAE's width).
        kmeans_iters: k-means iterations. ridge_k: centroids per row in k-means + ridge (default: the SAE's k).
    """

    baselines: tuple[str, ...] = tuple(BASELINE_ORDER)
    ablation_states: int = 256
    n_boot: int = 1000
    kmeans_widths: tuple[int, int] | None = None
    kmeans_iters: int = 10
    ridge_k: int | None = None

    RANGES: ClassVar[dict[str, str]] = {
        "ablation_states": "[0, inf)",
        "n_boot": "[1, inf)",
        "kmeans_widths": "[1, inf)",
        "kmeans_iters": "[1, inf)",
        "ridge_k": "[1, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.baselines = tuple(self.baselines)
        unknown = [b for b in self.baselines if b not in BASELINE_ORDER]
        if unknown:
            raise ValueError(f"Unknown baselines {unknown}; choose from {list(BASELINE_ORDER)}.")
        if self.ablation_states < 0 or self.n_boot < 1 or self.kmeans_iters < 1:
            raise ValueError("ablation_states must be ≥ 0, n_boot and kmeans_iters ≥ 1.")


@dataclass
class PaperReadoutConfig:
    """Options of :func:`~tl_query_lens.readout.protocols.paper.readout_diagnostics_paper`.

    Attributes:
        n_features / n_control / max_states: ablated features per contrast (10), control draws per ablated feature
            (1), states used for the ablation. seed: random support, k-means initialisation, controls.
        baselines: row-geometry baselines scored on the pool (default: the authors' six; ``OWN_VARIANTS`` may be
            added by name; ``()`` for none).
        n_neighbours / neighbour_ridge: nearest-row ridge and kNN (128 rows, λ = 1e-3, as the authors).
        kmeans_widths: centroids of the small / full k-means (default: a quarter of the SAE's width and its width).
        kmeans_k: centroids per row (default: the SAE's k). kmeans_iters / kmeans_ridge: 12 and 1e-4 (the authors').
        own_kmeans_iters: iterations of this project's k-means variants (10, as ``evaluate_readout``).
    """

    n_features: int = 10
    n_control: int = 1
    max_states: int = 256
    seed: int = 0
    baselines: tuple[str, ...] = PAPER_BASELINES
    n_neighbours: int = 128
    neighbour_ridge: float = 1e-3
    kmeans_widths: tuple[int, int] | None = None
    kmeans_k: int | None = None
    kmeans_iters: int = 12
    kmeans_ridge: float = 1e-4
    own_kmeans_iters: int = 10

    RANGES: ClassVar[dict[str, str]] = {
        "n_features": "[1, inf)",
        "n_control": "[0, inf)",
        "max_states": "[1, inf)",
        "seed": "[0, 4294967295]",
        "n_neighbours": "[1, inf)",
        "neighbour_ridge": "[0, inf)",
        "kmeans_widths": "[1, inf)",
        "kmeans_k": "[1, inf)",
        "kmeans_iters": "[1, inf)",
        "kmeans_ridge": "[0, inf)",
        "own_kmeans_iters": "[1, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.baselines = tuple(self.baselines)
        known = PAPER_BASELINES + OWN_VARIANTS
        unknown = [b for b in self.baselines if b not in known]
        if unknown:
            raise ValueError(f"Unknown baselines {unknown} for protocol 'paper'; choose from {list(known)}.")
        if min(self.n_neighbours, self.kmeans_iters, self.own_kmeans_iters) < 1 or (self.kmeans_k or 1) < 1:
            raise ValueError("n_neighbours, kmeans_k, kmeans_iters and own_kmeans_iters must be ≥ 1.")
        if self.kmeans_widths is not None:
            widths = tuple(self.kmeans_widths)
            if len(widths) != 2 or min(widths) < 1:
                raise ValueError(f"kmeans_widths must be two positive widths (small, full), got {widths}.")
            self.kmeans_widths = widths  # type: ignore[assignment]


@dataclass
class CrossLensConfig:
    """Options of :func:`~tl_query_lens.readout.cross_lens_paper.cross_lens_prompts`.

    Attributes:
        protocol: ``"paper"`` or ``"tlql"`` (formerly ``"own-top1"``; the headline; both are computed).
        layers: the mid band (default :func:`~tl_query_lens.readout.cross_lens_paper.mid_band_layers`).
        target: the fixed token of the paper protocol: ``"answer"`` (the bank's) or ``"model-top1"`` (the model's own
            next-token prediction on the prompt).
        min_votes: layers that must agree (the authors: 2 of 4).
        n_shuffle: shuffled-pairing draws per prompt. seed: their seed.
    """

    protocol: CrossLensProtocol = "paper"
    layers: list[int] | None = None
    target: Literal["answer", "model-top1"] = "answer"
    min_votes: int = 2
    n_shuffle: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        self.protocol = resolve_protocol(self.protocol)  # type: ignore[assignment]
        if self.target not in ("answer", "model-top1"):
            raise ValueError(f"target must be 'answer' or 'model-top1', got {self.target!r}.")
        if self.min_votes < 1:
            raise ValueError("min_votes must be >= 1.")


READOUT_PRESETS = ("small", "paper")


@dataclass
class ReadoutFitCommandConfig:
    """``tlql readout fit``: fit a readout SAE to the model's LM head and cache it.

    Attributes:
        run: model, corpus, device, seed, output and W&B.
        preset: 'small' (sized for a 2-core CPU; the shipped fit) or 'paper' (32×d, k=256, 20k steps: a GPU job); the options below
            that are not given keep the preset's values.
        sae_id: name in the release.
        save: folder to save the SAE to (the user cache is where SAE.from_pretrained finds it).
        fit: the fit's hyper-parameters.
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(out="results/readout/fit"))
    preset: Literal["small", "paper"] = "small"
    sae_id: str | None = None
    save: str | None = None
    fit: ReadoutFitConfig = field(default_factory=ReadoutFitConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "corpus", "device", "seed", "out", "wandb", "wandb_project")
    SHOWN: ClassVar[dict[str, str]] = {
        "preset": "small",
        "sae_id": "the preset's name",
        "save": "the user cache",
        "width": "width_mult x d_model",
    }

    def __post_init__(self) -> None:
        if self.sae_id is not None:
            plain_name(self.sae_id, "sae_id")  # a folder of the user cache: nothing outside it

    @classmethod
    def presets(cls) -> dict[str, ReadoutFitCommandConfig]:
        """``--preset NAME``: the fit's hyper-parameters of :meth:`ReadoutFitConfig.preset` (options given apply on
        top)."""
        return {name: cls(preset=name, fit=ReadoutFitConfig.preset(name)) for name in READOUT_PRESETS}  # type: ignore[arg-type]


@dataclass
class ReadoutDecomposeCommandConfig:
    """``tlql readout decompose``: one score of one prompt split into readout features (exact, with bias and
    residual). The score: one of --token, --margin, --group, --vocab-contrast; none given: top-1 minus runner-up.

    Attributes:
        run: model, device, output and W&B.
        prompt: text; the state is read at --position.
        sae_id: readout SAE id in the model's release (fitted with `tlql readout fit`).
        sae_path: a saved readout SAE folder instead of the release.
        hook: residual hook read (default: the last block's hook_resid_post).
        position: token position of the state (-1: the last).
        top: features listed.
        token: the logit of this token (a string; mind the leading space).
        margin: the logit difference POS − NEG.
        group: the mean logit of these tokens.
        vocab_contrast: this token's logit minus the vocabulary mean.
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(out="results/readout/decompose"))
    prompt: str = field(default="", metadata={"positional": True})
    sae_id: str = "small"
    sae_path: str | None = None
    hook: str | None = None
    position: int = -1
    top: int = 10
    token: str | None = field(default=None, metadata={"exclusive": "score"})
    margin: tuple[str, str] | None = field(
        default=None, metadata={"exclusive": "score", "nargs": 2, "metavar": ("POS", "NEG")}
    )
    group: tuple[str, ...] | None = field(default=None, metadata={"exclusive": "score", "nargs": "+"})
    vocab_contrast: str | None = field(default=None, metadata={"exclusive": "score"})

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "device", "seed", "out", "wandb", "wandb_project")
    RANGES: ClassVar[dict[str, str]] = {"position": "(-inf, inf)", "top": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)
        plain_name(self.sae_id, "sae_id")  # a folder of the user cache: nothing outside it
        self.margin = None if self.margin is None else tuple(self.margin)  # type: ignore[assignment]
        self.group = None if self.group is None else tuple(self.group)


@dataclass
class ReadoutEvalCommandConfig:
    """``tlql readout eval``: diagnostics of a readout SAE and row-geometry baselines on held-out states, under this
    project's mixed-layers protocol or the paper's.

    Attributes:
        run: model, corpus, held-out windows, output and W&B.
        sae_id: readout SAE id in the model's release (fitted with `tlql readout fit`).
        sae_path: a saved readout SAE folder instead of the release.
        protocol: 'mixed-layers' (this project's: logit-lens states of 4 layers, 3 contrast families, baselines) or
            'paper' (the authors': final-layer states, top-1 vs top-2 / vocabulary mean, ρ₀, through-origin ablation
            R² over top-10 of covered contrasts, their baselines: neighbours without the contrast tokens, k-means by
            |cos|).
        baselines: comma list (default: the protocol's own set, cheapest first; '' for none). 'paper' also takes
            this project's variants by name (nearest_row_ridge, knn_basis, kmeans_ridge_small, kmeans_ridge_full).
        readout: the mixed-layers protocol's options.
        paper: the paper protocol's options (those it shares with the mixed-layers protocol take the same options).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(out="results/readout/eval", n_seqs=32, seq_len=17))
    sae_id: str = "small"
    sae_path: str | None = None
    protocol: Literal["mixed-layers", "paper"] = "mixed-layers"
    baselines: str | None = None
    readout: ReadoutEvalConfig = field(default_factory=ReadoutEvalConfig)
    paper: PaperReadoutConfig = field(default_factory=PaperReadoutConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "n_seqs", "seq_len", "out", "wandb", "wandb_project",
    )  # fmt: skip
    NOT_OPTIONS: ClassVar[tuple[str, ...]] = ("readout.baselines", "paper.baselines")  # from --baselines, by protocol

    def __post_init__(self) -> None:
        plain_name(self.sae_id, "sae_id")  # a folder of the user cache: nothing outside it
