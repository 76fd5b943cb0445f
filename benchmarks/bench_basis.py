"""Benchmark: the engine's feature basis vs the full operator for a handful of features, on the same corpus.

Query Lens signatures (value "full" by default; ``--side key`` for keys) of ``--features`` seeded FF-KV features of
one layer of the embedded SmolLM2-135M, computed twice in one process on the same corpus: once with
``basis="features"`` (n tangents pushed forward / n cotangents pulled back) and once with ``basis="identity"`` (the
full d × d operator, d = 576 passes). Prints both wall times, their ratio and the largest relative difference of the
resulting directions. Run::

    OMP_NUM_THREADS=1 python benchmarks/bench_basis.py --n-seqs 64 --seq-len 32 --layer 26
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-seqs", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layer", type=int, default=18)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--side", choices=["value", "key"], default="value")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from tl_query_lens import FFKV, QueryLens, load_corpus, load_model

    model = load_model("smollm2-135m", device="cpu")
    tokens = load_corpus("embedded", model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="train", seed=args.seed)
    sae = FFKV.from_model(model, args.layer)
    gen = torch.Generator().manual_seed(args.seed)
    features = torch.randperm(sae.cfg.d_sae, generator=gen)[: args.features].tolist()
    out = {
        "tokens": tokens.numel(),
        "layer": args.layer,
        "side": args.side,
        "features": features,
        "threads": torch.get_num_threads(),
    }
    directions = {}
    for basis in ("features", "identity"):
        lens = QueryLens(model, tokens, basis=basis, chunk=args.chunk, batch_size=args.batch_size, progress=False)
        start = time.perf_counter()
        if args.side == "value":
            sig = lens.value_signatures(sae, features, method="full")
        else:
            sig = lens.key_signatures(sae, features, method="full")
        out[f"{basis}_s"] = round(time.perf_counter() - start, 2)
        directions[basis] = sig.directions
        print(f"basis={basis}: {out[f'{basis}_s']} s", flush=True)
    diff = (directions["features"] - directions["identity"]).abs().max() / directions["identity"].abs().max()
    out["max_rel_diff"] = float(diff)
    out["ratio_identity_over_features"] = round(out["identity_s"] / out["features_s"], 2)
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
