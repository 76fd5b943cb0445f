"""Configs of the experiments of ``tlql reproduce``, torch-free.

An experiment is shaped as every command is (:mod:`tl_query_lens.command`): a config dataclass whose defaults are the
size the docs document and whose ``quick()`` is the reduced size of ``tlql reproduce --quick``, and a
``run(model, cfg)`` in :mod:`tl_query_lens.reproduce.experiments` that returns one result. Each nests a
:class:`~tl_query_lens.config.RunConfig`: its corpus, sizes and layers, and ``out``, the experiment's folder (set by
the loop of :func:`tl_query_lens.reproduce.run.reproduce`; partial results resume from there).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from tl_query_lens.config import RunConfig

SUITE_LAYERS = "6,12,18,24"


@dataclass
class CertifyFFKVConfig:
    """Paper protocol, FF-KV TopK-``k`` of ``run.layers``, with its feature-shuffled twin.

    Attributes:
        run: corpus and layer. n_cal: calibration windows. n_eval: evaluation windows (None: one per document).
        k: TopK size.
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(layers="24"))
    n_cal: int = 128
    n_eval: int | None = None
    k: int = 64

    SIZES: ClassVar[dict[str, str]] = {
        "full": "n_cal 128, one window per evaluation document (N = 409)",
        "quick": "n_cal 128, N = 128",
    }

    @classmethod
    def quick(cls) -> CertifyFFKVConfig:
        """N = 128 evaluation windows."""
        return cls(n_eval=128)


@dataclass
class CertifyDepthConfig:
    """Paper protocol on the suite's residual SAEs of ``run.layers``.

    Attributes:
        run: corpus and layers. n_cal: calibration windows. n_eval: evaluation windows (None: one per document).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(layers=SUITE_LAYERS))
    n_cal: int = 512
    n_eval: int | None = None

    SIZES: ClassVar[dict[str, str]] = {"full": "n_cal 512, N = 409", "quick": "n_cal 256, N = 128"}

    @classmethod
    def quick(cls) -> CertifyDepthConfig:
        """n_cal 256, N = 128."""
        return cls(n_cal=256, n_eval=128)


@dataclass
class CertifyBroadConfig:
    """Paper protocol on the 'broad' corpus for one family of dictionaries at ``run.layers`` (reproduction §4.3).

    Attributes:
        run: corpus and layers. n_cal: calibration windows. n_eval: evaluation documents.
        family: 'saes' (the suite's residual SAEs) or 'ffkv' (FF-KV TopK-64).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(corpus="broad", layers=SUITE_LAYERS))
    n_cal: int = 512
    n_eval: int = 5000
    family: str = "saes"

    SIZES: ClassVar[dict[str, str]] = {
        "full": "'broad' corpus, n_cal 512, N = 5,000 documents",
        "quick": "'broad' corpus, n_cal 128, N = 128 documents",
    }

    @classmethod
    def quick(cls) -> CertifyBroadConfig:
        """n_cal 128, N = 128."""
        return cls(n_cal=128, n_eval=128)


@dataclass
class CertifyBroadFFKVConfig(CertifyBroadConfig):
    """:class:`CertifyBroadConfig` of the FF-KV family.

    Attributes:
        family: 'ffkv'.
    """

    family: str = "ffkv"


@dataclass
class ReadoutPaperConfig:
    """The authors' readout diagnostics on final-layer states with the shipped readout SAE ``sae_id``.

    Attributes:
        run: corpus and sizes of the states. sae_id: the shipped readout SAE. max_states: ablation states (None:
            the protocol's default, 256).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(corpus="stdlib", n_seqs=32, seq_len=17))
    sae_id: str = "small"
    max_states: int | None = None

    SIZES: ClassVar[dict[str, str]] = {
        "full": "32 x 17 final-layer states, 256 ablation states",
        "quick": "16 x 17 states, 64 ablation states",
    }

    @classmethod
    def quick(cls) -> ReadoutPaperConfig:
        """16 x 17 states, 64 ablation states."""
        default = cls()
        return cls(run=replace(default.run, n_seqs=16), max_states=64)


@dataclass
class Table1ExperimentConfig:
    """Query Lens Table 1 under the paper's protocol on the suite's residual SAEs' features; the max-activating
    contexts are searched in ``run.corpus``.

    Attributes:
        run: corpus, sizes and layers of the max-activating search. features_per_layer: features per layer.
        n_prompts: neutral prompts steered. n_generate: tokens generated per prompt.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(corpus="stdlib", n_seqs=128, seq_len=32, layers=SUITE_LAYERS)
    )
    features_per_layer: int = 13
    n_prompts: int = 2
    n_generate: int = 10

    SIZES: ClassVar[dict[str, str]] = {
        "full": "layers 6/12/18/24 x 13 features, 128 x 32 tokens, 2 prompts x 10 tokens, 64 operator tokens",
        "quick": "layers 12/24 x 6 features, 48 x 32 tokens, 1 prompt x 5 tokens, 64 operator tokens",
    }

    @classmethod
    def quick(cls) -> Table1ExperimentConfig:
        """Layers 12/24 x 6 features, 48 windows, 1 prompt x 5 tokens."""
        default = cls()
        run = replace(default.run, n_seqs=48, layers="12,24")
        return cls(run=run, features_per_layer=6, n_prompts=1, n_generate=5)


@dataclass
class Table1BroadConfig(Table1ExperimentConfig):
    """:class:`Table1ExperimentConfig` with the max-activating contexts from 'broad' prose (§4.2).

    Attributes:
        run: as Table1ExperimentConfig, on the 'broad' corpus.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(corpus="broad", n_seqs=128, seq_len=32, layers=SUITE_LAYERS)
    )

    SIZES: ClassVar[dict[str, str]] = {
        "full": "as table1_saes, the 128 x 32 max-activating tokens from the 'broad' corpus",
        "quick": "as table1_saes quick, the 48 x 32 max-activating tokens from the 'broad' corpus",
    }


@dataclass
class FFKVComparisonConfig:
    """The FF-KV paper's comparison: FF-KV variants, the suite's SAE and transcoder, a random model (no absorption).

    Attributes:
        run: corpus, sizes and layers. k: TopK FF-KV size.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(corpus="stdlib", n_seqs=32, seq_len=64, layers=SUITE_LAYERS)
    )
    k: int = 32

    SIZES: ClassVar[dict[str, str]] = {
        "full": "layers 6/12/18/24, 32 x 64 tokens, no absorption",
        "quick": "layer 24, 8 x 64 tokens",
    }

    @classmethod
    def quick(cls) -> FFKVComparisonConfig:
        """Layer 24, 8 windows."""
        return cls(run=replace(cls().run, n_seqs=8, layers="24"))
