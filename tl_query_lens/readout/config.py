"""Configs of the readout commands (``tlql readout fit | decompose | eval``): the run's options, the command's own few
and the method's configs nested (:class:`~tl_query_lens.readout.fit.ReadoutFitConfig`,
:class:`~tl_query_lens.readout.evaluate.ReadoutEvalConfig`, :class:`~tl_query_lens.readout.protocols.paper.
PaperReadoutConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.paths import plain_name
from tl_query_lens.readout.evaluate import ReadoutEvalConfig
from tl_query_lens.readout.fit import ReadoutFitConfig
from tl_query_lens.readout.protocols.paper import PaperReadoutConfig

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
