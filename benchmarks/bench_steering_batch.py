"""The paper protocol's output side with equal-length prompts batched against one prompt at a time, in one process.

One dictionary, ``--n-features`` features active on a small evaluation corpus (seeded draw), the sweep's first
``--n-prompts`` neutral prompts. Timed, both ways (``max_rows=1`` is one prompt a pass, the code before batching):
the integer α search (``integer_alphas``, both KL targets) and one target's steering rise (``steering_rise``).
Printed: seconds and ratio of each; how many α agree (the search is deterministic: they should all agree); the mean
top-25 Jaccard of the rise between the two ways (the sampling draws of prompts that share a batch differ, so the
texts and the rise differ by sampling, not by computation); and the seconds of ``rank_percentiles`` against the
double-argsort it replaced on one ``[n_generate, d_vocab]`` block.

    python benchmarks/bench_steering_batch.py                        # layer 12, 13 features, 20 prompts x 20 tokens
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dictionary", default="tlql-saes-smollm2-135m:blocks.12.hook_resid_post")
    parser.add_argument("--n-features", type=int, default=13)
    parser.add_argument("--n-prompts", type=int, default=20)
    parser.add_argument("--n-generate", type=int, default=20)
    parser.add_argument("--kl-targets", default="0.25,0.5")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).parent))
    from table1_sweep import sweep_prompts

    from tl_query_lens import as_key_value, load_corpus, load_model
    from tl_query_lens.hooks import hook_layer
    from tl_query_lens.query_lens.protocols.paper import integer_alphas, steering_rise
    from tl_query_lens.query_lens.steering import rank_percentiles
    from tl_query_lens.sources import load_sources, parse_sources

    model = load_model(args.model, device="cpu")
    source = parse_sources(args.dictionary)
    loaded = load_sources(source, model, [hook_layer(s.sae_id or "") or 0 for s in source])[0]
    view = as_key_value(loaded.sae, model)
    tokens = load_corpus("embedded", model, n_seqs=16, seq_len=32, split="evaluation", seed=0)
    _, cache = model.run_with_cache(tokens, names_filter=view.read_hook)
    active = (view.encode(cache[view.read_hook]) > 0).flatten(0, 1).any(0).nonzero().flatten()
    pick = torch.randperm(len(active), generator=torch.Generator().manual_seed(0))[: args.n_features]
    features = active[pick].sort().values
    prompts = [model.to_tokens(p, prepend_bos=model.cfg.default_prepend_bos)[0] for p in sweep_prompts(args.n_prompts)]
    targets = tuple(float(t) for t in args.kl_targets.split(","))
    print(f"{len(features)} features of {loaded.label}; prompt lengths {sorted(len(p) for p in prompts)}")

    figures: dict[str, float] = {"threads": torch.get_num_threads()}
    alphas = {}
    for way, rows in (("one prompt a pass", 1), ("batched", 128)):
        t = time.perf_counter()
        alphas[way], _ = integer_alphas(model, view, features, prompts, targets, max_rows=rows)
        figures[f"alpha_s[{way}]"] = time.perf_counter() - t
    same = int((alphas["one prompt a pass"] == alphas["batched"]).sum())
    figures["alpha_agree"], figures["alpha_total"] = same, alphas["batched"].numel()
    rises = {}
    for way, rows in (("one prompt a pass", 1), ("batched", 128)):
        t = time.perf_counter()
        rises[way], _ = steering_rise(
            model, view, features, alphas["batched"][0].float(), prompts, n_generate=args.n_generate, max_rows=rows
        )
        figures[f"rise_s[{way}]"] = time.perf_counter() - t
    top = {w: r.topk(25, dim=-1).indices for w, r in rises.items()}
    jac = [
        len(set(a.tolist()) & set(b.tolist())) / len(set(a.tolist()) | set(b.tolist()))
        for a, b in zip(top["one prompt a pass"], top["batched"])
    ]
    figures["rise_top25_jaccard"] = sum(jac) / len(jac)
    block = torch.randn(args.n_generate, model.cfg.d_vocab)
    t = time.perf_counter()
    for _ in range(20):
        old = block.argsort(-1).argsort(-1).float() / (block.shape[-1] - 1)
    figures["ranks_s[double argsort]"] = (time.perf_counter() - t) / 20
    t = time.perf_counter()
    for _ in range(20):
        new = rank_percentiles(block)
    figures["ranks_s[scatter]"] = (time.perf_counter() - t) / 20
    figures["ranks_equal"] = float(torch.equal(old, new))

    for part in ("alpha_s", "rise_s"):
        a, b = figures[f"{part}[one prompt a pass]"], figures[f"{part}[batched]"]
        print(f"{part[:-2]:>6}: one prompt a pass {a:7.1f} s   batched {b:7.1f} s   ratio {a / b:.2f}x")
    print(f"α agree: {same} / {alphas['batched'].numel()}")
    print(f"rise top-25 Jaccard, batched vs one prompt a pass (different draws): {figures['rise_top25_jaccard']:.3f}")
    a, b = figures["ranks_s[double argsort]"], figures["ranks_s[scatter]"]
    print(
        f"rank percentiles of one block: double argsort {a * 1e3:.1f} ms, scatter {b * 1e3:.1f} ms ({a / b:.2f}x), "
        f"equal: {bool(figures['ranks_equal'])}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
