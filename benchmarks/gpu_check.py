"""GPU check: every method on a GPT-2-small-shaped random model, with FLOP/s against the device's peak, bf16 accuracy
against fp32, and agreement with the CPU. Prepared to finish in under 4 minutes on one H200, start-up included.

It installs nothing and reaches no hub (the model is random: the figures measure speed and numerics, not
interpretability). ``--device cpu --small`` is the CI smoke mode (a tiny config), which also checks the FLOP
accounting against a hand count and against ``torch.utils.flop_counter.FlopCounterMode``::

    python benchmarks/gpu_check.py                                    # cuda, GPT-2-small shape, default sizes
    python benchmarks/gpu_check.py --n-seqs 1024 --budget-s 600       # the issue-28 corpus: 1024 × 32 = 32k tokens
    python benchmarks/gpu_check.py --device cpu --small --seq-len 16  # CI smoke mode

Steps, in order (each timed; a step that would start after ``--budget-s`` seconds is skipped and listed as skipped):

1. fp32 sweeps on ``--n-seqs-fp32`` sequences: value operator of one mid layer (reverse sweep: cotangents), key operator
   of its MLP input (forward sweep: tangents).
2. The same two sweeps in bf16 on the same sequences, twice: on a bf16 copy (``sweep_dtype``) and under bf16 autocast
   on the fp32 model (``sweep_autocast``), each with its accuracy: relative error of the operators, and the top-k
   Jaccard overlap of the value and key signatures of ``--features`` FF-KV features.
3. Agreement with the CPU: the value and key operators of ``--slice`` sequence(s) recomputed on an fp32 CPU copy of the
   model (``copy_model``, not ``copy.deepcopy``: see tl_query_lens/models.py), vs the device in fp32 and in bf16.
4. bf16 throughput sweeps on ``--n-seqs`` sequences (a bf16 copy; ``--autocast``: autocast): value, key and the module
   operators of the downstream blocks.
5. Every method on the device: Query Lens value (full, first-order) and key signatures, the feature basis, FF-KV splice
   metrics, a certificate, a short readout-SAE fit and one decomposition.

Every sweep prints its achieved FLOP/s, counted from the shapes (tl_query_lens/operators/flops.py: matrix products only),
beside the device's dense peak for the dtype ("peak unknown" for devices not in the table).
"""

from __future__ import annotations

import time

START = time.monotonic()  # the budget counts from here (the interpreter start itself, ~0.1 s, is not seen)

import argparse
import importlib.util
import json
import logging
import math
import resource
import sys
import tempfile

REQUIRED = ("torch", "transformer_lens", "sae_lens", "tl_query_lens")


