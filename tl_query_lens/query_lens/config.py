"""Options of Query Lens, its Table-1 evaluation and the subspace channels, torch-free: the command line builds them before
torch loads (docs/design.md §5)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import InitVar, dataclass, field
from typing import ClassVar, Literal, get_args

from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.errors import InputError
from tl_query_lens.operators.config import EngineConfig, fold_flat_engine_options
from tl_query_lens.protocols import ProtocolName, resolve_protocol

logger = logging.getLogger(__name__)


# The method set of the paper's Table 1: name → (side, method).
SIGNATURE_METHODS: dict[str, tuple[str, str]] = {
    "LL_KEY": ("key", "logit_lens"),
    "LL_VALUE": ("value", "logit_lens"),
    "QL_KEY": ("key", "full"),
    "QL_VALUE": ("value", "full"),
    "QL_VALUE_1st": ("value", "first_order"),
}


Basis = Literal["auto", "identity", "features"]


BASES = ("auto", "identity", "features")

#: The TC baseline's clamp values fixed by a protocol (the authors' TC clamps at α = 10 only); a protocol not named
#: here uses the config's ``tc_values``.
PROTOCOL_TC_VALUES: dict[str, tuple[float, ...]] = {"paper": (10.0,)}


NEUTRAL_PROMPTS: tuple[str, ...] = (
    "The",
    "I think that",
    "Here is a short story:",
    "It was a day like any other, and",
    "My favourite thing is",
    "In this article we",
)


@dataclass
class QueryLensConfig:
    """Options of :class:`~tl_query_lens.query_lens.lens.QueryLens`.

    Attributes:
        engine: how operators are computed and kept (:class:`~tl_query_lens.operators.config.EngineConfig`:
            skip_positions, chunk, batch_size, cache_dir, progress, max_memory_gb, sweep_dtype, sweep_autocast).
        feature_chunk: features scored per matmul against the vocabulary (memory grows with feature_chunk x d_vocab).
        basis: how the engine is asked for a request of n features. 'identity': the full operator (d tangent passes;
            kept and reused for every later request). 'features': the n requested value directions pushed forward
            (key directions pulled back) directly, n passes, cached per feature set. 'auto': the full operator when it
            is already held, else whichever basis is smaller (both passes walk the same chain of blocks, so the
            estimate compares n x chain with d x chain). Overridable per call.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    feature_chunk: int = 256
    basis: Basis = "auto"

    def __post_init__(self) -> None:
        if self.feature_chunk < 1:
            raise InputError(f"feature_chunk must be ≥ 1, got {self.feature_chunk}.")
        if self.basis not in BASES:
            raise InputError(f"basis must be one of {BASES}, not {self.basis!r}.")


