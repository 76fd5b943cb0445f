"""Benchmark: per-feature Query Lens reference vs the operator engine, on the embedded SmolLM2-135M.

Prints, for one corpus in one process: the reference's per-feature cost (timed on a seeded sample of FF-KV features
drawn uniformly over layers, then scaled LINEARLY to every FF-KV feature of every layer), the engine's cost for key +
value signatures of every FF-KV feature of every layer (operators + scoring + top/bottom-k), their ratio, and the peak
resident memory. Run::

    OMP_NUM_THREADS=1 python benchmarks/bench_query_lens.py --n-seqs 2 --seq-len 16 --sample 6
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--sample", type=int, default=6, help="reference features timed per side")
    parser.add_argument("--chunk", type=int, default=64, help="engine cotangents/tangents per batched pass")
    parser.add_argument("--layers", type=int, default=None, help="only the first N layers (quick runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    from tl_query_lens import FFKV, QueryLens, load_corpus, load_model, query_lens_reference
    from tl_query_lens.query_lens.reference import clean_stream

    model = load_model("smollm2-135m", device="cpu")
    tokens = load_corpus("embedded", model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="train", seed=args.seed)
    n_layers = args.layers or model.cfg.n_layers
    d_mlp = model.cfg.d_mlp
    n_features = n_layers * d_mlp
    print(
        f"model smollm2-135m, corpus {tuple(tokens.shape)} = {tokens.numel()} tokens, torch threads "
        f"{torch.get_num_threads()}, layers 0..{n_layers - 1}, {n_features} FF-KV features"
    )
    rss_model = peak_rss_mib()

    # ----- reference: seeded sample of (layer, feature), timed per side ---------------------------------------------
    gen = torch.Generator().manual_seed(args.seed)
    layers = torch.randint(0, n_layers, (args.sample,), generator=gen).tolist()
    features = torch.randint(0, d_mlp, (args.sample,), generator=gen).tolist()
    with torch.no_grad():
        stream = clean_stream(model, tokens)  # the clean residuals are computed once, not charged per feature
    per_side = {}
    for side in ("value", "key"):
        times = []
        for layer, feature in zip(layers, features):
            sae = FFKV.from_model(model, layer)
            start = time.perf_counter()
            query_lens_reference(model, tokens, sae, feature, side, clean=stream)
            times.append(time.perf_counter() - start)
        per_side[side] = sum(times) / len(times)
        print(
            f"reference {side:5s}: {per_side[side]:.3f} s/feature (mean of {len(times)} timed features, layers "
            f"{sorted(layers)})"
        )
    reference_total = (per_side["value"] + per_side["key"]) * n_features
    print(
        f"reference key+value, all {n_features} features: {reference_total:.0f} s "
        f"(= {per_side['value'] + per_side['key']:.3f} s/feature × {n_features}, SCALED LINEARLY from the sample)"
    )

    # ----- engine: operators for every layer in one sweep per side, then every feature scored ------------------------
    start = time.perf_counter()
    lens = QueryLens(model, tokens, chunk=args.chunk, progress=False)
    lens.precompute(
        value_hooks=[f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)],
        key_hooks=[f"blocks.{layer}.ln2.hook_normalized" for layer in range(n_layers)],
    )
    operators_s = time.perf_counter() - start
    top_tokens = {}
    for layer in range(n_layers):
        sae = FFKV.from_model(model, layer)
        value = lens.value_signatures(sae, k=25, method="full")
        key = lens.key_signatures(sae, k=25, method="full")
        top_tokens[layer] = (value.top_ids[:, 0], key.top_ids[:, 0])
    engine_total = time.perf_counter() - start
    print(
        f"engine key+value, all {n_features} features: {engine_total:.0f} s measured "
        f"(operators {operators_s:.0f} s, scoring + top/bottom-25 {engine_total - operators_s:.0f} s)"
    )
    ratio = reference_total / engine_total
    print(f"speed-up reference/engine: {ratio:.1f}x (target >= 20x)")
    rss = peak_rss_mib()
    print(f"peak RSS: {rss:.0f} MiB (after model load {rss_model:.0f} MiB; ru_maxrss of the whole process)")
    figures = {
        "tokens": list(tokens.shape),
        "threads": torch.get_num_threads(),
        "n_layers": n_layers,
        "n_features": n_features,
        "reference_s_per_feature": per_side,
        "reference_sample": args.sample,
        "reference_total_s_scaled": reference_total,
        "engine_operators_s": operators_s,
        "engine_total_s": engine_total,
        "ratio": ratio,
        "peak_rss_mib": rss,
        "model_rss_mib": rss_model,
        "chunk": args.chunk,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return figures


if __name__ == "__main__":
    main()
