"""FLOP accounting of the operator engine, counted from the shapes (no profiler needed at run time).

What is counted: the floating-point operations of the MATRIX PRODUCTS the engine executes (2 per multiply-add:
``torch.mm``/``addmm``/``bmm`` of the weight projections and of the attention core). Norms, activations, softmax,
rotary, residual adds, casts and the fp32 accumulation of the sums are elementwise and not counted; neither is the
embedding (a lookup). This is the convention of ``torch.utils.flop_counter.FlopCounterMode``, which the tests use as an
independent reference: on the tiny test models the count below equals its total exactly.

Per token and per block, at sequence length ``P`` (``H`` query heads, ``H_kv`` key/value heads, ``d_h`` head width,
``g = 2`` for a gated MLP, else 1)::

    qkv     = 2·d_model·d_h·(H + 2·H_kv)      Q, K, V projections
    core    = 2·2·H·d_h·P                     Q·Kᵀ and pattern·V over all P keys (the causal mask is applied to the
                                              full P×P product, so the masked half is executed and counted)
    out     = 2·H·d_h·d_model                 W_O
    mlp_in  = 2·d_model·d_mlp·g               W_in (and W_gate)
    mlp_out = 2·d_mlp·d_model                 W_out

    F_block = qkv + core + out + mlp_in + mlp_out          (one clean forward pass)
    T_block = qkv + 2·core + out + mlp_in + mlp_out        (one tangent, JVP, or one cotangent, VJP)

Why ``T_block ≈ F_block`` and not the "2–3× forward" of a training step: the weights are constants here, so a JVP
pushes a tangent through each projection once (``δx·W``) and a VJP pulls a cotangent back once (``g·Wᵀ``); no weight
gradient is formed. Only the attention core, bilinear in activations that both carry the tangent, costs twice
(``δQ·Kᵀ + Q·δKᵀ``, and likewise for pattern·V). So one tangent or cotangent costs about one forward pass of the
blocks it crosses; for GPT-2 small at P = 32, ``T_block / F_block = 1.007``.

A sweep over a minibatch of ``B`` sequences (``N = B·P`` tokens) with ``n`` basis vectors (tangents or cotangents) in
chunks of ``c``, through the blocks in front of the last hook it reads (``stop``), costs::

    reverse (VJP):  N·Σ_{blocks<stop} F_block  +  n·N·Σ_{crossed} T_block
    forward (JVP):  ⌈n/c⌉·N·(Σ_{blocks<stop} F_block + Σ_{crossed} W_block)  +  n·N·Σ_{crossed} T_block

where "crossed" are the pieces of blocks a tangent actually traverses: in reverse mode those on a path from a perturbed
hook to a read hook (the backward prunes the rest), in forward mode everything downstream of a perturbed hook up to
``stop`` (the JVP runs the whole truncated forward). Replace-mode perturbations (module operators: ``x.detach() + δ``)
cut the paths into their hook. In forward mode the primal pass runs once per chunk, and ``torch.func.jvp`` also
multiplies the primal input by each weight's (zero) tangent, one more primal-sized product per projection crossed
(``W_block = qkv + out + mlp_in + mlp_out``; measured with FlopCounterMode). Each engine call also probes the hook
widths with a one-token forward pass (``P = 1``), counted as ``probe``. Hooks inside the attention (``hook_q``,
``hook_pattern``…) are treated as the start of the attention core, an upper bound for a perturbation there.

Use :func:`count_flops` around engine calls to add up what they execute::

    with count_flops() as flops:
        value_operators(model, tokens, [hook])
    flops.total, flops.primal, flops.tangent, flops.probe
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from tl_query_lens.hooks import hook_layer
from tl_query_lens.primitives import stop_layer

_LINEAR = ("qkv", "out", "mlp_in", "mlp_out")


@dataclass(frozen=True)
class BlockFlops:
    """Matrix-product FLOPs of one block's pieces per token of a forward pass at one sequence length."""

    qkv: int
    core: int
    out: int
    mlp_in: int
    mlp_out: int

    @property
    def forward(self) -> int:
        """``F_block``: one clean forward pass."""
        return self.qkv + self.core + self.out + self.mlp_in + self.mlp_out

    @property
    def tangent(self) -> int:
        """``T_block``: one tangent (JVP) or cotangent (VJP) through the whole block."""
        return self.forward + self.core


def block_flops(cfg, seq_len: int) -> BlockFlops:
    """:class:`BlockFlops` of a TransformerLens config at sequence length ``seq_len``."""
    d, dh, heads = cfg.d_model, cfg.d_head, cfg.n_heads
    kv = getattr(cfg, "n_key_value_heads", None) or heads
    d_mlp = 0 if getattr(cfg, "attn_only", False) else (cfg.d_mlp or 0)
    gates = 2 if getattr(cfg, "gated_mlp", False) else 1
    return BlockFlops(
        qkv=2 * d * dh * (heads + 2 * kv),
        core=2 * 2 * heads * dh * seq_len,
        out=2 * heads * dh * d,
        mlp_in=2 * d * d_mlp * gates,
        mlp_out=2 * d_mlp * d,
    )


