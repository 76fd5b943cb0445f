"""Table 1 with bf16 autocast of the protocol's model passes against fp32, in one process (``Table1Config.autocast``).

Per dictionary, the fp32 run selects the features (active in ≥ 20 windows, seeded) and the bf16 run scores the same
ones, with the same operators (computed once, by the fp32 run, and read from the cache by the other), prompts and
seed. Printed: the seconds of the passes autocast changes (everything but the operators: max-activating search,
generation, α search, steering, baselines) in each run and their ratio; per dictionary, the Jaccard of the scored
features' max-activating contexts ((sequence, position) sets) and of the features eligible for the draw (active in
≥ 20 windows; a bf16 run left to select would draw from its own set); per method, the mean input and output score
of each run and how many features' scores changed.

    python benchmarks/bench_table1_precision.py                          # layers 12/24 x 6 features (quick sizes)
    python benchmarks/bench_table1_precision.py --layers 6,12,18,24 --features-per-layer 13 --n-seqs 128 \\
        --n-prompts 2 --n-generate 10 --json table1_precision.json       # the Table-1 base cell's sizes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch


def context_jaccard(a, b, features: torch.Tensor) -> float:
    """Mean over ``features`` of |A ∩ B| / |A ∪ B| of the (sequence, position) sets of their top contexts."""
    scores = []
    for f in features.tolist():
        sa = set(zip(a.seq[f].tolist(), a.pos[f].tolist()))
        sb = set(zip(b.seq[f].tolist(), b.pos[f].tolist()))
        scores.append(len(sa & sb) / max(1, len(sa | sb)))
    return sum(scores) / max(1, len(scores))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="12,24")
    parser.add_argument("--features-per-layer", type=int, default=6)
    parser.add_argument("--n-seqs", type=int, default=48, help="evaluation windows of 32 tokens (max-activating)")
    parser.add_argument("--op-seqs", type=int, default=2, help="operator windows of 32 tokens")
    parser.add_argument("--n-prompts", type=int, default=1)
    parser.add_argument("--n-generate", type=int, default=5)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.operators.config import EngineConfig
    from tl_query_lens.precision import model_passes
    from tl_query_lens.query_lens.config import NEUTRAL_PROMPTS, Table1Config
    from tl_query_lens.query_lens.evaluation import SignatureEvaluation
    from tl_query_lens.query_lens.max_activating import max_activating_contexts
    from tl_query_lens.query_lens.table1 import evaluate_table1
    from tl_query_lens.sources import load_sources, parse_sources

    model = load_model("smollm2-135m")
    layers = [int(x) for x in args.layers.split(",")]
    spec = ",".join(f"tlql-saes-smollm2-135m:blocks.{layer}.hook_resid_post" for layer in layers)
    dictionaries = {d.label: d.sae for d in load_sources(parse_sources(spec), model, layers)}
    ev = load_corpus("embedded", model, n_seqs=args.n_seqs, seq_len=32, split="evaluation")
    op = load_corpus("embedded", model, n_seqs=args.op_seqs, seq_len=32, split="train")
    runs: dict[str, list] = {"fp32": [], "bf16-autocast": []}
    figures: dict[str, Any] = {"sizes": vars(args), "dictionaries": {}, "methods": {}}
    with tempfile.TemporaryDirectory() as cache:
        for label, sae in dictionaries.items():
            features: tuple[int, ...] | None = None  # fp32 selects; the bf16 run scores the same features
            for name, autocast in (("fp32", False), ("bf16-autocast", True)):
                cfg = Table1Config(
                    protocol="paper",
                    features_per_layer=args.features_per_layer,
                    features=features,
                    exclude_first_positions=1,
                    prompts=tuple(NEUTRAL_PROMPTS[: args.n_prompts]),
                    n_generate=args.n_generate,
                    engine=EngineConfig(cache_dir=cache),
                    autocast=autocast,
                )
                runs[name].append(evaluate_table1(model, {label: sae}, op, ev, cfg=cfg))
                features = tuple(runs[name][-1].features.tolist())
            ctx_a = max_activating_contexts(model, sae, ev, n_contexts=20, exclude_first_positions=1)
            with model_passes(model, True):
                ctx_b = max_activating_contexts(model, sae, ev, n_contexts=20, exclude_first_positions=1)
            active_a = set((ctx_a.n_active >= 20).nonzero()[:, 0].tolist())
            active_b = set((ctx_b.n_active >= 20).nonzero()[:, 0].tolist())
            figures["dictionaries"][label] = {
                "features": list(features),
                "context_jaccard": context_jaccard(ctx_a, ctx_b, torch.tensor(features)),
                "eligible_fp32": len(active_a),
                "eligible_bf16": len(active_b),
                "eligible_jaccard": len(active_a & active_b) / max(1, len(active_a | active_b)),
            }
    seconds = {k: [r.config["seconds"] for r in v] for k, v in runs.items()}
    passes = {k: sum(s["total_s"] - s["operators_s"] for s in v) for k, v in seconds.items()}
    figures |= {"seconds": seconds, "passes_s": passes, "speedup_passes": passes["fp32"] / passes["bf16-autocast"]}
    a = SignatureEvaluation.concat(runs["fp32"])
    b = SignatureEvaluation.concat(runs["bf16-autocast"])
    for i, method in enumerate(a.methods):
        j = b.methods.index(method)
        ia, ib = a.input_scores[i].double(), b.input_scores[j].double()
        oa, ob = a.output_scores[i, 0].double(), b.output_scores[j, 0].double()
        figures["methods"][method] = {
            "input_fp32": ia.mean().item() * 100,
            "input_bf16": ib.mean().item() * 100,
            "output_fp32": oa.mean().item() * 100,
            "output_bf16": ob.mean().item() * 100,
            "max_abs_input_diff": (ia - ib).abs().max().item() * 100,
            "max_abs_output_diff": (oa - ob).abs().max().item() * 100,
            "features_input_changed": int((ia != ib).sum()),
            "features_output_changed": int((oa != ob).sum()),
        }
    if args.json:  # first, so a printing error loses nothing
        Path(args.json).write_text(json.dumps(figures, indent=1))
    print(f"passes (all but the operators): fp32 {passes['fp32']:.1f} s, bf16 autocast {passes['bf16-autocast']:.1f} s")
    print(f"ratio fp32 / bf16: {figures['speedup_passes']:.2f}x")
    for label, d in figures["dictionaries"].items():
        print(
            f"{label}: context Jaccard {d['context_jaccard']:.3f} on the scored features; features active in "
            f">= 20 windows: {d['eligible_fp32']} fp32, {d['eligible_bf16']} bf16, Jaccard {d['eligible_jaccard']:.3f}"
        )
    n = a.features.numel()
    print(f"| method | input fp32 | input bf16 | output fp32 | output bf16 | features changed in / out (of {n}) |")
    print("|---|---|---|---|---|---|")
    for method, m in figures["methods"].items():
        print(
            f"| {method} | {m['input_fp32']:.2f} | {m['input_bf16']:.2f} | {m['output_fp32']:.2f} | "
            f"{m['output_bf16']:.2f} | {m['features_input_changed']} / {m['features_output_changed']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
