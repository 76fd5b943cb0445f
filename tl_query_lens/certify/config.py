"""Options of certification (docs/certification.md), torch-free: the command line builds them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tl_query_lens.config import RunConfig, check_first_positions, check_ranges
from tl_query_lens.errors import InputError
from tl_query_lens.protocols import ProtocolName, resolve_protocol

#: How a proxy splices its dictionary (:class:`~tl_query_lens.certify.losses.Splice`).
Rule = Literal["topk", "native"]

CertifyProtocol = ProtocolName


@dataclass
class CertifyConfig:
    """Options of :func:`~tl_query_lens.certify.certify.certify` (validated).

    Attributes:
        k: TopK size at evaluation. delta: failure probability. alpha: loss smoothing weight.
        rule: ``"topk"`` or ``"native"`` (see :class:`~tl_query_lens.certify.losses.Splice`).
        n_schedule: prefix sizes of the evaluation split for the curve (default: geometric from 25 to N).
        batch_size: sequences per forward pass.
        exclude_first_positions: n; positions < n of every window (calibration and evaluation) are neither spliced
            (the proxy keeps the clean activation there) nor scored in any term: the losses behind R̂, ε̂ and the
            direct bound average the T−1−n predictions from positions n..T−2, and G* and η̂'s support test read
            positions ≥ n. N still counts windows. SAEBench's ``exclude_special_tokens_from_reconstruction`` by
            position: use 1 for dictionaries trained without position 0 (the tlql-saes suite; SmolLM2's position 0 is
            an attention sink).
        checkpoint_dir: folder where the evaluation pass saves its per-window losses as it goes (about once a
            minute), in a file keyed by the model's and dictionaries' weights, the pools, the windows and the loss
            options; a rerun that matches resumes after the last saved window (with any batch_size). None: nothing
            is saved (``tlql certify``: ``<out>/partial``). The calibration pass saves its progress there too.
        pool_sizes: calibration sizes n below the calibration split's own; each (unshuffled) proxy is also certified
            with the pool G* of the first n calibration windows only, from the same two passes (the pool-size
            curve: :func:`certify_many`).
        autocast: run the calibration and evaluation passes under bf16 autocast on the model's device (matrix
            products in bf16; weights, the residual stream and the losses in fp32). Measure what it moves first:
            TopK sets can change at the k-th place, so the pool and η̂ can too.
    """

    k: int = 64
    delta: float = 0.05
    alpha: float = 0.5
    rule: Rule = "topk"
    n_schedule: list[int] | None = None
    batch_size: int = 16
    exclude_first_positions: int = 0
    checkpoint_dir: str | None = None
    pool_sizes: tuple[int, ...] = ()
    autocast: bool = False

    RANGES: ClassVar[dict[str, str]] = {
        "pool_sizes": "[1, inf)",
        "k": "[1, inf)",
        "delta": "[1e-300, 1)",  # below it ln(6/delta) overflows: no bound is finite
        "alpha": "(0, 1)",
        "n_schedule": "[1, inf)",
        "batch_size": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
    }

    def __post_init__(self) -> None:
        if self.exclude_first_positions < 0:
            raise InputError(f"exclude_first_positions must be ≥ 0, got {self.exclude_first_positions}.")
        if not 1e-300 <= self.delta < 1:  # smaller: ln(6/delta) overflows and the bound is infinite
            raise InputError(f"delta must lie in [1e-300, 1) (delta must be in [1e-300, 1)), got {self.delta}.")
        if not 0 < self.alpha < 1:
            raise InputError(f"alpha must lie strictly between 0 and 1 (alpha must be in (0, 1)), got {self.alpha}.")
        if self.rule not in ("topk", "native"):
            raise InputError(f"rule must be 'topk' or 'native', got {self.rule!r}.")
        if self.k < 1 or self.batch_size < 1:
            raise InputError("k and batch_size must be positive.")
        self.pool_sizes = tuple(sorted(set(self.pool_sizes)))
        check_ranges(self)


@dataclass
class ProtocolCertifyConfig:
    """Options of :func:`~tl_query_lens.certify.protocol.certify_protocol`.

    Attributes:
        protocol: ``"paper"`` or ``"tlql"`` (formerly ``"fixed-pool"``; :mod:`tl_query_lens.certify.protocol`).
        n_cal: calibration windows (build the pool G*; both protocols cut them from the calibration stream); None:
            every window of the corpus' calibration split (the authors' scale: 70,000 windows of 32 tokens).
        pool_sizes: smaller calibration sizes whose pools are certified too, from the same passes (the pool-size
            curve; rows labelled ``"<label> n_cal=<n>"``; :func:`~tl_query_lens.certify.certify.certify_many`).
        autocast: bf16 autocast for the model passes (:class:`~tl_query_lens.certify.config.CertifyConfig`).
        n_eval: evaluation windows; ``None`` = every eligible document (paper) or 1000 windows (tlql).
        seq_len: tokens per window.
        k: TopK size of the proxy at evaluation. delta: failure probability of the bound. alpha: loss smoothing
            weight. rule: 'topk' or 'native' splice. batch_size: sequences per forward pass (as in
            :class:`~tl_query_lens.certify.config.CertifyConfig`).
        shuffle: add the feature-shuffle ablation: for every proxy (True), or for the proxies with these labels.
        seed: corpus draws and the shuffle permutation.
        bins: bins of the |gap| densities.
        exclude_first_positions: positions < n of every window neither spliced nor scored, as in
            :class:`~tl_query_lens.certify.config.CertifyConfig` (N still counts windows).
        checkpoint_dir: where the evaluation pass saves its progress, so a stopped run resumes (as in
            :class:`~tl_query_lens.certify.config.CertifyConfig`).
    """

    protocol: CertifyProtocol = "paper"
    n_cal: int | None = 1000
    n_eval: int | None = None
    seq_len: int = 32
    k: int = 64
    delta: float = 0.05
    alpha: float = 0.5
    rule: Rule = "topk"
    batch_size: int = 16
    shuffle: bool | tuple[str, ...] = False
    seed: int = 0
    bins: int = 40
    exclude_first_positions: int = 0
    checkpoint_dir: str | None = None
    pool_sizes: tuple[int, ...] = ()
    autocast: bool = False

    RANGES: ClassVar[dict[str, str]] = {
        "n_cal": "[1, inf)",
        "n_eval": "[1, inf)",
        "seq_len": "[1, inf)",
        "k": "[1, inf)",
        "delta": "[1e-300, 1)",  # below it ln(6/delta) overflows: no bound is finite
        "alpha": "(0, 1)",
        "batch_size": "[1, inf)",
        "seed": "[0, 4294967295]",
        "bins": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
        "pool_sizes": "[1, inf)",
    }

    def __post_init__(self) -> None:
        self.protocol = resolve_protocol(self.protocol)  # type: ignore[assignment]
        if not isinstance(self.shuffle, bool):
            self.shuffle = tuple(self.shuffle)
        self.pool_sizes = tuple(self.pool_sizes)
        self.certify_config()  # the options every certificate shares are validated once, by CertifyConfig
        check_ranges(self)
        check_first_positions(self.exclude_first_positions, self.seq_len)
        if (
            self.bins < 1
            or (self.n_cal is not None and self.n_cal < 1)
            or (self.n_eval is not None and self.n_eval < 1)
        ):
            raise ValueError("bins, n_cal and n_eval must be positive.")

    def certify_config(self) -> CertifyConfig:
        """The :class:`CertifyConfig` of every certificate."""
        names = (
            "k",
            "delta",
            "alpha",
            "rule",
            "batch_size",
            "exclude_first_positions",
            "checkpoint_dir",
            "pool_sizes",
            "autocast",
        )
        return CertifyConfig(**{name: getattr(self, name) for name in names})


@dataclass
class CertifyCommandConfig:
    """``tlql certify``: certificates of FF-KV or saved dictionaries per layer, under this project's protocol
    (``tlql``: a fixed pool, the shuffle ablation, plots) or the paper's (docs/certification.md).

    Attributes:
        run: model, corpus, layers, dictionaries, output and W&B (the window length is ``protocol.seq_len``).
        protocol: the certification's options, the protocol included.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/certify", layers="0,6,12,18,24,29", seq_len=32)
    )
    protocol: ProtocolCertifyConfig = field(default_factory=lambda: ProtocolCertifyConfig(protocol="tlql"))

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "layers", "dictionary", "out", "wandb", "wandb_project",
    )  # fmt: skip
    SHOWN: ClassVar[dict[str, str]] = {"checkpoint_dir": "<--out>/partial"}
