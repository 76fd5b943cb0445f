"""Sizes of each step of ``tlql demo`` (:func:`~tl_query_lens.demo.run_demo`), torch-free: the command line builds
them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tl_query_lens.config import check_ranges
from tl_query_lens.paths import shipped_ids, shipped_root
from tl_query_lens.readout.config import RELEASE_PREFIX


@dataclass
class DemoConfig:
    """Sizes of each demo step; :meth:`quick` gives a first look in a few minutes on a 2-core CPU.

    Attributes:
        out: folder of the results, the report and the W&B run.
        model: the model ('smollm2-135m': the embedded one, offline).
        corpus: corpus source (see :func:`tl_query_lens.load_corpus`).
        ffkv_layers: layers summarised as FF-KV dictionaries.
        ql_layer: layer whose FF-KV features get key and value signatures.
        n_features: features shown as cards (seeded sample of features active on the corpus).
        operator_seqs: corpus windows of the transition operators (Query Lens).
        seq_len: tokens per window of the operator corpus.
        operator_cache: folder where the transition operators are kept and reused by later runs (keyed by model,
            hooks, corpus fingerprint, dtype); ``None`` means ``<user cache>/operators``.
        splice_seqs: evaluation sequences for the FF-KV splice metrics.
        readout_overrides: fields of the readout fit (``ReadoutFitConfig``), used only when ``readout_sae_id`` is
            neither shipped nor cached (the full demo caps that fit at 480 s).
        readout_sae_id: id of the readout SAE, loaded with SAE.from_pretrained: 'small' ships with the package; an id
            that is neither shipped nor in the user cache is fitted once and cached.
        cert_layer: layer of the certified FF-KV TopK-``k`` proxy.
        n_cal: calibration sequences of the certificate.
        n_eval: evaluation sequences of the certificate (its N).
        k: active features of that TopK proxy.
        seed: seed of the corpus windows and of the feature sample.
        use_wandb: log the run to W&B (offline unless WANDB_MODE says otherwise).
        atlas_tokens: corpus tokens of the atlas pass (contexts, histograms and statistics of every feature of the
            cards' dictionary); the default, 768 windows of 64, is nearly all of the embedded corpus' evaluation split
            (769 windows).
    """

    out: Path = Path("results/demo")
    model: str = "smollm2-135m"
    corpus: str = "embedded"
    ffkv_layers: tuple[int, ...] = (6, 12, 18, 24)
    ql_layer: int = 18
    n_features: int = 8
    operator_seqs: int = 32  # 8× the 4 × 32 tokens the full d × d operators allowed: 8 features use the feature basis
    seq_len: int = 32
    operator_cache: Path | None = None
    splice_seqs: int = 16
    readout_sae_id: str = "small"
    readout_overrides: dict = field(default_factory=lambda: {"max_seconds": 480.0})
    cert_layer: int = 18
    k: int = 64
    n_cal: int = 256
    n_eval: int = 1000
    seed: int = 0
    use_wandb: bool = True
    atlas_tokens: int = 49_152

    @classmethod
    def quick(cls, **overrides) -> DemoConfig:
        # The shipped 1000-step readout SAE when the package carries it (no fit at all); otherwise an 80-step fit,
        # cached under its own id "quick", never under the full preset's.
        shipped = "small" in shipped_ids(shipped_root() / (RELEASE_PREFIX + overrides.get("model", cls.model)))
        base = {
            "ffkv_layers": (12, 24),
            "ql_layer": 24,
            "n_features": 4,
            "operator_seqs": 1,
            "seq_len": 12,
            "splice_seqs": 4,
            "readout_sae_id": "small" if shipped else "quick",
            "readout_overrides": {"width_mult": 2, "k": 32, "steps": 80, "n_seqs": 8},
            "cert_layer": 24,
            "n_cal": 32,
            "n_eval": 96,
            "atlas_tokens": 4096,
        }
        return cls(**{**base, **overrides})

    RANGES: ClassVar[dict[str, str]] = {
        "ffkv_layers": "[0, inf)",
        "ql_layer": "[0, inf)",
        "n_features": "[1, inf)",
        "operator_seqs": "[1, inf)",
        "seq_len": "[2, inf)",
        "splice_seqs": "[1, inf)",
        "cert_layer": "[0, inf)",
        "k": "[1, inf)",
        "n_cal": "[1, inf)",
        "n_eval": "[1, inf)",
        "atlas_tokens": "[1, inf)",
        "seed": "[0, 4294967295]",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
