"""The transition-operator engine: corpus-mean Jacobians between hook points by batched sweeps (docs/design.md §4).

Every operator is ``O = (1/|T|) Σ_{t∈T} Σ_s ∂h_dst[t]/∂h_src[s]``: a tangent broadcast to every position ``s`` of the
source hook (cross-position terms kept), read at the valid positions ``t ∈ T`` (all positions ``≥ skip_positions``) of
the destination hook, at the clean activations of the corpus. The perturbation is injected by a hook that adds a
``[d_src]`` vector to the hook's activation, so the functional pieces are TransformerLens' own (standard and rotary
positions, LN and RMS, gated MLPs alike), and the model is run clean (no SAEs spliced in).

Two directions, one code path:

* ``"reverse"`` — one forward pass per minibatch, then ``d_dst`` cotangents ``e_j`` (placed at every valid position of
  the destination) pulled back in chunks with ``torch.autograd.grad(..., is_grads_batched=True)`` (vmap over the
  backward). Row ``j`` of the operator of EVERY perturbed source comes out of the same backward: one sweep gives the
  value operators of all layers.
* ``"forward"`` — ``torch.func.vmap(torch.func.jvp)`` with ``d_src`` basis tangents at the source; column ``i`` of the
  operator to EVERY read destination comes out of the same pass: one sweep gives the key operators of all layers.

Module operators (``J̄_A^k``, ``J̄_M^k``) perturb ``blocks.k.hook_resid_pre`` / ``hook_resid_mid`` in "replace" mode
(``x.detach() + δ``), which cuts every path from upstream perturbations, so one sweep yields every module's operator
in isolation.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch.func import jvp, vmap
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.errors import InputError, InputTypeError, OutOfRangeError
from tl_query_lens.hooks import check_hook, hook_dims, hook_layer
from tl_query_lens.models import copy_model, weights_fingerprint
from tl_query_lens.operators import flops
from tl_query_lens.operators.config import SWEEP_DTYPES, EngineConfig
from tl_query_lens.operators.distributed import all_reduce_sums, world_slice
from tl_query_lens.operators.store import OperatorSet, cache_path, check_operator, find_cached
from tl_query_lens.precision import use_bf16
from tl_query_lens.primitives import stop_layer

logger = logging.getLogger(__name__)

Direction = Literal["reverse", "forward"]
EMBED_HOOK = "hook_embed"


@dataclass
class _Sweep:
    """One batched sweep: tangents/cotangents over a basis, perturbations injected at ``perturb`` hooks.

    ``perturb`` maps hook → replace? (``x.detach() + δ`` instead of ``x + δ``). ``names`` maps the hook that indexes the
    result (perturbed hook in reverse mode, read hook in forward mode) to the operator name it fills.
    """

    direction: Direction
    perturb: dict[str, bool]
    read: list[str]
    names: dict[str, str]
    basis: torch.Tensor | None = None  # rows: tangents (forward) / cotangents (reverse); None = the identity

    def width(self, widths: dict[str, int]) -> int:
        """Number of basis vectors (tangents / cotangents) the sweep pushes."""
        if self.basis is not None:
            return int(self.basis.shape[0])
        hooks = self.read if self.direction == "reverse" else list(self.perturb)
        (width,) = {widths[n] for n in hooks}
        return width

    def rows(self, idx: torch.Tensor, width: int, device: torch.device) -> torch.Tensor:
        """Basis vectors ``idx`` (fp32, on ``device``): identity rows or the requested directions."""
        if self.basis is None:
            return torch.eye(width, device=device)[idx]
        return self.basis.to(device, torch.float32)[idx]


def final_hook(model: HookedTransformer) -> str:
    """``blocks.{L-1}.hook_resid_post``: the residual the final norm reads."""
    return f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"


def check_tokens(model: HookedTransformer, tokens: torch.Tensor, skip_positions: int = 0) -> torch.Tensor:
    """Validate a ``[batch, pos]`` integer token batch against the model's vocabulary and context."""
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.long, torch.int32):
        raise InputTypeError("tokens must be an integer tensor [batch, pos] (e.g. from tl_query_lens.load_corpus).")
    if tokens.numel() == 0:
        raise InputError("tokens is empty: load a corpus with load_corpus(..., n_seqs >= 1).")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.d_vocab:
        raise OutOfRangeError(
            f"Token ids span [{lo}, {hi}] but the model's vocabulary has {model.cfg.d_vocab} entries: these tokens "
            "come from another tokenizer. Tokenize with this model (load_corpus(..., model, ...) or model.to_tokens)."
        )
    if tokens.shape[1] > model.cfg.n_ctx:
        raise InputError(
            f"Sequences of {tokens.shape[1]} tokens exceed the model context n_ctx={model.cfg.n_ctx}; "
            "use a shorter seq_len."
        )
    if not 0 <= skip_positions < tokens.shape[1]:
        raise InputError(f"skip_positions={skip_positions} must be in [0, seq_len={tokens.shape[1]}).")
    return tokens.long()