def check_environment() -> None:
    """Fail in one line, before any work, when a package is missing (this script installs nothing)."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"Missing packages {missing}: install them before the run (e.g. `pip install --no-index --find-links "
            f"<wheel folder> ...` from wheels carried to the machine); this script installs nothing."
        )


def peak_memory_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB: process peak RSS


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(small: bool, device: str):
    from sae_lens import HookedSAETransformer
    from transformer_lens import HookedTransformerConfig

    if small:
        shape = {"n_layers": 4, "d_model": 64, "d_head": 16, "n_heads": 4, "d_mlp": 256, "n_ctx": 64, "d_vocab": 503}
    else:  # GPT-2 small
        shape = {
            "n_layers": 12,
            "d_model": 768,
            "d_head": 64,
            "n_heads": 12,
            "d_mlp": 3072,
            "n_ctx": 1024,
            "d_vocab": 50257,
        }
    cfg = HookedTransformerConfig(
        **shape, act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard", seed=0, device=device
    )
    return HookedSAETransformer(cfg).eval()


def hand_count(cfg, kind: str, layer: int, n_tokens: int, seq_len: int, chunk: int) -> int:
    """The documented FLOP formula written out for this script's two sweeps (independent of flops.py's graph walk).

    Per token and block: F = 8·d² + 4·d·P + 4·d·d_mlp (sequential LN block, d_head·n_heads = d), T = F + 2·d·P
    (the attention core twice), W = F - 4·d·P (the weight products). Value: one forward pass through all L blocks,
    d cotangents back through blocks layer+1..L-1. Key (read blocks.layer.ln2): blocks 0..layer, ⌈d/c⌉ primal passes
    each with W more (the zero weight tangents), d tangents. Plus the one-token width probe (P = 1).
    """
    d, d_mlp, L = cfg.d_model, cfg.d_mlp, cfg.n_layers

    def forward(p: int) -> int:
        return 8 * d * d + 4 * d * p + 4 * d * d_mlp

    F, core = forward(seq_len), 4 * d * seq_len
    T, W = F + core, F - core
    if kind == "value":
        return n_tokens * L * F + d * n_tokens * (L - 1 - layer) * T + L * forward(1)
    blocks = layer + 1
    chunks = math.ceil(d / chunk)  # per minibatch, so n_tokens counts every minibatch
    return chunks * n_tokens * blocks * (F + W) + d * n_tokens * blocks * T + blocks * forward(1)


def jaccard(a, b) -> list[float]:
    return [len(set(x.tolist()) & set(y.tolist())) / len(set(x.tolist()) | set(y.tolist())) for x, y in zip(a, b)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny config and corpus (CI smoke mode)")
    parser.add_argument("--n-seqs", type=int, default=None, help="bf16 throughput corpus (default 512; small 32)")
    parser.add_argument("--n-seqs-fp32", type=int, default=None, help="fp32 / accuracy corpus (default 128; small 8)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per forward pass")
    parser.add_argument("--chunk", type=int, default=256, help="tangents/cotangents per batched pass")
    parser.add_argument("--features", type=int, default=64, help="FF-KV features whose signatures are compared")
    parser.add_argument("--k", type=int, default=20, help="top-k of the compared signatures")
    parser.add_argument("--slice", type=int, default=1, help="sequences recomputed on the CPU for agreement")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip the steps that would start after this many seconds (default 200 on a GPU, none on the CPU)",
    )
    parser.add_argument(
        "--autocast", action="store_true", help="throughput sweeps under bf16 autocast, not a bf16 copy"
    )
    parser.add_argument("--check-flops", action="store_true", help="FlopCounterMode check (default on the CPU)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    check_environment()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("gpu_check")

    import torch

    from tl_query_lens import FFKV, QueryLens, certify
    from tl_query_lens.dictionaries.splice import splice_metrics
    from tl_query_lens.models import copy_model
    from tl_query_lens.operators import key_operators, module_operators, value_operators
    from tl_query_lens.operators.flops import count_flops, peak_tflops
    from tl_query_lens.readout import decompose, fit_readout, token_logit

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("No CUDA device here: run with --device cpu --small for the smoke mode.")
    check_flops = args.check_flops or device.type == "cpu"
    budget = args.budget_s if args.budget_s is not None else (200.0 if device.type == "cuda" else math.inf)
    n_seqs = args.n_seqs or (32 if args.small else 512)
    n_seqs32 = min(args.n_seqs_fp32 or (8 if args.small else 128), n_seqs)
    model = build_model(args.small, args.device)
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.d_vocab, (n_seqs, args.seq_len), generator=gen)
    tokens32 = tokens[:n_seqs32]
    layer = cfg.n_layers // 2
    hook, read = f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.ln2.hook_normalized"
    cache = tempfile.TemporaryDirectory(prefix="gpu_check_")  # operators computed once, reused by the lenses
    engine = {"chunk": args.chunk, "batch_size": args.batch_size, "progress": False, "cache_dir": cache.name}
    bf16 = torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    out: dict = {
        "device": str(device),
        "device_name": name,
        "torch": torch.__version__,
        "fp32_matmul": "tf32" if tf32 else "fp32",
        "small": args.small,
        "shape": {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "d_mlp": cfg.d_mlp, "seq_len": args.seq_len},
        "tokens_bf16": tokens.numel(),
        "tokens_fp32": tokens32.numel(),
        "chunk": args.chunk,
        "batch_size": args.batch_size,
        "layer": layer,
        "budget_s": budget if math.isfinite(budget) else None,
        "startup_s": round(time.monotonic() - START, 2),
        "steps": {},
        "skipped": [],
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    log.info("%s (%s), start-up %.1f s", name, out["fp32_matmul"], out["startup_s"])

    def step(label: str, run, n_tokens: int | None = None, dtype: str | None = None):
        """Run one timed step, or skip it when the budget is spent; sweeps (``dtype`` given) report FLOP/s."""
        elapsed = time.monotonic() - START
        if elapsed > budget:
            out["skipped"].append(label)
            log.info("%-34s SKIPPED (%.0f s elapsed > budget %.0f s)", label, elapsed, budget)
            return None
        sync(device)
        start = time.perf_counter()
        with count_flops() as flops:
            result = run()
        sync(device)
        seconds = time.perf_counter() - start
        figures: dict = {"seconds": round(seconds, 3), "peak_gib": round(peak_memory_gib(device), 3)}
        if n_tokens:
            figures["tokens_per_s"] = round(n_tokens / seconds, 1)
        if dtype is not None:
            achieved = flops.total / seconds / 1e12
            peak = peak_tflops(name, dtype, tf32=tf32) if device.type == "cuda" else None
            figures.update({"tflop": float(f"{flops.total / 1e12:.4g}"), "tflop_per_s": float(f"{achieved:.4g}")})
            figures["peak_tflop_per_s"] = peak
            figures["of_peak"] = round(achieved / peak, 4) if peak else "peak unknown"
        out["steps"][label] = figures
        log.info("%-34s %s", label, figures)
        return result

    # ----- 1. fp32 sweeps (with the FLOP accounting check in the smoke mode) -------------------------------------
    n32 = tokens32.numel()
    runs = {
        "value": lambda **kw: value_operators(model, tokens32, [hook], **{**engine, **kw}),
        "key": lambda **kw: key_operators(model, tokens32, [read], **{**engine, **kw}),
    }
    ops32 = {
        "value": step("value operator fp32 (reverse)", lambda: runs["value"](), n32, "float32"),
        "key": step("key operator fp32 (forward)", lambda: runs["key"](), n32, "float32"),
    }
    if check_flops:
        from torch.utils.flop_counter import FlopCounterMode

        accounting = {}
        for kind in ("value", "key"):
            with FlopCounterMode(display=False) as reference, count_flops() as ours:
                runs[kind](cache_dir=None)
            hand = hand_count(cfg, kind, layer, n32, args.seq_len, args.chunk)
            accounting[kind] = {"counted": ours.total, "hand": hand, "flop_counter_mode": reference.get_total_flops()}
        out["flop_accounting"] = accounting
        log.info("FLOP accounting (counted / hand / FlopCounterMode): %s", accounting)
        bad = {k: v for k, v in accounting.items() if len(set(v.values())) != 1}
        if bad:
            raise SystemExit(f"FLOP accounting disagrees: {bad}")

    # ----- 2. bf16 on the same sequences (a bf16 copy, and autocast on the fp32 model), and its accuracy -------
    variants = {"bf16": {"sweep_dtype": bf16}, "bf16-autocast": {"sweep_dtype": bf16, "sweep_autocast": True}}
    ops16 = {
        (label, kind): step(f"{kind} operator {label} ({how})", lambda k=kind, kw=kw: runs[k](**kw), n32, "bfloat16")
        for label, kw in variants.items()
        for kind, how in (("value", "reverse"), ("key", "forward"))
    }
    ffkv = FFKV.from_model(model, layer, "topk", k=32)
    features = list(range(min(args.features, ffkv.cfg.d_sae)))

    def signatures(**kw):
        lens = QueryLens(model, tokens32, **engine, **kw)  # operators from the cache of the sweeps above
        return (
            lens.value_signatures(ffkv, features, k=args.k, method="full"),
            lens.key_signatures(ffkv, features, k=args.k),
        )

    accuracy: dict = {}
    reference = step("signatures fp32", signatures) if all(v is not None for v in ops32.values()) else None
    for label, kw in variants.items():
        result: dict = {}
        for kind, name_ in (("value", hook), ("key", read)):
            if ops32[kind] is not None and ops16[label, kind] is not None:
                a, b = ops32[kind][name_], ops16[label, kind][name_]
                result[f"{kind} operator rel error (max)"] = float((b - a).abs().max() / a.abs().max())
                result[f"{kind} operator rel error (frobenius)"] = float((b - a).norm() / a.norm())
        have_ops = all(ops16[label, kind] is not None for kind in ("value", "key"))
        sigs = step(f"signatures {label}", lambda kw=kw: signatures(**kw)) if reference and have_ops else None
        if sigs is not None:
            for i, side in enumerate(("value", "key")):
                for end in ("top", "bottom"):
                    j = jaccard(getattr(reference[i], f"{end}_ids"), getattr(sigs[i], f"{end}_ids"))
                    result[f"{side} {end}-{args.k} jaccard (mean, min)"] = [round(sum(j) / len(j), 4), round(min(j), 4)]
        accuracy[label] = result
        log.info("%s vs fp32 on %d tokens: %s", label, n32, result)
    out["bf16_vs_fp32"] = accuracy

    # ----- 3. agreement with the CPU (the issue-28 crash): before the long steps, which a tight budget skips first
    part = tokens[: args.slice]
    no_cache = {**engine, "cache_dir": None}

    def agreement():
        cpu_model = copy_model(model, device="cpu", dtype=torch.float32)  # never copy.deepcopy: see copy_model
        result = {}
        for kind, run in (
            ("value", lambda m, **kw: value_operators(m, part, [hook], **no_cache, **kw)[hook]),
            ("key", lambda m, **kw: key_operators(m, part, [read], **no_cache, **kw)[read]),
        ):
            ref = run(cpu_model)
            for label, kw in (("fp32", {}), *variants.items()):
                ours = run(model, **kw).cpu()
                result[f"{kind} {label}"] = float((ours - ref).abs().max() / ref.abs().max())
        return result

    agree = step("agreement with the CPU", agreement, part.numel())
    if agree is not None:
        out["agreement_rel_max"] = agree
        log.info("agreement with the CPU (max |Δ| / max |ref|, %d sequence(s)): %s", args.slice, agree)
    # ----- 4. bf16 throughput ------------------------------------------------------------------------------------
    n_tok = tokens.numel()
    lens_engine = {**engine, **variants["bf16-autocast" if args.autocast else "bf16"]}
    downstream = range(layer + 1, cfg.n_layers)
    step(
        "value operator bf16 (throughput)",
        lambda: value_operators(model, tokens, [hook], **lens_engine),
        n_tok,
        "bfloat16",
    )
    step(
        "key operator bf16 (throughput)", lambda: key_operators(model, tokens, [read], **lens_engine), n_tok, "bfloat16"
    )
    step(
        "module operators bf16 (throughput)",
        lambda: module_operators(model, tokens, downstream, **lens_engine),
        n_tok,
        "bfloat16",
    )

    # ----- 5. every method on the device --------------------------------------------------------------------------
    features8 = list(range(8))
    lens = QueryLens(model, tokens, **lens_engine)  # operators reused from the cache when step 3 ran
    ran = step(
        "lens operators (cached or bf16)",
        lambda: lens.precompute([ffkv], value_methods=("full", "first_order"), key_methods=("full",)) or True,
    )
    if ran:
        for method in ("full", "first_order"):
            step(f"value signatures ({method})", lambda m=method: lens.value_signatures(ffkv, features8, method=m))
        held = step("key signatures (full)", lambda: lens.key_signatures(ffkv, features8))
        fresh = QueryLens(model, tokens, basis="features", **lens_engine)
        pushed = step(
            "value sigs, feature basis",
            lambda: fresh.value_signatures(ffkv, features8, method="full"),
            n_tok,
            "bfloat16",
        )
        step("key sigs, feature basis", lambda: fresh.key_signatures(ffkv, features8), n_tok, "bfloat16")
        if pushed is not None and held is not None:
            full = lens.value_signatures(ffkv, features8, method="full")
            out["feature_basis_rel_diff"] = float(
                (pushed.directions - full.directions).abs().max() / full.directions.abs().max()
            )
    eval_tokens = tokens[: min(n_seqs, 256)]
    step(
        "FF-KV splice metrics",
        lambda: splice_metrics(model, ffkv, eval_tokens, batch_size=args.batch_size),
        eval_tokens.numel(),
    )
    cal, ev = tokens[:4], tokens[4 : 4 + min(n_seqs - 4, 256)]
    cert = step(
        "certificate",
        lambda: certify(
            model, FFKV.from_model(model, layer), cal, ev, k=32, n_schedule=[len(ev)], batch_size=args.batch_size
        ),
        ev.numel(),
    )
    if cert is not None:
        out["certificate_bound_bits"] = round(cert.bound, 4)
    fit = step(
        "readout fit (50 steps)",
        lambda: fit_readout(
            model,
            tokens[:8],
            width=4 * cfg.d_model,
            k=16,
            steps=50,
            batch_rows=512,
            batch_pairs=128,
            progress=False,
            log_every=50,
        ),
    )
    if fit is not None:
        h = torch.randn(cfg.d_model, generator=gen).to(device)
        step("readout decomposition", lambda: decompose(fit.sae, h, token_logit(0, cfg.d_vocab), model=model))

    out["peak_memory_gib"] = round(peak_memory_gib(device), 3)
    out["wall_s"] = round(time.monotonic() - START, 1)
    log.info(
        "done in %.1f s; peak memory %.3f GiB (%s); skipped: %s",
        out["wall_s"],
        out["peak_memory_gib"],
        "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        out["skipped"] or "nothing",
    )
    cache.cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