@dataclass
class EvaluationConfig:
    """Settings of the Table-1 protocol (defaults = the paper's where it states them).

    Attributes:
        n_contexts: N max-activating contexts per feature (paper: ≥ 20).
        kl_targets: KL(clean ‖ steered) targets in nats, averaged over positions (paper: 0.25 and 0.5).
        n_generate: tokens generated after each neutral prompt (paper: 20).
        temperature: sampling temperature (paper: 0.75).
        seed: seed of every sampling step.
        prompts: neutral prefixes.
        n_steps: bisection steps of the α search after bracketing.
        n_steered: |S|, tokens kept from the steering rank-percentile rise (paper: 25).
        baselines: baselines computed here and scored like the given methods ("ZO", "TC").
        tc_values: clamp values of the TC baseline.
        protocol: ``"tlql"`` (this project's, formerly ``"per-target"``; :mod:`~tl_query_lens.query_lens.protocols.tlql`:
            one S per KL target, ranks over prompt and generated positions,
            α by geometric bracketing + bisection on clean continuations, strings stripped and lower-cased) or
            ``"paper"`` (the authors' code: one S over both targets, ranks over generated positions only, integer α
            in [1, 1000] with KL on the prompts, TC at α = 10 only, ▁/Ġ/Ċ-only normalisation; see
            :mod:`tl_query_lens.query_lens.protocols.paper`). Under ``"paper"`` every output column holds the score of
            the one shared S.
        autocast: run the model passes of the protocol (max-activating search, generation, α search and steering,
            ZO / TC baselines) under bf16 autocast on the model's device: matrix products in bf16, weights, norms,
            softmax and the residual stream in fp32 (SAELens' ``autocast_lm``). The operator sweeps follow
            ``engine.sweep_dtype`` instead. ``benchmarks/bench_table1_precision.py`` measures what it changes.
    """

    n_contexts: int = 20
    kl_targets: tuple[float, ...] = (0.25, 0.5)
    n_generate: int = 20
    temperature: float = 0.75
    seed: int = 0
    prompts: tuple[str, ...] = NEUTRAL_PROMPTS[:4]
    n_steps: int = 8
    n_steered: int = 25
    baselines: tuple[str, ...] = ("ZO", "TC")
    tc_values: tuple[float, ...] = (1.0, 5.0, 10.0)
    protocol: ProtocolName = "tlql"
    autocast: bool = False

    RANGES: ClassVar[dict[str, str]] = {
        "n_contexts": "[1, inf)",
        "kl_targets": "(0, inf)",
        "n_generate": "[1, inf)",
        "temperature": "(0, inf)",
        "seed": "[0, 4294967295]",
        "n_steps": "[1, inf)",
        "n_steered": "[1, inf)",
        "tc_values": "(0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.protocol = resolve_protocol(self.protocol)  # type: ignore[assignment]
        self.tc_values = PROTOCOL_TC_VALUES.get(self.protocol, self.tc_values)
        self.kl_targets, self.prompts = tuple(self.kl_targets), tuple(self.prompts)
        self.baselines, self.tc_values = tuple(self.baselines), tuple(self.tc_values)
        if self.n_contexts < 1 or self.n_generate < 1 or self.n_steps < 1 or self.n_steered < 1:
            raise ValueError("n_contexts, n_generate, n_steps and n_steered must all be ≥ 1.")
        if not self.kl_targets or min(self.kl_targets) <= 0:
            raise ValueError(f"kl_targets must be positive nats, e.g. (0.25, 0.5); got {self.kl_targets}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if not self.prompts:
            raise ValueError("Give at least one neutral prompt.")
        unknown = set(self.baselines) - {"ZO", "TC"}
        if unknown:
            raise ValueError(f"Unknown baselines {sorted(unknown)}; choose from 'ZO' and 'TC'.")
        if self.n_contexts < 20:
            logger.warning("n_contexts=%d is below the paper's N ≥ 20.", self.n_contexts)


@dataclass
class Table1Config(EvaluationConfig):
    """Options of :func:`~tl_query_lens.query_lens.table1.evaluate_table1`: those of :class:`EvaluationConfig` plus

    Attributes:
        k: signature size.
        features_per_layer: features sampled (seeded, without replacement) per dictionary.
        features: explicit feature ids used for every dictionary instead of a sample (None: sample).
        feature_selection: what the sample is drawn from. ``"uniform"``: every feature of the dictionary.
            ``"active"``: the features that fire (activation > 0) in at least ``n_contexts`` distinct sequences of
            the evaluation corpus, so each has N truly activating max-activating contexts (the authors require
            ≥ 20 examples per feature); a uniform draw from a trained SAE would also pick dead or rare latents whose
            "contexts" are arbitrary. ``"auto"``: ``"uniform"`` for FF-KV dictionaries (every SwiGLU/GELU neuron
            is non-zero almost everywhere, and their Table-1 rows stay as before), ``"active"`` for any other SAE.
        exclude_first_positions: leading positions of every evaluation sequence left out of the max-activating
            search and the active counts (1 for residual SAEs trained without position 0, e.g. the tlql-saes suite).
        methods: signature methods scored (names of :data:`SIGNATURE_METHODS`).
        engine: the operator engine's options (:class:`~tl_query_lens.operators.config.EngineConfig`; operators are
            kept in its cache_dir). Keyword overrides of :func:`~tl_query_lens.query_lens.table1.evaluate_table1` reach its fields (``chunk=16``).
        basis: how the Query Lens operators reach the signatures. ``"identity"``: every dictionary's full value, key
            and module operators, one engine sweep per kind over all of them (d_model directions each; kept in the
            engine's cache_dir and reused by any features and any later run on the same operator corpus).
            ``"features"``: only the sampled features' directions are pushed forward (values) and pulled back
            (keys), per dictionary (``features_per_layer`` directions instead of d_model, so about d_model /
            features_per_layer times fewer passes; cached per feature set). The signatures are the same up to
            rounding (``M v`` either way). ``"auto"``: :class:`~tl_query_lens.query_lens.lens.QueryLens`' own rule
            per request (the smaller basis, as nothing is precomputed).
        up_key: also score the authors' SwiGLU key (up-projection column at ``hook_resid_mid``) as LL_KEY_UP /
            QL_KEY_UP beside LL_KEY / QL_KEY.
        checkpoint_dir: folder where each dictionary's evaluation is saved as soon as it is done; a rerun that
            matches it (model, dictionary, corpora, prompts, features and every other option) loads it instead of
            evaluating that dictionary again, so a long run that is stopped resumes dictionary by dictionary.
            None: nothing is saved (``tlql ql-evaluate``: ``<out>/parts``).
    """

    k: int = 25
    features_per_layer: int = 13
    features: tuple[int, ...] | None = None
    feature_selection: Literal["auto", "uniform", "active"] = "auto"
    exclude_first_positions: int = 0
    methods: tuple[str, ...] = tuple(SIGNATURE_METHODS)
    engine: EngineConfig = field(default_factory=EngineConfig)
    basis: Basis = "identity"
    # Deprecated spellings of engine.skip_positions / engine.chunk / engine.cache_dir (folded into engine).
    skip_positions: InitVar[int | None] = None
    chunk: InitVar[int | None] = None
    cache_dir: InitVar[str | None] = None
    up_key: bool = False
    checkpoint_dir: str | None = None

    RANGES: ClassVar[dict[str, str]] = EvaluationConfig.RANGES | {
        "k": "[1, inf)",
        "features_per_layer": "[1, inf)",
        "features": "[0, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(  # type: ignore[override]
        self, skip_positions: int | None, chunk: int | None, cache_dir: str | None
    ) -> None:
        super().__post_init__()
        self.engine = fold_flat_engine_options(
            "Table1Config", self.engine, {"skip_positions": skip_positions, "chunk": chunk, "cache_dir": cache_dir}
        )
        self.methods = tuple(self.methods)
        self.features = None if self.features is None else tuple(int(f) for f in self.features)
        unknown = [m for m in self.methods if m not in SIGNATURE_METHODS]
        if unknown:
            raise ValueError(f"Unknown signature methods {unknown}; choose from {list(SIGNATURE_METHODS)}.")
        if self.feature_selection not in ("auto", "uniform", "active"):
            raise ValueError(
                f"feature_selection must be 'auto', 'uniform' or 'active', got {self.feature_selection!r}."
            )
        if self.basis not in get_args(Basis):
            raise ValueError(f"basis must be one of {get_args(Basis)}, got {self.basis!r}.")
        if self.exclude_first_positions < 0:
            raise ValueError(f"exclude_first_positions must be ≥ 0, got {self.exclude_first_positions}.")
        if self.k < 1 or self.features_per_layer < 1:
            raise ValueError("k and features_per_layer must be ≥ 1.")

    def evaluation(self) -> EvaluationConfig:
        """The :class:`EvaluationConfig` part."""
        return EvaluationConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EvaluationConfig)})


