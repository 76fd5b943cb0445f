"""``certify``: a risk certificate for a frozen model through an SAE-induced sparse proxy (docs/design.md §7, arXiv 2606.18383).

Protocol: G* = union of TopK supports over a calibration split; on a disjoint evaluation split of N sequences the
restricted proxy's risk, the reconstruction gap and the pool mismatch, plus three Hoeffding terms, bound the frozen
model's risk. The schedule of N is prefixes of the evaluation split, so the bound-vs-N curve comes from one pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float, Int
from sae_lens import SAE
from transformer_lens import HookedTransformer

from tl_query_lens.certify.bound import (
    bound_terms,
    crossing_n,
    default_schedule,
    hoeffding_coefficient,
    log_binomial,
    loss_range_bits,
    min_sequences,
)
from tl_query_lens.certify.config import CertifyConfig
from tl_query_lens.certify.losses import PassTimes, ProxyLosses, Splice, first_firing, proxy_pass
from tl_query_lens.certify.plots import bound_vs_n_figure
from tl_query_lens.config import check_first_positions, resolve_config
from tl_query_lens.corpus import check_disjoint, corpus_fingerprint
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import InputError
from tl_query_lens.models import dictionary_fingerprint, weights_fingerprint
from tl_query_lens.operators.engine import check_tokens
from tl_query_lens.paths import check_folder
from tl_query_lens.precision import model_passes
from tl_query_lens.presentation import Table, numeric_fields
from tl_query_lens.results import SavableResult
from tl_query_lens.tensor_checks import check_outputs

logger = logging.getLogger(__name__)


@dataclass
class Certificate(SavableResult):
    """A certificate (docs/design.md §7) at the full evaluation size N, with its bound-vs-N curve.

    Attributes:
        R_hat: mean loss of the restricted proxy h_G (bits).
        eps_hat: mean |ℓ(M) − ℓ(S∘M)| (bits).
        eta_hat: share of evaluation sequences whose support leaves G*.
        P: |G*|. m: dictionary size F. N: evaluation sequences (windows; one window counts once whatever
            ``config["exclude_first_positions"]`` leaves out of it).
        Delta: loss range log₂(1 + (1−α)|V|/α).
        bound / bound_occam: U and its Occam variant at N.
        baseline_bits: log₂|V| (the uniform predictor's loss).
        nontrivial / nontrivial_occam: U < log₂|V|.
        N_star / N_star_occam: first scheduled N with U < log₂|V| (``*_observed`` True), else the extrapolation
            (A/(log₂|V| − C))² with C = R̂ + ε̂ + Δη̂ (inf when C ≥ log₂|V|).
        kl_bits: mean KL(M ‖ S∘M) per position, bits. top1_agreement: share of positions with equal argmax.
        loss_clean_mean / loss_proxy_mean: mean ℓ(M), ℓ(S∘M) (bits).
        curve_*: the terms at each scheduled N (prefixes of the evaluation split).
        loss_clean / loss_proxy / loss_restricted / leaves_pool / kl_per_seq / top1_per_seq: per sequence.
        pool: G* as a mask over features.
    """

    R_hat: float
    eps_hat: float
    eta_hat: float
    P: int
    m: int
    N: int
    Delta: float
    bound: float
    bound_occam: float
    baseline_bits: float
    nontrivial: bool
    nontrivial_occam: bool
    N_star: float
    N_star_observed: bool
    N_star_occam: float
    N_star_occam_observed: bool
    kl_bits: float
    top1_agreement: float
    loss_clean_mean: float
    loss_proxy_mean: float
    curve_N: list[int]
    curve_bound: list[float]
    curve_bound_occam: list[float]
    curve_R_hat: list[float]
    curve_eps_hat: list[float]
    curve_eta_hat: list[float]
    loss_clean: Float[torch.Tensor, " n_seqs"]
    loss_proxy: Float[torch.Tensor, " n_seqs"]
    loss_restricted: Float[torch.Tensor, " n_seqs"]
    leaves_pool: Bool[torch.Tensor, " n_seqs"]
    kl_per_seq: Float[torch.Tensor, " n_seqs"]
    top1_per_seq: Float[torch.Tensor, " n_seqs"]
    pool: Bool[torch.Tensor, " d_sae"]
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("N_star", "N_star_occam"):  # results saved before NaN/inf round-tripped hold "inf" strings
            setattr(self, name, float(getattr(self, name)))

    @property
    def gap(self) -> Float[torch.Tensor, " n_seqs"]:
        """Per-sequence reconstruction gap ℓ(S∘M) − ℓ(M), bits (the shuffle ablation's distribution)."""
        return self.loss_proxy - self.loss_clean

    def summary(self) -> dict[str, float | int | bool]:
        """The scalar terms (what tables and W&B get)."""
        keys = (
            "N",
            "P",
            "m",
            "R_hat",
            "eps_hat",
            "eta_hat",
            "Delta",
            "bound",
            "bound_occam",
            "baseline_bits",
            "nontrivial",
            "nontrivial_occam",
            "N_star",
            "N_star_observed",
            "N_star_occam",
            "N_star_occam_observed",
            "kl_bits",
            "top1_agreement",
            "loss_clean_mean",
            "loss_proxy_mean",
        )
        return {k: getattr(self, k) for k in keys}

    title: ClassVar[str] = "Certificate"

    def scalars(self) -> dict[str, float]:
        """The scalar terms of :meth:`summary`, as floats."""
        return numeric_fields(self, self.summary())

    def tables(self) -> dict[str, Table]:
        """``curve``: the bound's terms at each scheduled N."""
        columns = {"N": int, "bound": float, "bound_occam": float, "R_hat": float, "eps_hat": float, "eta_hat": float}
        curve = (self.curve_N, self.curve_bound, self.curve_bound_occam, self.curve_R_hat, self.curve_eps_hat)
        return {"curve": Table.build(columns, zip(*curve, self.curve_eta_hat))}

    def figures(self) -> dict[str, Any]:
        """``bound_vs_N``: U at each scheduled N, with log₂|V|."""
        return {"bound_vs_N": bound_vs_n_figure({"proxy": self})}


def check_inputs(
    model: HookedTransformer, saes: list[SAE], cal: torch.Tensor, ev: torch.Tensor, cfg: CertifyConfig
) -> None:
    """Refuse overlapping splits, hooks the model lacks, and N too small for any non-trivial bound."""
    for sae in saes:
        as_key_value(sae, model)  # errors naming the hook, width or non-finite weights
    for name, toks in (("calibration", cal), ("evaluation", ev)):
        check_tokens(model, toks)
        if toks.shape[1] < 2:
            raise InputError(f"{name} tokens must be [n_seqs >= 1, seq_len >= 2], got shape {tuple(toks.shape)}.")
        check_first_positions(cfg.exclude_first_positions, toks.shape[1])
    overlap = check_disjoint(ev, cal)
    if overlap:
        raise InputError(
            f"{overlap} of {ev.shape[0]} evaluation sequences also occur in the calibration split; the bound needs "
            "held-out data. Use load_corpus(..., split='calibration') and load_corpus(..., split='evaluation')."
        )
    baseline = math.log2(model.cfg.d_vocab)
    coefficient = hoeffding_coefficient(loss_range_bits(model.cfg.d_vocab, cfg.alpha), cfg.delta)
    n_min = min_sequences(baseline, coefficient)
    if ev.shape[0] < n_min:
        raise InputError(
            f"N={ev.shape[0]} evaluation sequences cannot give a non-trivial bound: even at zero loss the Hoeffding "
            f"terms {coefficient:.2f}/sqrt(N) = {coefficient / math.sqrt(ev.shape[0]):.2f} bits exceed "
            f"log2|V| = {baseline:.2f}. The minimum is N = {n_min} (delta={cfg.delta}, alpha={cfg.alpha}); "
            "real proxies need far more."
        )
    if cfg.checkpoint_dir is not None:
        check_folder(cfg.checkpoint_dir, "checkpoint_dir")
    too_big = [n for n in cfg.pool_sizes if n >= cal.shape[0]]
    if too_big:
        raise InputError(
            f"pool_sizes {too_big} are not below the {cal.shape[0]} calibration windows; give sizes below it (the "
            "full calibration split's pool is always certified)."
        )


def build_certificate(
    loss_clean: torch.Tensor,
    losses: ProxyLosses,
    pool: torch.Tensor,
    *,
    d_vocab: int,
    cfg: CertifyConfig,
    config: dict[str, Any] | None = None,
) -> Certificate:
    """Assemble a certificate from per-sequence losses (no model needed; docs/design.md §7)."""
    n = int(loss_clean.shape[0])
    P, m = int(pool.sum()), int(pool.numel())
    schedule = sorted({x for x in (cfg.n_schedule or default_schedule(n)) if 1 <= x <= n} | {n})
    kw: dict[str, Any] = {"P": P, "m": m, "d_vocab": d_vocab, "alpha": cfg.alpha, "delta": cfg.delta}
    curve = [
        bound_terms(loss_clean[:x], losses.loss_proxy[:x], losses.loss_restricted[:x], losses.leaves_pool[:x], **kw)
        for x in schedule
    ]
    final = curve[-1]
    delta_bits = loss_range_bits(d_vocab, cfg.alpha)
    baseline = math.log2(d_vocab)
    constant = final.R_hat + final.eps_hat + delta_bits * final.eta_hat
    a = hoeffding_coefficient(delta_bits, cfg.delta)
    a_occam = hoeffding_coefficient(delta_bits, cfg.delta, log_choose=log_binomial(m, P))
    n_star, observed = crossing_n(
        schedule, [t.bound for t in curve], constant=constant, coefficient=a, baseline_bits=baseline
    )
    n_star_o, observed_o = crossing_n(
        schedule, [t.bound_occam for t in curve], constant=constant, coefficient=a_occam, baseline_bits=baseline
    )
    certificate = Certificate(
        R_hat=final.R_hat,
        eps_hat=final.eps_hat,
        eta_hat=final.eta_hat,
        P=P,
        m=m,
        N=n,
        Delta=delta_bits,
        bound=final.bound,
        bound_occam=final.bound_occam,
        baseline_bits=baseline,
        nontrivial=final.bound < baseline,
        nontrivial_occam=final.bound_occam < baseline,
        N_star=n_star,
        N_star_observed=observed,
        N_star_occam=n_star_o,
        N_star_occam_observed=observed_o,
        kl_bits=losses.kl_bits.double().mean().item(),
        top1_agreement=losses.top1.double().mean().item(),
        loss_clean_mean=loss_clean.double().mean().item(),
        loss_proxy_mean=losses.loss_proxy.double().mean().item(),
        curve_N=schedule,
        curve_bound=[t.bound for t in curve],
        curve_bound_occam=[t.bound_occam for t in curve],
        curve_R_hat=[t.R_hat for t in curve],
        curve_eps_hat=[t.eps_hat for t in curve],
        curve_eta_hat=[t.eta_hat for t in curve],
        loss_clean=loss_clean.float(),
        loss_proxy=losses.loss_proxy.float(),
        loss_restricted=losses.loss_restricted.float(),
        leaves_pool=losses.leaves_pool.bool(),
        kl_per_seq=losses.kl_bits.float(),
        top1_per_seq=losses.top1.float(),
        pool=pool.bool(),
        config=dict(config or {}),
    )
    # N* is inf when the bound never crosses log2|V|; NaN anywhere means the losses were not finite.
    return check_outputs(
        certificate,
        "certify",
        nan_only=("N_star", "N_star_occam"),
        hint="The clean or spliced model produced non-finite logits: check the model's weights "
        "and dtype (the dictionary's weights were checked on entry).",
    )


def certificate_prefix(cert: Certificate, n: int, cfg: CertifyConfig) -> Certificate:
    """The certificate of the first ``n`` evaluation sequences of ``cert`` (same pool G*), rebuilt from its
    per-sequence losses without the model.

    Where the evaluation windows are a seeded sample in random order (the paper protocol draws distinct documents),
    the first ``n`` are themselves a uniform sample of ``n`` distinct documents, so the bound at ``n`` is a valid
    certificate at that N, read from the same run.

    Raises:
        ValueError: ``n`` outside ``1..cert.N``.
    """
    if not 1 <= n <= cert.N:
        raise ValueError(f"A prefix of a certificate at N = {cert.N} needs 1 <= n <= {cert.N}, got {n}.")
    losses = ProxyLosses(
        loss_proxy=cert.loss_proxy[:n],
        loss_restricted=cert.loss_restricted[:n],
        leaves_pool=cert.leaves_pool[:n],
        kl_bits=cert.kl_per_seq[:n],
        top1=cert.top1_per_seq[:n],
    )
    d_vocab = round(2.0**cert.baseline_bits)
    return build_certificate(cert.loss_clean[:n], losses, cert.pool, d_vocab=d_vocab, cfg=cfg, config=cert.config)


def certify_many(
    model: HookedTransformer,
    splices: dict[Hashable, Splice],
    calibration_tokens: Int[torch.Tensor, "batch pos"],
    evaluation_tokens: Int[torch.Tensor, "batch pos"],
    cfg: CertifyConfig,
    *,
    times: PassTimes | None = None,
) -> dict[Hashable, Certificate]:
    """Certificates of several proxies sharing one calibration pass and one clean evaluation pass.

    With ``cfg.pool_sizes``, each unshuffled proxy ``name`` also gets ``(name, n)``: its certificate with the pool
    of the first n calibration windows. The calibration pass records where each feature first fires
    (:func:`~tl_query_lens.certify.losses.first_firing`), so every pool comes from that one pass; the evaluation
    pass runs each proxy once and only the restricted proxy h_G (on the windows whose support leaves that pool)
    per pool. Each such certificate equals the one of a separate run on the first n calibration windows.
    """
    check_inputs(model, [s.sae for s in splices.values()], calibration_tokens, evaluation_tokens, cfg)
    times = times if times is not None else PassTimes()
    t0 = time.perf_counter()
    first = cfg.exclude_first_positions
    n_cal = int(calibration_tokens.shape[0])
    pool_checkpoint = None
    if cfg.checkpoint_dir is not None:
        pool_key = _pool_key(model, splices, calibration_tokens, cfg)
        pool_checkpoint = Path(cfg.checkpoint_dir) / f"pool-pass-{pool_key}.safetensors"
    with model_passes(model, cfg.autocast):
        firsts = first_firing(
            model,
            splices,
            calibration_tokens,
            batch_size=cfg.batch_size,
            exclude_first_positions=first,
            checkpoint=pool_checkpoint,
        )
    times.pool += time.perf_counter() - t0
    entries: dict[Hashable, Splice] = dict(splices)
    pools = {name: firsts[name] < n_cal for name in splices}
    sizes: dict[Hashable, int] = dict.fromkeys(splices, n_cal)
    for name, splice in splices.items():
        if splice.permutation is None:
            for n in cfg.pool_sizes:
                entries[(name, n)], pools[(name, n)], sizes[(name, n)] = splice, firsts[name] < n, n
    checkpoint = None
    if cfg.checkpoint_dir is not None:
        key = _pass_key(model, entries, pools, evaluation_tokens, cfg)  # folder checked in check_inputs
        checkpoint = Path(cfg.checkpoint_dir) / f"proxy-pass-{key}.safetensors"
    with model_passes(model, cfg.autocast):
        loss_clean, losses = proxy_pass(
            model,
            entries,
            pools,
            evaluation_tokens,
            alpha=cfg.alpha,
            batch_size=cfg.batch_size,
            times=times,
            exclude_first_positions=first,
            checkpoint=checkpoint,
        )
    scored = int(evaluation_tokens.shape[1]) - 1 - first
    logger.info(
        "N = %d evaluation windows of %d tokens; each scores %d next-token predictions (positions %d..%d)",
        evaluation_tokens.shape[0],
        evaluation_tokens.shape[1],
        scored,
        first,
        evaluation_tokens.shape[1] - 2,
    )
    out = {}
    for name, splice in entries.items():
        config = {
            "k": cfg.k,
            "delta": cfg.delta,
            "alpha": cfg.alpha,
            "rule": splice.rule,
            "read_hook": splice.read_hook,
            "write_hook": splice.write_hook,
            "shuffled": splice.permutation is not None,
            "n_cal": sizes[name],
            "seq_len": int(evaluation_tokens.shape[1]),
            "exclude_first_positions": first,
            "predictions_per_window": scored,
            "autocast": cfg.autocast,
            **({"resumed_windows": times.resumed_windows} if checkpoint is not None else {}),
        }
        out[name] = build_certificate(
            loss_clean, losses[name], pools[name], d_vocab=model.cfg.d_vocab, cfg=cfg, config=config
        )
        c = out[name]
        logger.info(
            "%s: U = %.3f bits (Occam %.3f) vs log2|V| = %.3f at N = %d; R̂ %.3f ε̂ %.3f η̂ %.3f P %d/%d",
            name,
            c.bound,
            c.bound_occam,
            c.baseline_bits,
            c.N,
            c.R_hat,
            c.eps_hat,
            c.eta_hat,
            c.P,
            c.m,
        )
    return out


def _pool_key(
    model: HookedTransformer, splices: dict[Hashable, Splice], tokens: torch.Tensor, cfg: CertifyConfig
) -> str:
    """Hash of what the calibration pass's first-firing indices depend on but the number of windows (names its
    checkpoint file, which serves every calibration size of one seeded order: :func:`first_firing`)."""
    proxies = [
        [
            str(name),
            dictionary_fingerprint(s.sae),
            s.rule,
            s.k,
            None if s.permutation is None else corpus_fingerprint(s.permutation.reshape(1, -1)),
        ]
        for name, s in splices.items()
    ]
    record = {
        "model": [str(model.cfg.model_name), weights_fingerprint(model)],
        "tokens": [corpus_fingerprint(tokens[:1]), int(tokens.shape[1])],  # the first window: the file serves any n
        "options": [cfg.exclude_first_positions] + (["bf16-autocast"] if cfg.autocast else []),
        "proxies": proxies,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _pass_key(
    model: HookedTransformer,
    splices: dict[Hashable, Splice],
    pools: dict[Hashable, torch.Tensor],
    tokens: torch.Tensor,
    cfg: CertifyConfig,
) -> str:
    """Hash of everything the evaluation pass's per-window losses depend on (names the checkpoint file)."""
    proxies = []
    for name, splice in splices.items():
        perm = splice.permutation
        proxies.append(
            [
                str(name),
                dictionary_fingerprint(splice.sae),
                splice.rule,
                splice.k,
                None if perm is None else corpus_fingerprint(perm.reshape(1, -1)),
                corpus_fingerprint(pools[name].reshape(1, -1).long()),
            ]
        )
    record = {
        "model": [str(model.cfg.model_name), weights_fingerprint(model)],
        "tokens": corpus_fingerprint(tokens),
        # not batch_size: a rerun may lower it (memory)
        "options": [cfg.alpha, cfg.exclude_first_positions] + (["bf16-autocast"] if cfg.autocast else []),
        "proxies": proxies,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def certify(
    model: HookedTransformer,
    sae: SAE,
    calibration_tokens: Int[torch.Tensor, "batch pos"],
    evaluation_tokens: Int[torch.Tensor, "batch pos"],
    *,
    cfg: CertifyConfig | None = None,
    **overrides: Any,
) -> Certificate:
    """Certify ``model`` through the proxy that splices ``sae`` (any SAELens SAE, transcoder or FF-KV; docs/design.md §7).

    Args:
        model: the frozen TransformerLens model.
        sae: the dictionary; its reconstruction replaces the activation at its write hook (no error term).
        calibration_tokens: ``[n_cal, seq_len]``, builds the pool G*.
        evaluation_tokens: ``[N, seq_len]``, disjoint from calibration; prefixes give the bound-vs-N curve.
        cfg: a :class:`CertifyConfig`; keyword ``overrides`` (``k=``, ``delta=``, ``alpha=``, ``rule=``,
            ``n_schedule=``, ``batch_size=``, ``exclude_first_positions=``) replace single fields.

    Raises:
        ValueError: overlapping splits, N below the minimum for a non-trivial bound, width mismatch,
            ``exclude_first_positions`` ≥ seq_len − 1 (no prediction left to score).
        KeyError: the SAE's hook is not in the model.
    """
    cfg = resolve_config(CertifyConfig, cfg, overrides)
    splice = Splice(sae, rule=cfg.rule, k=cfg.k)
    return certify_many(model, {"proxy": splice}, calibration_tokens, evaluation_tokens, cfg)["proxy"]
