"""Benchmark: the operator engine's sweeps in fp32 vs bf16 (``sweep_dtype``), time and accuracy in one run.

For one FF-KV layer it computes the value operator (reverse sweep) and the key operator (forward sweep) three times:
with the model's fp32 weights, with ``sweep_dtype=torch.bfloat16`` (a bf16 copy of the model) and with
``sweep_autocast=True`` as well (bf16 autocast on the fp32 model); sums are fp32 in all three. It prints:
the time of each sweep and the ratios to fp32, the achieved FLOP/s (operators/flops.py), the relative error of the bf16
operators (max |Δ| / max |fp32| and ‖Δ‖_F / ‖fp32‖_F), and the mean and minimum top-k Jaccard overlap of the value and
key signatures of the same features (the signatures are scored in fp32 from each operator). Run::

    python benchmarks/bench_engine_precision.py                      # a small random Llama-style model (seconds)
    python benchmarks/bench_engine_precision.py --embedded           # the embedded SmolLM2-135M on its own corpus
    python benchmarks/bench_engine_precision.py --device cuda --n-seqs 256 --chunk 256 --batch-size 64

On CPUs without native bf16 matrix units, bf16 is usually SLOWER than fp32 (the products are emulated); the speed-up
this option exists for is on tensor-core GPUs. The accuracy figures hold on any device.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def small_model(device: str):
    """A random 4-layer Llama-style model (RMSNorm, rotary, gated SiLU MLP, GQA), like the embedded model's family."""
    from sae_lens import HookedSAETransformer
    from transformer_lens import HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=4,
        d_model=128,
        d_head=32,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=512,
        n_ctx=128,
        d_vocab=2000,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=32,
        gated_mlp=True,
        final_rms=True,
        seed=0,
        device=device,
    )
    return HookedSAETransformer(cfg).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded", action="store_true", help="the embedded SmolLM2-135M instead of a small model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n-seqs", type=int, default=None, help="corpus sequences (default 16; embedded 4)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layer", type=int, default=None, help="FF-KV layer (default: the middle one)")
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--features", type=int, default=64, help="features whose signatures are compared")
    parser.add_argument("--k", type=int, default=20, help="top-k of the signatures")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    from tl_query_lens import FFKV, QueryLens, load_corpus, load_model
    from tl_query_lens.operators.flops import count_flops
    from tl_query_lens.primitives import row_jaccard

    device = torch.device(args.device)
    if args.embedded:
        model = load_model("smollm2-135m", device=args.device)
        tokens = load_corpus("embedded", model, n_seqs=args.n_seqs or 4, seq_len=args.seq_len, split="train", seed=0)
    else:
        model = small_model(args.device)
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, model.cfg.d_vocab, (args.n_seqs or 16, args.seq_len), generator=gen)
    layer = model.cfg.n_layers // 2 if args.layer is None else args.layer
    ffkv = FFKV.from_model(model, layer, "topk", k=32)
    features = list(range(min(args.features, ffkv.cfg.d_sae)))
    engine = {"chunk": args.chunk, "batch_size": args.batch_size, "progress": False}
    out: dict = {
        "model": "smollm2-135m" if args.embedded else "small random llama-style",
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "tokens": int(tokens.numel()),
        "layer": layer,
        "chunk": args.chunk,
        "batch_size": args.batch_size,
    }
    print(json.dumps(out))

    runs = {}
    variants = (("fp32", None, False), ("bf16", torch.bfloat16, False), ("bf16-autocast", torch.bfloat16, True))
    for label, dtype, autocast in variants:
        lens = QueryLens(model, tokens, sweep_dtype=dtype, sweep_autocast=autocast, **engine)
        figures = {}
        for side, hooks in (
            ("value", {"value_hooks": [f"blocks.{layer}.hook_resid_post"]}),
            ("key", {"key_hooks": [f"blocks.{layer}.ln2.hook_normalized"]}),
        ):
            sync(device)
            start = time.perf_counter()
            with count_flops() as flops:
                lens.precompute(**hooks)
            sync(device)
            seconds = time.perf_counter() - start
            figures[side] = {
                "seconds": round(seconds, 3),
                "gflops": round(flops.total / 1e9, 3),
                "gflop_per_s": round(flops.total / seconds / 1e9, 2),
            }
        value_op = lens.value_operator(f"blocks.{layer}.hook_resid_post")
        key_op = lens.key_operator(f"blocks.{layer}.ln2.hook_normalized")
        sigs = {
            "value": lens.value_signatures(ffkv, features, k=args.k, method="full"),
            "key": lens.key_signatures(ffkv, features, k=args.k),
        }
        runs[label] = {"figures": figures, "ops": {"value": value_op, "key": key_op}, "sigs": sigs}
        print(label, json.dumps(figures))

    ref = runs["fp32"]
    out["fp32"] = ref["figures"]
    for label in ("bf16", "bf16-autocast"):
        low = runs[label]
        result: dict = {"figures": low["figures"]}
        result["time_ratio_fp32_over_this"] = {
            side: round(ref["figures"][side]["seconds"] / low["figures"][side]["seconds"], 3)
            for side in ("value", "key")
        }
        result["operator_rel_error"] = {}
        for side in ("value", "key"):
            a, b = ref["ops"][side], low["ops"][side]
            result["operator_rel_error"][side] = {
                "max": float((b - a).abs().max() / a.abs().max()),
                "frobenius": float((b - a).norm() / a.norm()),
            }
        result["signature_jaccard"] = {}
        for side in ("value", "key"):
            for end in ("top", "bottom"):
                j = row_jaccard(getattr(ref["sigs"][side], f"{end}_ids"), getattr(low["sigs"][side], f"{end}_ids"))
                result["signature_jaccard"][f"{side} {end}-{args.k}"] = {
                    "mean": round(float(j.mean()), 4),
                    "min": round(float(j.min()), 4),
                }
        out[label] = result
    out["n_features"] = len(features)
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