@dataclass
class ChannelConfig:
    """Channel fit settings (defaults: the paper's Adam recipe).

    Attributes:
        rank: r; None = d_model // n_layers (d/L).
        train_frac: share of features used for fitting; the rest are held out for the metrics.
        seed: seed of the split and of the Adam initialisation (paper: 42).
        lr, epochs, init_std: Adam recipe (paper: 1e-3, 1000 full-batch epochs, A ~ N(0, 0.01²), B = 0).
        destination: what makes two channels share a destination: ``"layer"`` (same downstream block k, attention
            or MLP) or ``"module"`` (same downstream module; needs ≥ 2 source layers).
        n_permutations: label permutations for the p-value of the AUC.
        fits: which fits to run, ``"closed_form"`` and/or ``"adam"``.
    """

    rank: int | None = None
    train_frac: float = 0.9
    seed: int = 42
    lr: float = 1e-3
    epochs: int = 1000
    init_std: float = 0.01
    destination: Literal["layer", "module"] = "layer"
    n_permutations: int = 10000
    fits: tuple[str, ...] = ("closed_form", "adam")

    RANGES: ClassVar[dict[str, str]] = {
        "rank": "[1, inf)",
        "train_frac": "(0, 1)",
        "seed": "[0, 4294967295]",
        "lr": "(0, inf)",
        "epochs": "[0, inf)",
        "init_std": "[0, inf)",
        "n_permutations": "[0, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.fits = tuple(self.fits)
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"rank must be ≥ 1 (or None for d/L), got {self.rank}.")
        if not 0 < self.train_frac < 1:
            raise ValueError(f"train_frac must be in (0, 1), got {self.train_frac}.")
        if self.destination not in ("layer", "module"):
            raise ValueError(f"destination must be 'layer' or 'module', got {self.destination!r}.")
        if not self.fits or set(self.fits) - {"closed_form", "adam"}:
            raise ValueError(f"fits {self.fits}: use 'closed_form', 'adam' or both (a non-empty subset).")