def unembed_flops(cfg) -> int:
    """Per-token FLOPs of the unembedding (only run when a hook after the blocks is read)."""
    return 2 * cfg.d_model * cfg.d_vocab


# ----- where a tangent goes: each block as a small graph of pieces between hook points -------------------------------
# Nodes of block k; edges carry the piece they execute (None: elementwise or the residual connection, 0 FLOPs).
_SEQUENTIAL = [
    ("pre", "ln1", None),
    ("ln1", "q", "qkv"),
    ("q", "z", "core"),
    ("z", "attn_out", "out"),
    ("attn_out", "mid", None),
    ("pre", "mid", None),
    ("mid", "ln2", None),
    ("ln2", "hidden", "mlp_in"),
    ("hidden", "mlp_out", "mlp_out"),
    ("mlp_out", "post", None),
    ("mid", "post", None),
]
_PARALLEL = [  # GPT-J / GPT-NeoX: both modules read the block input, resid_post = resid_pre + attn_out + mlp_out
    ("pre", "ln1", None),
    ("ln1", "q", "qkv"),
    ("q", "z", "core"),
    ("z", "attn_out", "out"),
    ("attn_out", "post", None),
    ("pre", "ln2", None),
    ("ln2", "hidden", "mlp_in"),
    ("hidden", "mlp_out", "mlp_out"),
    ("mlp_out", "post", None),
    ("pre", "post", None),
]
_NODE_OF_SUFFIX = {
    "hook_resid_pre": "pre",
    "hook_attn_in": "ln1",
    "hook_q_input": "ln1",
    "hook_k_input": "ln1",
    "hook_v_input": "ln1",
    "attn.hook_q": "q",
    "attn.hook_k": "q",
    "attn.hook_v": "q",
    "attn.hook_rot_q": "q",
    "attn.hook_rot_k": "q",
    "attn.hook_attn_scores": "q",
    "attn.hook_pattern": "q",
    "attn.hook_z": "z",
    "attn.hook_result": "attn_out",
    "hook_attn_out": "attn_out",
    "hook_resid_mid": "mid",
    "hook_mlp_in": "mid",
    "mlp.hook_in": "ln2",
    "mlp.hook_pre": "hidden",
    "mlp.hook_pre_linear": "hidden",
    "mlp.hook_post": "hidden",
    "hook_mlp_out": "mlp_out",
    "hook_resid_post": "post",
}

Node = tuple[int, str]


def _node(name: str, n_layers: int) -> Node:
    """The graph node of a hook: ``(layer, piece)``; embeddings at layer -1, the final norm at layer n_layers."""
    layer = hook_layer(name)
    if layer is None:
        if name.startswith(("hook_embed", "hook_pos_embed", "hook_tokens")):
            return (-1, "embed")
        if name.startswith("ln_final."):
            return (n_layers, "final")
        raise ValueError(f"No FLOP accounting for hook {name!r}.")
    suffix = name.split(".", 2)[2]
    if suffix.startswith("ln1."):
        return (layer, "ln1")
    if suffix.startswith("ln2."):
        return (layer, "ln2")
    if suffix in _NODE_OF_SUFFIX:
        return (layer, _NODE_OF_SUFFIX[suffix])
    raise ValueError(f"No FLOP accounting for hook {name!r}.")


def _edges(cfg, n_blocks: int, unembed: bool) -> list[tuple[Node, Node, str | None]]:
    pieces = _PARALLEL if getattr(cfg, "parallel_attn_mlp", False) else _SEQUENTIAL
    edges: list[tuple[Node, Node, str | None]] = [((-1, "embed"), (0, "pre"), None)]
    for k in range(n_blocks):
        edges += [((k, a), (k, b), piece) for a, b, piece in pieces]
        edges.append(((k, "post"), (k + 1, "pre") if k + 1 < cfg.n_layers else (cfg.n_layers, "final"), None))
    if unembed:
        edges.append(((cfg.n_layers, "final"), (cfg.n_layers, "logits"), "unembed"))
    return edges


def _reach(starts: Iterable[Node], edges, forward: bool) -> set[Node]:
    step: dict[Node, list[Node]] = {}
    for a, b, _ in edges:
        src, dst = (a, b) if forward else (b, a)
        step.setdefault(src, []).append(dst)
    seen, todo = set(starts), list(starts)
    while todo:
        for nxt in step.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _piece_flops(cfg, seq_len: int) -> dict[str, int]:
    block = block_flops(cfg, seq_len)
    return {
        "qkv": block.qkv,
        "core": block.core,
        "out": block.out,
        "mlp_in": block.mlp_in,
        "mlp_out": block.mlp_out,
        "unembed": unembed_flops(cfg),
    }


def forward_flops(cfg, hooks: Iterable[str], n_tokens: int, seq_len: int) -> int:
    """FLOPs of one clean forward pass of ``n_tokens`` tokens that stops after the last of ``hooks``."""
    stop = stop_layer(hooks)
    blocks = cfg.n_layers if stop is None else stop
    total = blocks * block_flops(cfg, seq_len).forward
    return n_tokens * (total + (unembed_flops(cfg) if stop is None else 0))