def basis_fingerprint(basis: torch.Tensor) -> str:
    """Content hash of a feature basis (the operator set computed on it is cached under it)."""
    if basis.device.type == "meta":  # shapes only: nothing to hash (and nothing worth caching)
        return f"meta{tuple(basis.shape)}"
    data = basis.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data + str(tuple(basis.shape)).encode()).hexdigest()[:16]


def chunk_for_memory(
    model: HookedTransformer,
    sweeps: Sequence[_Sweep],
    widths: dict[str, int],
    batch_size: int,
    seq_len: int,
    max_memory_gb: float,
) -> int:
    """The largest tangent/cotangent chunk whose estimated working memory fits ``max_memory_gb``.

    Estimate (bytes): the saved forward graph of a reverse sweep, ``L · B · P · w_layer · s``, plus per basis vector
    ``2 · B · P · (w_layer + Σ_read d_read) · 4`` (fp32-sized tangents of one layer's activations, the read hooks'
    tangents or the cotangent); ``w_layer = 6·d_model + 3·d_mlp + 3·n_heads·P``, ``s`` the model's element size.
    It is an estimate, not a guarantee: keep headroom for the weights and the allocator.
    """
    if max_memory_gb <= 0:
        raise ValueError(f"max_memory_gb must be > 0, got {max_memory_gb}.")
    cfg = model.cfg
    tokens = batch_size * seq_len
    w_layer = 6 * cfg.d_model + 3 * (cfg.d_mlp or 0) + 3 * cfg.n_heads * seq_len
    element = torch.empty((), dtype=cfg.dtype).element_size()
    budget = max_memory_gb * 2**30
    chunk = None
    for sweep in sweeps:
        graph = cfg.n_layers * tokens * w_layer * element if sweep.direction == "reverse" else 0
        per_vector = 2 * tokens * (w_layer + sum(widths[n] for n in sweep.read)) * 4
        fits = int((budget - graph) // per_vector)
        chunk = fits if chunk is None else min(chunk, fits)
    if chunk is None or chunk < 1:
        raise ValueError(
            f"max_memory_gb={max_memory_gb} is too small for batch_size={batch_size} sequences of "
            f"{seq_len} tokens: lower batch_size or raise max_memory_gb."
        )
    chunk = min(chunk, max(s.width(widths) for s in sweeps))
    logger.info("max_memory_gb=%s: %d tangents/cotangents per pass", max_memory_gb, chunk)
    return chunk


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2) if x.ndim == 4 else x  # hook_z style [batch, pos, head, d_head] → [batch, pos, head·d_head]


