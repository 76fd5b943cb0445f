"""Diagnostics of the cached embedded readout SAE beside the row-geometry baselines (docs/readout.md table).

Run: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/readout_eval_embedded.py [--baselines a,b,...]
Held-out states: the embedded corpus' evaluation split, logit lens at the default hooks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from sae_lens import SAE

from tl_query_lens import load_corpus, load_model
from tl_query_lens.readout import collect_states
from tl_query_lens.readout.config import BASELINE_ORDER
from tl_query_lens.readout.evaluate import evaluate_readout
from tl_query_lens.tracking import Tracker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sae-id", default="cpu")
    parser.add_argument("--n-seqs", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=17)
    parser.add_argument("--baselines", default=",".join(BASELINE_ORDER))
    parser.add_argument("--kmeans-widths", default=None, help="two widths, e.g. 288,576 (default: width/4, width)")
    parser.add_argument("--kmeans-iters", type=int, default=10)
    parser.add_argument("--ridge-k", type=int, default=None, help="centroids per row in k-means + ridge (default k)")
    parser.add_argument("--ablation-states", type=int, default=256)
    parser.add_argument("--out", default="results/readout/eval")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    model = load_model("smollm2-135m", device="cpu")
    sae = SAE.from_pretrained("tlql-readout-smollm2-135m", args.sae_id)
    tokens = load_corpus("embedded", model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation", seed=1)
    states = collect_states(model, tokens)
    widths = tuple(int(w) for w in args.kmeans_widths.split(",")) if args.kmeans_widths else None
    report = evaluate_readout(
        model,
        sae,
        states,
        baselines=[b for b in args.baselines.split(",") if b],
        kmeans_widths=widths,
        kmeans_iters=args.kmeans_iters,
        ridge_k=args.ridge_k,
        ablation_states=args.ablation_states,
    )
    report.save(args.out)
    with Tracker(args.out, name="readout-eval", config=vars(args)) as tracker:
        tracker.log_table("readout_vs_baselines", *report.table())
    cols, rows = report.table()
    ablation = dataclasses.asdict(report.ablation) if report.ablation is not None else None
    print(json.dumps({"hooks": states.hooks, "n_states": len(states), "ablation": ablation}, indent=1))
    print(" | ".join(cols))
    for r in rows:
        print(
            " | ".join(
                f"{v:.3f}" if isinstance(v, float) else (f"[{v[0]:.3f}, {v[1]:.3f}]" if isinstance(v, list) else str(v))
                for v in r
            )
        )


if __name__ == "__main__":
    main()
