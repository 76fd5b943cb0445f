"""Configs of the Query Lens commands (``tlql query-lens``, ``tlql ql-evaluate``): the run's options, the command's own
few and the method's config nested (:class:`~tl_query_lens.query_lens.table1.Table1Config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.query_lens.table1 import Table1Config

ALL_RUN_OPTIONS = (
    "model", "corpus", "device", "seed", "n_seqs", "seq_len", "layers", "features", "dictionary", "out", "wandb",
    "wandb_project",
)  # fmt: skip


@dataclass
class QLEvaluateCommandConfig:
    """``tlql ql-evaluate``: the Query Lens paper's Table-1 protocol on features of FF-KV and/or SAELens dictionaries
    (one summary per dictionary family, side by side). ``--n-seqs`` / ``--seq-len``: the max-activating corpus
    (evaluation split).

    Attributes:
        run: model, corpus, layers, features, dictionaries, output and W&B.
        op_seqs: operator corpus: sequences (train split).
        op_seq_len: operator corpus: tokens per sequence.
        n_prompts: neutral prompts used for steering (the first n of a fixed list).
        table1: the protocol's options (its prompts: the first n_prompts; its features: --features).
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/ql_eval", layers="6,12,18,24", n_seqs=512, seq_len=32)
    )
    op_seqs: int = 2
    op_seq_len: int = 32
    n_prompts: int = 4
    table1: Table1Config = field(default_factory=Table1Config)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ALL_RUN_OPTIONS
    # set by the run: the prompts from --n-prompts, the features from --features (checked against each dictionary)
    NOT_OPTIONS: ClassVar[tuple[str, ...]] = ("table1.prompts", "table1.features")
    SHOWN: ClassVar[dict[str, str]] = {"cache_dir": "<--out>/operators", "checkpoint_dir": "<--out>/parts"}
    RANGES: ClassVar[dict[str, str]] = {"op_seqs": "[1, inf)", "op_seq_len": "[2, inf)", "n_prompts": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class QueryLensCommandConfig:
    """``tlql query-lens``: key / value signatures of FF-KV features of chosen layers (k, skip-positions, chunk and
    cache-dir: the engine's options). The signatures come from ``QueryLens.value_signatures`` /
    ``QueryLens.key_signatures`` per layer, as in the API: the engine pushes the requested features through when they
    are fewer than the model width, and computes the full operators otherwise.

    Attributes:
        run: model, corpus, layers, features, output and W&B.
        side: 'value' (what a feature promotes), 'key' (what activates it) or 'both'.
        method: 'full' (the corpus-mean Jacobian), 'first_order' (value side only; the key side then uses 'full') or
            'logit_lens' (no Jacobian).
        evaluate: run the Table-1 evaluation protocol on these layers / features instead (as `tlql ql-evaluate`,
            with --n-seqs / --seq-len as its operator corpus).
        table1: k and the engine's options (with --evaluate, every option of the protocol).
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/query_lens", layers="18", features="0-24", n_seqs=8, seq_len=32)
    )
    side: Literal["value", "key", "both"] = "both"
    method: Literal["full", "first_order", "logit_lens"] = "full"
    evaluate: bool = False
    table1: Table1Config = field(default_factory=Table1Config)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = tuple(name for name in ALL_RUN_OPTIONS if name != "dictionary")
    # basis: signatures here take QueryLens' own rule per request; Table 1's choice is ql-evaluate's --basis
    NOT_OPTIONS: ClassVar[tuple[str, ...]] = ("table1.prompts", "table1.features", "table1.basis")
    SHOWN: ClassVar[dict[str, str]] = {  # --evaluate runs ql-evaluate's Table 1, which keeps both under --out
        "cache_dir": "none: operators are not cached; with --evaluate <--out>/operators",
        "checkpoint_dir": "only with --evaluate: <--out>/parts",
    }