@dataclass
class SubspaceChannelsConfig(ChannelConfig):
    """Options of :func:`~tl_query_lens.query_lens.channels.subspace_channels`: those of :class:`ChannelConfig` plus

    Attributes:
        operator_layers: blocks whose module operators are computed (None: the first source layer + 1 .. L − 1).
        engine: the operator engine's options (:class:`~tl_query_lens.operators.config.EngineConfig`; operators are
            kept in its cache_dir and reused for the same corpus and blocks).
    """

    operator_layers: tuple[int, ...] | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Deprecated spellings of engine.skip_positions / engine.chunk / engine.cache_dir (folded into engine).
    skip_positions: InitVar[int | None] = None
    chunk: InitVar[int | None] = None
    cache_dir: InitVar[str | None] = None

    RANGES: ClassVar[dict[str, str]] = ChannelConfig.RANGES | {"operator_layers": "[0, inf)"}

    def __post_init__(  # type: ignore[override]
        self, skip_positions: int | None, chunk: int | None, cache_dir: str | None
    ) -> None:
        super().__post_init__()
        self.engine = fold_flat_engine_options(
            "SubspaceChannelsConfig",
            self.engine,
            {"skip_positions": skip_positions, "chunk": chunk, "cache_dir": cache_dir},
        )
        if self.operator_layers is not None:
            self.operator_layers = tuple(int(k) for k in self.operator_layers)
            if not self.operator_layers:
                raise ValueError("operator_layers must name at least one block (or be None for all downstream).")


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


@dataclass
class ChannelsCommandConfig:
    """``tlql ql-channels``: subspace channels of the FF-KV value vectors of the source layers ``--sources`` through
    the module operators of the blocks after them (docs/query_lens_evaluation.md).

    Attributes:
        run: model, corpus of the operators (``--op-seqs`` windows of ``--op-seq-len`` tokens), source layers,
            output and W&B.
        channels: the channel fits and the operator engine.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/ql_channels", layers="18", n_seqs=2, seq_len=32)
    )
    channels: SubspaceChannelsConfig = field(default_factory=SubspaceChannelsConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "n_seqs", "seq_len", "layers", "out", "wandb", "wandb_project",
    )  # fmt: skip
    ALIASES: ClassVar[dict[str, str]] = {"layers": "--sources", "n_seqs": "--op-seqs", "seq_len": "--op-seq-len"}
    SHOWN: ClassVar[dict[str, str]] = {"cache_dir": "<--out>/operators"}
