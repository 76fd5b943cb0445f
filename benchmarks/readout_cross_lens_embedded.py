"""Cross-lens check on the embedded model: Jacobian lenses fitted on two corpora, same frozen states (docs/design.md §6).

Corpus A: the embedded corpus (stdlib docstrings, train split). Corpus B: a different local text, the license texts
in /usr/share/common-licenses (legal prose), train split. Frozen states: the embedded evaluation split.
Run: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/readout_cross_lens_embedded.py
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
from sae_lens import SAE

from tl_query_lens import load_corpus, load_model
from tl_query_lens.operators import value_operators
from tl_query_lens.readout.cross_lens import cross_lens_check
from tl_query_lens.results import write_json


def license_documents(root: str = "/usr/share/common-licenses") -> list[str]:
    docs = []
    for path in sorted(Path(root).glob("*")):
        if path.is_file() and not path.is_symlink():
            docs.extend(p.strip() for p in path.read_text(errors="ignore").split("\n\n") if len(p.strip()) > 200)
    return docs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="20,25")
    parser.add_argument("--fit-seqs", type=int, default=4)
    parser.add_argument("--eval-seqs", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--operator-cache", default=None, help="folder to cache/reuse the value operators")
    parser.add_argument("--out", default="results/readout/cross_lens")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    model = load_model("smollm2-135m", device="cpu")
    sae = SAE.from_pretrained("tlql-readout-smollm2-135m", "cpu")
    hooks = [f"blocks.{int(x)}.hook_resid_post" for x in args.layers.split(",")]
    corpus_a = load_corpus("embedded", model, n_seqs=args.fit_seqs, seq_len=args.seq_len, split="train", seed=0)
    corpus_b = load_corpus(
        license_documents(), model, n_seqs=args.fit_seqs, seq_len=args.seq_len, split="train", seed=0
    )
    cache = Path(args.operator_cache) if args.operator_cache else None
    ops_a = value_operators(model, corpus_a, hooks, skip_positions=1, cache_dir=cache and cache / "a")
    ops_b = value_operators(model, corpus_b, hooks, skip_positions=1, cache_dir=cache and cache / "b")
    frozen = load_corpus("embedded", model, n_seqs=args.eval_seqs, seq_len=args.seq_len, split="evaluation", seed=2)
    with torch.no_grad():
        _, cache = model.run_with_cache(frozen, names_filter=hooks)
    summary = {}
    for hook in hooks:
        resid = cache[hook][:, 1:].reshape(-1, model.cfg.d_model)
        seq = torch.arange(frozen.shape[0]).repeat_interleave(frozen.shape[1] - 1)
        res = cross_lens_check(model, sae, resid, ops_a[hook], ops_b[hook], sequence=seq, hook=hook)
        res.save(Path(args.out) / hook)
        summary[hook] = {
            k: getattr(res, k)
            for k in (
                "n_states",
                "token_disagreement",
                "feature_agreement",
                "feature_agreement_ci",
                "null_shuffled",
                "null_random_token",
                "agreement_when_tokens_differ",
            )
        }
        diff = (res.tokens_a != res.tokens_b).nonzero().squeeze(-1)[:5].tolist()
        summary[hook]["examples"] = [
            {
                "lens_a": model.to_string([int(res.tokens_a[j])]),
                "lens_b": model.to_string([int(res.tokens_b[j])]),
                "feature_a": int(res.dominant_a[j]),
                "feature_b": int(res.dominant_b[j]),
            }
            for j in diff
        ]
    write_json(Path(args.out) / "summary.json", summary)
    print(json.dumps(summary, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