def _run_sweep(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    sweep: _Sweep,
    valid: Float[torch.Tensor, "batch pos"],
    widths: dict[str, int],
    sums: dict[str, torch.Tensor],
    chunk: int,
    bar,
) -> None:
    """Add one minibatch's contribution to ``sums`` (operator name → fp32 ``[d_out, d_in]``, on the model's device).

    Activations stay in the model's dtype; the perturbation ``δ`` is an fp32 leaf broadcast to every position in fp32
    and only then cast, so the position sums of gradients / tangents (and the operator sums) are fp32 (bf16/fp16 models).
    """
    device = tokens.device
    stop = stop_layer([*sweep.perturb, *sweep.read])
    deltas: dict[str, torch.Tensor] = {}
    captured: dict[str, torch.Tensor] = {}

    def inject(x: torch.Tensor, hook) -> torch.Tensor:
        base = x.detach() if sweep.perturb[hook.name] else x
        delta = deltas[hook.name]  # fp32 [width]; broadcast in fp32, so its gradient sums positions in fp32
        delta = delta.reshape(x.shape[2:]) if x.ndim == 4 else delta
        return base + delta.expand(x.shape).to(x.dtype)

    def grab(x: torch.Tensor, hook) -> None:
        captured[hook.name] = _flat(x)

    hooks: list[tuple[str | Callable, Callable]] = [(name, inject) for name in sweep.perturb]
    hooks += [(name, grab) for name in sweep.read]
    n_basis = sweep.width(widths)
    if sweep.direction == "reverse":
        (d_out,) = {widths[n] for n in sweep.read}
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            for name in sweep.perturb:
                deltas[name] = torch.zeros(widths[name], device=device, requires_grad=True)
            model(tokens, stop_at_layer=stop)
            outputs = [captured[name] for name in sweep.read]
            sources = list(sweep.perturb)
            for start in range(0, n_basis, chunk):
                idx = torch.arange(start, min(start + chunk, n_basis), device=device)
                rows = sweep.rows(idx, d_out, device)  # cotangent directions at the read hook(s)
                cot = (valid[None, :, :, None] * rows[:, None, None, :]).to(outputs[0].dtype)
                grads = torch.autograd.grad(
                    outputs,
                    [deltas[n] for n in sources],
                    [cot] * len(outputs),
                    retain_graph=True,
                    allow_unused=True,
                    is_grads_batched=True,
                )
                for name, grad in zip(sources, grads):
                    if grad is None:
                        raise ValueError(f"Hook {name!r} does not influence {sweep.read}: it is downstream of them.")
                    sums[sweep.names[name]][idx] += grad.float()  # rows j = b_jᵀ J
                bar.update(1)
            captured.clear()
        return

    (d_in,) = {widths[n] for n in sweep.perturb}
    mask = valid.float()[..., None]

    def forward(delta: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for name in sweep.perturb:
            deltas[name] = delta
        model(tokens, stop_at_layer=stop)
        return tuple((captured[name].float() * mask).sum((0, 1)) for name in sweep.read)

    zero = torch.zeros(d_in, device=device)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for start in range(0, n_basis, chunk):
            idx = torch.arange(start, min(start + chunk, n_basis), device=device)
            columns = vmap(lambda t: jvp(forward, (zero,), (t,))[1])(sweep.rows(idx, d_in, device))
            for name, col in zip(sweep.read, columns):
                sums[sweep.names[name]][:, idx] += col.T.float()  # columns i = J b_i
            bar.update(1)
            captured.clear()


def _compute(
    model: HookedTransformer,
    tokens: torch.Tensor,
    kind: str,
    anchor: str,
    names: list[str],
    shapes: dict[str, tuple[int, int]],
    sweeps: list[_Sweep],
    widths: dict[str, int],
    engine: EngineConfig,
) -> OperatorSet:
    """Run ``sweeps`` over the corpus in minibatches (sharded over torch.distributed ranks), with caching/resume."""
    skip_positions, chunk, batch_size = engine.skip_positions, engine.chunk, engine.batch_size
    cache_dir, progress, max_memory_gb = engine.cache_dir, engine.progress, engine.max_memory_gb
    sweep_dtype, sweep_autocast = sweep_precision(engine, model)
    tokens = check_tokens(model, tokens, skip_positions)
    if sweep_autocast:
        if sweep_dtype is None or sweep_dtype == model.cfg.dtype:
            raise InputError("sweep_autocast=True needs a sweep_dtype other than the model's, e.g. torch.bfloat16.")
        _in_dtype(model, sweep_dtype, check_only=True)
        precision = f"{str(sweep_dtype).replace('torch.', '')}-autocast"
    else:
        model = _in_dtype(model, sweep_dtype)
        precision = str(model.cfg.dtype).replace("torch.", "")
    if max_memory_gb is not None:
        chunk = chunk_for_memory(model, sweeps, widths, min(batch_size, len(tokens)), tokens.shape[1], max_memory_gb)
    basis = basis_fingerprint(sweeps[0].basis) if sweeps[0].basis is not None else None
    device = torch.device(model.cfg.device)  # type: ignore[arg-type]
    fingerprint = corpus_fingerprint(tokens)
    dtype = precision
    model_name = str(model.cfg.model_name)
    local, rank, world = world_slice(tokens)
    path = None
    weights = weights_fingerprint(model) if cache_dir is not None else None
    directions = sorted({s.direction for s in sweeps})
    if cache_dir is not None:
        keyed = names if basis is None else [*names, f"basis:{basis}"]  # one cache file per feature set
        if kind == "value" and anchor != final_hook(model):
            keyed = [*keyed, f"to:{anchor}"]  # value operators into another destination than the final residual
        keyed = [*keyed, f"weights:{weights}"]  # same name, other weights: another file
        path = cache_path(cache_dir, kind, model_name, keyed, fingerprint, dtype, skip_positions)
    state = None
    # a partial state belongs to its process: one process resumes from the cache file itself, rank r of w from a
    # file of its own beside it (a rerun with the same ranks finds it)
    partial = path if path is None or world == 1 else path.with_name(f"{path.stem}.rank{rank}of{world}{path.suffix}")
    if path is not None and path.exists():
        cached = OperatorSet.load(path)
        if cached.complete:
            logger.info("Reusing cached %s from %s", cached.describe(), path)
            return cached.to(model.cfg.device)  # type: ignore[arg-type]
        if partial == path:
            state = cached
    elif cache_dir is not None:  # these hooks may sit inside a larger sweep's file (same corpus, weights, method)
        want = {"corpus_fingerprint": fingerprint, "dtype": dtype, "skip_positions": skip_positions}
        extra = {"weights": weights, "directions": directions, "basis": basis}
        found = find_cached(cache_dir, kind, model_name, names, {**want, "anchor_hook": anchor, "extra": extra})
        if found is not None:
            logger.info("Reusing %s from the larger cached set %s", found.describe(), found.extra["from"])
            return found.to(model.cfg.device)  # type: ignore[arg-type]
    if partial is not None and partial != path and partial.exists():
        state = OperatorSet.load(partial)
    if state is not None and (state.complete or state.batch_size != batch_size):
        state = None  # a partial state is only resumed with the same minibatch split
    if state is None:
        state = OperatorSet(
            kind=kind,  # type: ignore[arg-type]
            sums={n: torch.zeros(shapes[n], device=device) for n in names},
            count=0,
            model_name=model_name,
            anchor_hook=anchor,
            corpus_fingerprint=fingerprint,
            dtype=dtype,
            skip_positions=skip_positions,
            batches_done=0,
            batch_size=batch_size,
            extra={
                "directions": directions,
                "chunk": chunk,
                **({"basis": basis} if basis else {}),
                **({"weights": weights} if weights else {}),
            },
        )
    else:
        logger.info("Resuming %s after %d minibatches", state.describe(), state.batches_done)
    state = state.to(device)  # sums accumulate on the model's device; the file on disk is device-free
    batches = list(torch.split(local.to(device), batch_size)) if len(local) else []
    n_chunks = sum(-(-s.width(widths) // chunk) for s in sweeps)
    bar = tqdm(
        total=(len(batches) - state.batches_done) * n_chunks,
        desc=f"{kind} operators",
        disable=not progress or rank != 0,
    )
    for b in range(state.batches_done, len(batches)):
        batch = batches[b]
        valid = torch.zeros(batch.shape, device=batch.device)
        valid[:, skip_positions:] = 1.0
        for sweep in sweeps:
            with torch.autocast(device.type, dtype=sweep_dtype) if sweep_autocast else contextlib.nullcontext():
                _run_sweep(model, batch, sweep, valid, widths, state.sums, chunk, bar)
            if flops.counting():  # FLOPs from the shapes (operators/flops.py), for throughput reports
                n_basis = sweep.width(widths)
                flops.record(
                    flops.sweep_flops(
                        model.cfg, sweep.direction, sweep.perturb, sweep.read, n_basis, chunk, *batch.shape
                    )
                )
        state.count += batch.shape[0] * (batch.shape[1] - skip_positions)  # |T| from shapes: no device sync
        state.batches_done = b + 1
        if partial is not None and b + 1 < len(batches):
            state.save(partial)  # a rerun (with the same ranks) resumes after this minibatch
    bar.close()
    state.batches_done = -1
    if world > 1:  # on the model's device: gloo for CPU, nccl for CUDA
        state.sums, state.count = all_reduce_sums(state.sums, state.count)
    for name, s in state.sums.items():
        check_operator(s, f"{kind} operator {name!r}")
    if path is not None and rank == 0:
        state.save(path)
        # progress files of runs with other numbers of ranks (or this one's) are superseded by the complete set
        for stale in path.parent.glob(f"{path.stem}.rank*of*{path.suffix}"):
            stale.unlink(missing_ok=True)
    if partial is not None and partial != path:
        partial.unlink(missing_ok=True)  # this rank's progress is in the complete file now
    return state


_SWEEP_DTYPES = tuple(getattr(torch, name) for name in SWEEP_DTYPES)


def torch_dtype(name: str | None) -> torch.dtype | None:
    """An :class:`EngineConfig`'s ``sweep_dtype`` name as a ``torch.dtype`` (None: the model's own)."""
    return None if name is None else getattr(torch, name)


def sweep_precision(engine: EngineConfig, model: HookedTransformer) -> tuple[torch.dtype | None, bool]:
    """``(sweep dtype, autocast)`` of ``engine`` for ``model``: ``sweep_dtype='auto'`` is bf16 autocast on an fp32
    model whose device has bf16 units (:func:`tl_query_lens.precision.use_bf16`), else the model's own dtype."""
    if engine.sweep_dtype != "auto":
        return torch_dtype(engine.sweep_dtype), engine.sweep_autocast
    if model.cfg.dtype == torch.float32 and use_bf16("auto", model.cfg.device):
        return torch.bfloat16, True
    return None, False


def _in_dtype(model, dtype: torch.dtype | None, *, check_only: bool = False):
    """The model the sweeps run on: ``model`` itself, or its copy in ``dtype`` (``sweep_dtype``)."""
    if dtype is not None and dtype not in _SWEEP_DTYPES:
        raise InputError(f"sweep_dtype must be one of {[str(d) for d in _SWEEP_DTYPES]} or None, not {dtype!r}.")
    if check_only or dtype is None or dtype == model.cfg.dtype:
        return model
    logger.info("Sweeping a %s copy of the model (operators accumulate in fp32)", dtype)
    return copy_model(model, dtype=dtype)


def _widths(model: HookedTransformer, hooks: list[str]) -> dict[str, int]:
    unique = list(dict.fromkeys(hooks))
    for name in unique:
        check_hook(model, name)
    if flops.counting():
        flops.record(flops.FlopCount(probe=flops.probe_flops(model.cfg, unique)))
    return hook_dims(model, unique)


def check_value_source(name: str) -> None:
    """Raise unless ``name`` can start a value operator (a block hook or ``hook_embed``)."""
    if hook_layer(name) is None and name != EMBED_HOOK:
        raise ValueError(f"Value operators start at a block hook or hook_embed, not {name!r}.")


def value_operators(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    hooks: Sequence[str],
    engine: EngineConfig | None = None,
    *,
    direction: Direction = "reverse",
    basis: Float[torch.Tensor, "n d_src"] | None = None,
    destination: str | None = None,
    **overrides: Any,
) -> OperatorSet:
    """Value operators ``M_src`` ``[d_model, d_src]`` from each source hook to the final residual (docs/design.md §4).

    ``Δh_final ≈ M_src @ v`` for a direction ``v`` added at every position of ``src``; h_final is
    ``blocks.{L-1}.hook_resid_post`` (before the final norm). ``direction="reverse"`` (default) gets all sources from
    one backward sweep with ``d_model`` cotangents; ``"forward"`` runs one JVP sweep per source (for cross-checks).
    Sources may be any block hook upstream of the destination, e.g. ``blocks.l.mlp.hook_post`` (width d_mlp: the
    tangent then flows through ``W_out`` and any norm after the MLP, Gemma-2's ``ln2_post``).

    Args:
        model: a HookedTransformer (run clean; SAEs attached to a HookedSAETransformer are ignored only if not spliced).
        tokens: ``[batch, pos]`` corpus.
        hooks: source hooks (e.g. ``blocks.18.hook_resid_post``).
        engine / overrides: an :class:`~tl_query_lens.operators.config.EngineConfig` (skip_positions, chunk,
            batch_size, cache_dir, progress, max_memory_gb, sweep_dtype, sweep_autocast); keyword overrides replace
            single fields (``value_operators(model, tokens, hooks, chunk=16, progress=False)``).
        direction: ``"reverse"`` or ``"forward"``.
        basis: the feature basis — ``n`` source directions ``v_i`` (rows) pushed forward directly, so each operator is
            ``M_src Vᵀ`` ``[d_model, n]`` at the cost of n tangents instead of d_src (``direction`` is then forward).
            None: the identity basis, the full operator.
        destination: the hook the operators map into (``[d_dst, d_src]``), e.g. ``blocks.l.hook_mlp_out`` for the
            corpus-mean Jacobian of an MLP's write w.r.t. its ``mlp.hook_post``; None: the final residual.
    """
    engine = resolve_config(EngineConfig, engine, overrides)
    hooks = list(dict.fromkeys(hooks))
    if not hooks:
        raise ValueError("Give at least one source hook.")
    if basis is not None:
        direction = "forward"
    final = final_hook(model) if destination is None else destination
    widths = _widths(model, [*hooks, final])
    for name in hooks:
        check_value_source(name)
        if destination is not None and _depth(name) > _depth(final):
            raise ValueError(f"Source {name!r} lies downstream of destination {final!r}: it cannot move it.")
    if direction == "reverse":
        sweeps = [_Sweep("reverse", {h: False for h in hooks}, [final], {h: h for h in hooks})]
    elif direction == "forward":
        sweeps = [_Sweep("forward", {h: False}, [final], {final: h}, _basis(basis, widths[h], h)) for h in hooks]
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', not {direction!r}.")
    columns = {h: widths[h] if basis is None else len(basis) for h in hooks}
    shapes = {h: (widths[final], columns[h]) for h in hooks}
    return _compute(
        model,
        tokens,
        "value",
        final,
        hooks,
        shapes,
        sweeps,
        widths,
        engine,
    )


def key_operators(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    hooks: Sequence[str],
    engine: EngineConfig | None = None,
    *,
    direction: Direction = "forward",
    basis: Float[torch.Tensor, "n d_dst"] | None = None,
    **overrides: Any,
) -> OperatorSet:
    """Key operators ``N_dst`` ``[d_dst, d_model]`` from the token embeddings (``hook_embed``) to each hook (docs/design.md §4).

    ``Δh_dst ≈ N_dst @ δe`` for ``δe`` added to the embedding of every position. ``direction="forward"`` (default)
    reaches all destinations in one JVP sweep with ``d_model`` tangents; ``"reverse"`` runs one backward sweep per
    destination. ``basis``: ``n`` key directions ``k_i`` (rows, at the destination) pulled back directly, so each
    operator is ``K N_dst`` ``[n, d_model]`` (row i = ``N_dstᵀ k_i``) at the cost of n cotangents (reverse mode).
    Other arguments as in :func:`value_operators`.
    """
    engine = resolve_config(EngineConfig, engine, overrides)
    hooks = list(dict.fromkeys(hooks))
    if not hooks:
        raise ValueError("Give at least one destination hook.")
    if basis is not None:
        direction = "reverse"
    widths = _widths(model, [EMBED_HOOK, *hooks])
    if direction == "forward":
        sweeps = [_Sweep("forward", {EMBED_HOOK: False}, hooks, {h: h for h in hooks})]
    elif direction == "reverse":
        sweeps = [
            _Sweep("reverse", {EMBED_HOOK: False}, [h], {EMBED_HOOK: h}, _basis(basis, widths[h], h)) for h in hooks
        ]
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', not {direction!r}.")
    shapes = {h: (widths[h] if basis is None else len(basis), widths[EMBED_HOOK]) for h in hooks}
    return _compute(
        model,
        tokens,
        "key",
        EMBED_HOOK,
        hooks,
        shapes,
        sweeps,
        widths,
        engine,
    )


def module_operators(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    layers: Sequence[int] | None = None,
    engine: EngineConfig | None = None,
    *,
    direction: Direction = "reverse",
    basis: Float[torch.Tensor, "n d_model"] | None = None,
    **overrides: Any,
) -> OperatorSet:
    """Per-module operators of blocks ``layers`` (default all): ``blocks.k.attn`` = J̄_A^k and ``blocks.k.mlp`` = J̄_M^k,
    the corpus-mean Jacobians of block k's attention / MLP residual write w.r.t. the residual that module reads, each
    ``[d_model, d_model]`` (docs/design.md §4–5).

    Sequential blocks: J̄_A^k = ∂attn_out_k/∂resid_pre_k, J̄_M^k = ∂mlp_out_k/∂resid_mid_k. Parallel blocks
    (``parallel_attn_mlp``: GPT-J, GPT-NeoX/Pythia) have no resid_mid: both modules read the block input, so
    J̄_A^k = ∂attn_out_k/∂resid_pre_k and J̄_M^k = ∂mlp_out_k/∂resid_pre_k (their sum is the block's Jacobian minus I).

    Inputs are perturbed in replace mode (``x.detach() + δ``) so each module sees only its own tangent. Forward mode
    gives every module from one sweep; reverse mode needs one sweep per input hook, so two for parallel blocks (the
    attention and MLP writes share their input). ``basis``: ``n`` directions (rows) pushed forward through every
    module at once, so each operator is ``J̄ Vᵀ`` ``[d_model, n]``. Other arguments as in :func:`value_operators`.
    """
    engine = resolve_config(EngineConfig, engine, overrides)
    if basis is not None:
        direction = "forward"
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if layers is None else sorted({int(k) for k in layers})
    bad = [k for k in layers if not 0 <= k < n_layers]
    if bad or not layers:
        raise ValueError(f"layers {bad or layers} out of range for a model with {n_layers} layers.")
    if getattr(model.cfg, "attn_only", False):
        raise NotImplementedError("Attention-only models have no MLP modules; module operators need both.")
    mlp_input = "pre" if getattr(model.cfg, "parallel_attn_mlp", False) else "mid"
    reads = {m: {f"blocks.{k}.hook_{m}_out": f"blocks.{k}.{m}" for k in layers} for m in ("attn", "mlp")}
    inputs = {
        m: {f"blocks.{k}.hook_resid_{p}": f"blocks.{k}.{m}" for k in layers}
        for m, p in (("attn", "pre"), ("mlp", mlp_input))
    }
    outputs = {**reads["attn"], **reads["mlp"]}
    widths = _widths(model, [*inputs["attn"], *inputs["mlp"], *outputs])
    perturb = {h: True for h in (*inputs["attn"], *inputs["mlp"])}
    if direction == "reverse":
        if mlp_input == "pre":  # one input, two outputs: pull each output back in its own sweep
            sweeps = [_Sweep("reverse", perturb, list(reads[m]), inputs[m]) for m in ("attn", "mlp")]
        else:
            sweeps = [_Sweep("reverse", perturb, list(outputs), {**inputs["attn"], **inputs["mlp"]})]
    elif direction == "forward":
        sweeps = [_Sweep("forward", perturb, list(outputs), outputs, _basis(basis, model.cfg.d_model, "the residual"))]
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', not {direction!r}.")
    names = [f"blocks.{k}.{m}" for k in layers for m in ("attn", "mlp")]
    d = model.cfg.d_model
    n = d if basis is None else len(basis)
    return _compute(
        model,
        tokens,
        "module",
        "",
        names,
        {name: (d, n) for name in names},
        sweeps,
        widths,
        engine,
    )


def _depth(name: str) -> int:
    """Block index of a hook for ordering checks: -1 before the blocks (``hook_embed`` …), a large one after them."""
    layer = hook_layer(name)
    if layer is None:
        return -1 if name.startswith("hook_") else 2**31
    return layer


def _basis(basis: torch.Tensor | None, width: int, where: str) -> torch.Tensor | None:
    if basis is None:
        return None
    if basis.ndim != 2 or basis.shape[1] != width or basis.shape[0] < 1:
        raise ValueError(f"basis must be [n ≥ 1, {width}] (directions at {where}), got {tuple(basis.shape)}.")
    return basis.detach()
