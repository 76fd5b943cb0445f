"""Table-1 input scores of key signatures as the operator corpus grows (docs/query_lens_evaluation.md §2b).

The Table-1 run used key operators averaged over 2 × 32 train-split tokens; the paper used ~32k. This script keeps
everything else of that run fixed (the same 52 FF-KV features of layers 6/12/18/24, the same 128 × 32 evaluation
windows, N = 20 max-activating contexts, k = 25) and recomputes LL_KEY and QL_KEY input scores with key operators from
larger train-split corpora, so the effect of the operator budget on the input score is measured, not guessed.

    PYTHONPATH=$PWD python docs/scripts/key_input_vs_operator_corpus.py --op-seqs 2,16 --out results/ql_key_corpus
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tl_query_lens import FFKV, load_corpus, load_model
from tl_query_lens.primitives import bootstrap_indices, mean_ci
from tl_query_lens.query_lens import QueryLens
from tl_query_lens.query_lens.max_activating import input_scores, max_activating_contexts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="6,12,18,24")
    parser.add_argument("--features-per-layer", type=int, default=13)
    parser.add_argument("--op-seqs", default="2,16", help="operator corpus sizes (sequences of 32 train tokens)")
    parser.add_argument("--n-seqs", type=int, default=128, help="evaluation windows for max-activating contexts")
    parser.add_argument("--out", default="results/ql_key_corpus")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model("smollm2-135m")
    layers = [int(x) for x in args.layers.split(",")]
    ev_tokens = load_corpus("embedded", model, n_seqs=args.n_seqs, seq_len=32, split="evaluation", seed=0)
    saes = {layer: FFKV.from_model(model, layer) for layer in layers}
    gen = torch.Generator().manual_seed(0)  # the feature sample of `tlql ql-evaluate` (seed 0, layers in order)
    features = {
        layer: torch.randperm(saes[layer].cfg.d_sae, generator=gen)[: args.features_per_layer].sort().values
        for layer in layers
    }
    contexts = {layer: max_activating_contexts(model, saes[layer], ev_tokens, n_contexts=20) for layer in layers}
    results: dict = {"features": {str(k): v.tolist() for k, v in features.items()}, "runs": {}}
    per_feature = {}
    for n_op in [int(x) for x in args.op_seqs.split(",")]:
        op_tokens = load_corpus("embedded", model, n_seqs=n_op, seq_len=32, split="train", seed=0)
        lens = QueryLens(model, op_tokens, cache_dir=out / "operators")
        start = time.perf_counter()
        lens.precompute(list(saes.values()), value_methods=(), key_methods=("full",))  # key operators only
        seconds = time.perf_counter() - start
        for method, name in (("logit_lens", "LL_KEY"), ("full", "QL_KEY")):
            if name == "LL_KEY" and "LL_KEY" in per_feature:
                continue  # E·k does not depend on the operator corpus
            scores = []
            for layer in layers:
                sig = lens.key_signatures(saes[layer], features[layer], k=25, method=method)
                top = contexts[layer].token[features[layer]]
                scores.append(input_scores(model.tokenizer, top, sig.top_ids))
            label = name if name == "LL_KEY" else f"QL_KEY ({n_op}×32 operator tokens)"
            per_feature[label] = torch.cat(scores)
            ci = mean_ci("input", per_feature[label], bootstrap_indices(per_feature[label].numel()))
            mean, lo, hi = ci["input"], ci["input_lo"], ci["input_hi"]
            results["runs"][label] = {
                "input_pct": mean,
                "ci": [lo, hi],
                "operator_seconds": seconds,
                "per_layer_pct": {str(layer): 100 * s.mean().item() for layer, s in zip(layers, scores)},
            }
            print(
                f"{label:40s} input {mean:5.2f} % [{lo:.2f}, {hi:.2f}]  per layer "
                + " ".join(f"{100 * s.mean().item():.1f}" for s in scores)
                + f"   (operators {seconds:.0f} s)"
            )
        (out / "key_input_scores.json").write_text(json.dumps(results, indent=1))
    torch.save(per_feature, out / "per_feature_input_scores.pt")


if __name__ == "__main__":
    main()