@dataclass
class FlopCount:
    """Matrix-product FLOPs the engine executed: ``primal`` (forward passes), ``tangent`` (JVPs/VJPs), ``probe``."""

    primal: int = 0
    tangent: int = 0
    probe: int = 0
    sweeps: list[dict] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.primal + self.tangent + self.probe

    def add(self, other: FlopCount) -> None:
        self.primal += other.primal
        self.tangent += other.tangent
        self.probe += other.probe
        self.sweeps += other.sweeps


def sweep_flops(
    cfg,
    direction: str,
    perturb: dict[str, bool],
    read: Sequence[str],
    n_basis: int,
    chunk: int,
    batch: int,
    seq_len: int,
) -> FlopCount:
    """FLOPs of one engine sweep over one minibatch of ``batch`` sequences of ``seq_len`` tokens.

    Args:
        cfg: the model's TransformerLens config.
        direction: ``"reverse"`` (one forward pass, ``n_basis`` cotangents) or ``"forward"`` (``n_basis`` tangents).
        perturb: perturbed hook → replace mode (``x.detach() + δ``, which cuts the paths into that hook).
        read: the hooks read.
        n_basis: tangents / cotangents pushed.
        chunk: how many per batched pass (forward mode reruns the primal once per chunk).
    """
    stop = stop_layer([*perturb, *read])
    n_blocks = cfg.n_layers if stop is None else stop
    edges = _edges(cfg, n_blocks, unembed=stop is None)
    sources = [_node(h, cfg.n_layers) for h in perturb]
    cut = {_node(h, cfg.n_layers) for h, replace in perturb.items() if replace}
    edges = [e for e in edges if e[1] not in cut]  # replace mode: nothing upstream reaches the hook
    downstream = _reach(sources, edges, forward=True)
    if direction == "reverse":
        upstream = _reach([_node(h, cfg.n_layers) for h in read], edges, forward=False)
        crossed = [p for a, b, p in edges if p and a in downstream and b in upstream]
    elif direction == "forward":
        crossed = [p for a, b, p in edges if p and a in downstream]
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', not {direction!r}.")
    cost = _piece_flops(cfg, seq_len)
    n_tokens = batch * seq_len
    per_vector = sum(cost[p] * (2 if p == "core" else 1) for p in crossed)
    primal = forward_flops(cfg, [*perturb, *read], n_tokens, seq_len)
    if direction == "forward":
        zero_tangents = n_tokens * sum(cost[p] for p in crossed if p in (*_LINEAR, "unembed"))
        primal = math.ceil(n_basis / chunk) * (primal + zero_tangents)
    count = FlopCount(primal=primal, tangent=n_basis * n_tokens * per_vector)
    count.sweeps.append({"direction": direction, "n_basis": n_basis, "tokens": n_tokens, "flops": count.total})
    return count


def probe_flops(cfg, hooks: Iterable[str]) -> int:
    """The one-token forward pass that probes hook widths (``tl_query_lens.hooks.hook_dims``)."""
    return forward_flops(cfg, list(hooks), 1, 1)


# ----- collection: the engine reports what it runs to every active counter ---------------------------------------------
_ACTIVE: list[FlopCount] = []


@contextlib.contextmanager
def count_flops() -> Iterator[FlopCount]:
    """Add up the matrix-product FLOPs of every engine sweep run inside the block (results reused from a cache: 0)."""
    count = FlopCount()
    _ACTIVE.append(count)
    try:
        yield count
    finally:
        _ACTIVE.remove(count)


def record(count: FlopCount) -> None:
    """Called by the engine: add ``count`` to every active :func:`count_flops` block (free when none is active)."""
    for active in _ACTIVE:
        active.add(count)


def counting() -> bool:
    return bool(_ACTIVE)


# ----- device peaks: what an achieved FLOP/s is compared with ------------------------------------------------------------
# Dense (no 2:4 sparsity) peaks from NVIDIA's datasheets, TFLOP/s at boost clock: tensor cores for bf16/fp16 and TF32,
# CUDA cores for plain fp32 (PyTorch's default for fp32 matmuls: torch.backends.cuda.matmul.allow_tf32 is False).
# Keys are matched against torch.cuda.get_device_name(); the first match wins (NVL/PCIe before the SXM parts).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200 NVL": {"bfloat16": 835.0, "float16": 835.0, "tf32": 417.5, "float32": 60.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.5, "float32": 67.0},
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "tf32": 378.0, "float32": 51.0},
    "H100 80GB HBM3": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.5, "float32": 67.0},  # H100 SXM5
    "H100 SXM": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.5, "float32": 67.0},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5},
}


def peak_tflops(device_name: str, dtype: str, *, tf32: bool = False) -> float | None:
    """The dense peak (TFLOP/s) of the named device for matrix products in ``dtype``; None when unknown.

    ``tf32``: fp32 products run on the tensor cores in TF32 (``torch.backends.cuda.matmul.allow_tf32``).
    """
    kind = "tf32" if dtype == "float32" and tf32 else dtype
    for key, peaks in PEAK_TFLOPS.items():
        if key in device_name:
            return peaks.get(kind)
    return None
