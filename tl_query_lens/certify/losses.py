"""Proxy splices and per-sequence losses: one clean pass shared by every proxy (docs/design.md §7).

A proxy S∘M encodes the activation at the dictionary's read hook, sparsifies the codes (TopK-k by magnitude of the
SAE's ``encode`` output, or the SAE's native rule), optionally permutes feature ids (shuffle ablation) and masks
them to a pool G* (restricted proxy h_G), and writes ``sae.decode(codes)`` at the write hook (no error term) —
the write hook is ``hook_mlp_out`` for transcoders and FF-KV, the read hook for ordinary SAEs.

Per sequence of T tokens, ℓ = mean over the T−1 predictions of −log₂((1−α)p(x_{t+1}) + α/|V|).

``exclude_first_positions = n`` keeps the first n positions of every window clean (not spliced: the proxy writes the
reconstruction at positions ≥ n only, :func:`~tl_query_lens.primitives.write_from`) and unscored: ℓ averages the
T−1−n predictions made from positions n..T−2, KL and top-1 the T−n positions n..T−1, and the pool G* and the support
test of η̂ read positions ≥ n only. A window still counts once in N.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from sae_lens import SAE
from tqdm import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.certify.config import Rule
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import CorruptFileError
from tl_query_lens.hooks import hook_layer
from tl_query_lens.primitives import (
    LOG2,
    clean_run,
    kl_divergence,
    run_from_residual,
    splice_hooks,
    stop_layer,
    topk_mask,
    write_from,
)
from tl_query_lens.results import read_tensors, write_tensors

logger = logging.getLogger(__name__)


@dataclass
class Splice:
    """One proxy: a dictionary, its sparsification rule and an optional feature-id permutation.

    Attributes:
        sae: an SAELens SAE, transcoder or FF-KV dictionary.
        rule: ``"topk"`` keeps the k entries of ``sae.encode(x)`` largest in magnitude (the encode output is the
            architecture's own activation: ReLU / JumpReLU / gated / TopK codes, or signed SwiGLU activations for
            FF-KV); ``"native"`` keeps ``sae.encode(x)`` as is.
        k: TopK size (ignored by ``"native"``).
        permutation: π with codes′_i = codes_{π(i)} (the proxy decodes code π(i) with value i), or None.
    """

    sae: SAE
    rule: Rule = "topk"
    k: int = 64
    permutation: Int[torch.Tensor, " d_sae"] | None = None

    def __post_init__(self) -> None:
        if self.rule not in ("topk", "native"):
            raise ValueError(f"rule must be 'topk' or 'native', got {self.rule!r}.")
        if self.rule == "topk" and self.k < 1:
            raise ValueError(f"TopK needs k >= 1, got k={self.k}.")
        view = as_key_value(self.sae)
        self.read_hook, self.write_hook, self.d_sae = view.read_hook, view.write_hook, view.d_sae
        if self.permutation is not None:
            perm = torch.as_tensor(self.permutation, dtype=torch.long)
            if perm.shape != (self.d_sae,) or not torch.equal(perm.sort().values, torch.arange(self.d_sae)):
                raise ValueError(f"permutation must be a bijection of 0..{self.d_sae - 1}.")
            self.permutation = perm
        self.encode_seconds = 0.0

    @property
    def start_layer(self) -> int | None:
        """First block whose input the splice can change (the proxy pass restarts there from the clean residual);
        None for hooks outside the blocks (e.g. ``hook_embed``): those proxies run from the tokens."""
        return hook_layer(self.read_hook)

    def codes(self, act: torch.Tensor) -> Float[torch.Tensor, "batch pos d_sae"]:
        """Sparse codes of the activation at the read hook (after the rule and the permutation)."""
        t0 = time.perf_counter()
        codes = self.sae.encode(act.to(self.sae.dtype))
        if codes.ndim > 3:  # hook_z-style SAEs may keep a head axis on the way in
            codes = codes.reshape(*codes.shape[:2], -1)
        if self.rule == "topk":
            codes = topk_mask(codes, self.k)
        if self.permutation is not None:
            codes = codes[..., self.permutation.to(codes.device)]
        self.encode_seconds += time.perf_counter() - t0
        return codes

    def hooks(
        self,
        *,
        pool: Bool[torch.Tensor, " d_sae"] | None = None,
        record: dict | None = None,
        exclude_first_positions: int = 0,
    ) -> list:
        """Forward hooks that splice the reconstruction in (codes masked to ``pool`` if given) at positions
        ≥ ``exclude_first_positions``; the earlier positions keep the clean activation.

        ``record["support"]`` receives the unmasked codes' nonzero pattern ``[batch, pos − n, d_sae]`` over the
        spliced positions.
        """
        first = exclude_first_positions

        def edit(x: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
            codes = self.codes(x[:, first:])
            if record is not None:
                record["support"] = codes != 0
            if pool is not None:
                codes = codes * pool.to(codes.device, codes.dtype)
            return write_from(first, self.sae.decode(codes), act)

        return splice_hooks(self.read_hook, self.write_hook, edit)


def smoothed_loss_bits(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    alpha: float,
    *,
    exclude_first_positions: int = 0,
) -> Float[torch.Tensor, " batch"]:
    """ℓ = mean_t −log₂((1−α)p(x_{t+1}) + α/|V|) per sequence over t ≥ ``exclude_first_positions`` (docs/design.md §7)."""
    first = exclude_first_positions
    targets = tokens[:, first + 1 :, None].to(logits.device)
    logp = logits[:, first:-1].float().log_softmax(-1).gather(-1, targets)[..., 0]
    d_vocab = logits.shape[-1]
    mixed = torch.logaddexp(logp + math.log1p(-alpha), torch.full_like(logp, math.log(alpha / d_vocab)))
    return -(mixed / math.log(2)).mean(-1)


@dataclass
class ProxyLosses:
    """Per-sequence quantities of one proxy on the evaluation split.

    Attributes:
        loss_proxy: ℓ(S∘M), bits.
        loss_restricted: ℓ(h_G), bits (equal to ``loss_proxy`` where the support stays inside G*).
        leaves_pool: True where some position's support leaves G*.
        kl_bits: mean over positions of KL(M ‖ S∘M), bits.
        top1: share of positions where argmax M = argmax S∘M.
    """

    loss_proxy: Float[torch.Tensor, " n_seqs"]
    loss_restricted: Float[torch.Tensor, " n_seqs"]
    leaves_pool: Bool[torch.Tensor, " n_seqs"]
    kl_bits: Float[torch.Tensor, " n_seqs"]
    top1: Float[torch.Tensor, " n_seqs"]


@dataclass
class PassTimes:
    """Seconds spent in each part of :func:`proxy_pass` (for the benchmark)."""

    clean: float = 0.0
    proxy: float = 0.0
    restricted: float = 0.0
    pool: float = 0.0
    resumed_windows: int = 0  # evaluation windows loaded from a checkpoint (their time is not counted)


@torch.no_grad()
def first_firing(
    model: HookedTransformer,
    splices: dict[Hashable, Splice],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    batch_size: int = 16,
    exclude_first_positions: int = 0,
    checkpoint: Path | None = None,
) -> dict[Hashable, Int[torch.Tensor, " d_sae"]]:
    """Per splice and feature, the index of the first window of ``tokens`` (calibration) where the feature is active
    at a position ≥ ``exclude_first_positions`` (``tokens.shape[0]`` where it never is), in one truncated pass.

    The pool G* of the first n windows is ``first < n`` (:func:`feature_pool`), so one pass gives the pool at every
    calibration size n ≤ ``tokens.shape[0]`` (the calibration windows of n are the first n of a seeded order,
    :func:`~tl_query_lens.corpus.load_corpus`). ``checkpoint``: a file where the pass saves its progress (at most
    every :data:`CHECKPOINT_SECONDS`) with the windows it has read; a pass over windows that begin with those resumes
    after them, and a pass over fewer windows that a saved pass has read takes its indices from the file
    (``min(first, n)``) without running the model. The caller keys the file name by the model and the dictionaries.
    """
    first = exclude_first_positions
    read_hooks = sorted({s.read_hook for s in splices.values()})
    stop = stop_layer(read_hooks)
    n = int(tokens.shape[0])
    firsts = {name: torch.full((s.d_sae,), n, dtype=torch.long) for name, s in splices.items()}
    done = _resume_firsts(checkpoint, firsts, tokens)
    if done >= n:
        return firsts
    saved_at = time.monotonic()
    for start in tqdm(range(done, n, batch_size), desc="calibration pool", leave=False):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        _, cache = model.run_with_cache(batch, names_filter=read_hooks, stop_at_layer=stop)
        for name, splice in splices.items():
            fired = (splice.codes(cache[splice.read_hook][:, first:]) != 0).any(1).cpu()  # [batch, d_sae]
            seen = fired.any(0)
            at = start + fired.int().argmax(0)  # the first window of this batch where each feature fires
            firsts[name] = torch.where(seen & (firsts[name] == n), at, firsts[name])
        if checkpoint is not None and time.monotonic() - saved_at >= CHECKPOINT_SECONDS:
            _save_firsts(checkpoint, firsts, tokens[: start + batch.shape[0]])
            saved_at = time.monotonic()
    if checkpoint is not None:
        _save_firsts(checkpoint, firsts, tokens)
    return firsts


def feature_pool(
    model: HookedTransformer,
    splices: dict[Hashable, Splice],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    batch_size: int = 16,
    exclude_first_positions: int = 0,
) -> dict[Hashable, Bool[torch.Tensor, " d_sae"]]:
    """G* per splice: the union of active features over ``tokens`` (calibration) at positions
    ≥ ``exclude_first_positions`` (:func:`first_firing` below ``tokens.shape[0]``)."""
    firsts = first_firing(
        model, splices, tokens, batch_size=batch_size, exclude_first_positions=exclude_first_positions
    )
    return {name: f < tokens.shape[0] for name, f in firsts.items()}


@torch.no_grad()
def proxy_pass(
    model: HookedTransformer,
    splices: dict[Hashable, Splice],
    pools: dict[Hashable, Bool[torch.Tensor, " d_sae"]],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    alpha: float = 0.5,
    batch_size: int = 16,
    times: PassTimes | None = None,
    exclude_first_positions: int = 0,
    checkpoint: Path | None = None,
) -> tuple[Float[torch.Tensor, " n_seqs"], dict[Hashable, ProxyLosses]]:
    """One clean pass over ``tokens`` shared by every splice; each proxy restarts from the clean residual.

    Entries of ``splices`` that hold the same :class:`Splice` object (one proxy under several pools, e.g. the pools
    of several calibration sizes) share one proxy run; only the pool test and the restricted run are their own.

    The restricted proxy h_G is run only on sequences whose support leaves G*: elsewhere it equals S∘M exactly.
    Positions < ``exclude_first_positions`` are neither spliced nor scored (module docstring).

    ``checkpoint``: a file where the per-window losses done so far are saved (at most every
    :data:`CHECKPOINT_SECONDS`); where it exists the pass resumes after its last window. The caller keys its name by
    everything the losses depend on (:func:`~tl_query_lens.certify.certify.certify_many`).

    Returns:
        ``(loss_clean, {name: ProxyLosses})``.
    """
    times = times if times is not None else PassTimes()
    first = exclude_first_positions
    starts = {s.start_layer for s in splices.values()}
    clean_losses: list[torch.Tensor] = []
    parts: dict[Hashable, dict[str, list[torch.Tensor]]] = {n: {f: [] for f in _LOSS_FIELDS} for n in splices}
    done = times.resumed_windows = _resume(checkpoint, clean_losses, parts)
    saved_at = time.monotonic()
    for start in tqdm(range(done, tokens.shape[0], batch_size), desc="proxy pass", leave=False):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        t0 = time.perf_counter()
        logits, resid = clean_run(model, batch, starts)
        clean_logp = logits[:, first:].float().log_softmax(-1)
        clean_top1 = clean_logp.argmax(-1)
        clean_losses.append(smoothed_loss_bits(logits, batch, alpha, exclude_first_positions=first).cpu())
        times.clean += time.perf_counter() - t0
        shared: dict[int, tuple[torch.Tensor, ...]] = {}  # entries holding one Splice share its proxy run
        for name, splice in splices.items():
            t0 = time.perf_counter()
            pool = pools[name].to(model.cfg.device)
            layer = splice.start_layer
            if id(splice) not in shared:
                record: dict[str, torch.Tensor] = {}
                hooks = splice.hooks(record=record, exclude_first_positions=first)
                proxy_logits = run_from_residual(model, batch, resid, layer, hooks)
                proxy_logp = proxy_logits[:, first:].float().log_softmax(-1)
                shared[id(splice)] = (
                    record["support"],
                    smoothed_loss_bits(proxy_logits, batch, alpha, exclude_first_positions=first),
                    kl_divergence(clean_logp, proxy_logp).mean(-1) / LOG2,
                    (proxy_logp.argmax(-1) == clean_top1).float().mean(-1),
                )
            support, loss_proxy, kl, top1 = shared[id(splice)]
            leaves = (support & ~pool).flatten(1).any(-1)
            times.proxy += time.perf_counter() - t0
            t0 = time.perf_counter()
            loss_restricted = loss_proxy.clone()
            if leaves.any():
                sub = leaves.nonzero()[:, 0]
                hooks = splice.hooks(pool=pool, exclude_first_positions=first)
                restricted_logits = run_from_residual(model, batch, resid, layer, hooks, rows=sub)
                loss_restricted[sub] = smoothed_loss_bits(
                    restricted_logits, batch[sub], alpha, exclude_first_positions=first
                )
            times.restricted += time.perf_counter() - t0
            for field, value in (
                ("loss_proxy", loss_proxy),
                ("loss_restricted", loss_restricted),
                ("leaves_pool", leaves),
                ("kl_bits", kl),
                ("top1", top1),
            ):
                parts[name][field].append(value.cpu())
        if checkpoint is not None and time.monotonic() - saved_at >= CHECKPOINT_SECONDS:
            _save_progress(checkpoint, clean_losses, parts)
            saved_at = time.monotonic()
    if checkpoint is not None:
        _save_progress(checkpoint, clean_losses, parts)
    out = {n: ProxyLosses(**{f: torch.cat(v) for f, v in p.items()}) for n, p in parts.items()}
    return torch.cat(clean_losses), out


_LOSS_FIELDS = ("loss_proxy", "loss_restricted", "leaves_pool", "kl_bits", "top1")
CHECKPOINT_SECONDS = 60.0  # how often a checkpointed proxy pass saves its progress


def _save_progress(path: Path, clean: list[torch.Tensor], parts: dict[Hashable, dict[str, list[torch.Tensor]]]) -> None:
    """Per-window losses so far, the proxies in ``parts``' order (atomic write). A failed write (disk full) only
    warns: the pass goes on with its losses in memory."""
    tensors = {"loss_clean": torch.cat(clean)} if clean else {}
    for i, fields in enumerate(parts.values()):
        tensors.update({f"{i}.{f}": torch.cat(v) for f, v in fields.items() if v})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tensors(path, tensors, {"windows": int(tensors["loss_clean"].shape[0]) if clean else 0})
    except OSError as err:
        logger.warning("could not save the proxy pass's progress to %s (%s); it goes on without", path, err)


def _save_firsts(path: Path, firsts: dict[Hashable, torch.Tensor], read: torch.Tensor) -> None:
    """First-firing indices after the calibration windows ``read``, the splices in order, with those windows
    (atomic; a failed write only warns)."""
    tensors = {str(i): f for i, f in enumerate(firsts.values())} | {"windows": read.to(torch.int32)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tensors(path, tensors, {"windows": int(read.shape[0])})
    except OSError as err:
        logger.warning("could not save the calibration pass's progress to %s (%s); it goes on without", path, err)


def _resume_firsts(path: Path | None, firsts: dict[Hashable, torch.Tensor], tokens: torch.Tensor) -> int:
    """Fill ``firsts`` from a saved calibration pass whose windows agree with ``tokens`` as far as both go; returns
    the windows of ``tokens`` it covers (0: none, unreadable, or other windows)."""
    if path is None or not path.is_file():
        return 0
    try:
        tensors, _ = read_tensors(path)
    except CorruptFileError as err:
        logger.warning("%s; the calibration pass starts again", err)
        return 0
    read, n = tensors["windows"].long(), int(tokens.shape[0])
    done = min(int(read.shape[0]), n)
    if read.shape[1:] != tokens.shape[1:] or not torch.equal(read[:done], tokens[:done].cpu()):
        logger.warning("%s holds a pass over other calibration windows; the calibration pass starts again", path)
        return 0
    for i, name in enumerate(firsts):
        saved = tensors[str(i)].long()  # read.shape[0] where not seen in the windows read
        firsts[name] = torch.where(saved >= min(int(read.shape[0]), n), n, saved)  # not seen in this pass's windows
    logger.info("calibration pass: %d of %d windows read from %s", done, n, path)
    return done


def _resume(path: Path | None, clean: list[torch.Tensor], parts: dict[Hashable, dict[str, list[torch.Tensor]]]) -> int:
    """Fill ``clean`` / ``parts`` from a saved pass; returns its window count (0: none, or unreadable)."""
    if path is None or not path.is_file():
        return 0
    try:
        tensors, meta = read_tensors(path)
    except CorruptFileError as err:
        logger.warning("%s; the proxy pass starts again", err)
        return 0
    windows = int(meta.get("windows", 0))
    if windows == 0:
        return 0
    clean.append(tensors["loss_clean"])
    for i, fields in enumerate(parts.values()):
        for f in _LOSS_FIELDS:
            fields[f].append(tensors[f"{i}.{f}"])
    logger.info("proxy pass resumed after %d windows (%s)", windows, path)
    return windows
