"""What the demo's atlas costs: ``build_atlas`` on one FF-KV layer of the embedded model with the demo's operator
corpus, for a feature subset (what the demo built before) or every feature, with or without signatures.

Prints and optionally writes one JSON record: settings, wall and CPU seconds of the build, its stages, the load
average before and after, and the command. The operators go to a fresh folder, as on a first run.

    python benchmarks/bench_demo_atlas.py [--layer 24] [--features all|1,5,9] [--n-tokens 4096]
        [--operator-seqs 1] [--seq-len 12] [--no-signatures] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=24, help="FF-KV layer (the quick demo's: 24)")
    parser.add_argument("--features", default="all", help="'all' or feature ids, e.g. '1,5,9,77'")
    parser.add_argument("--n-tokens", type=int, default=4096, help="corpus tokens of the pass (quick demo: 4096)")
    parser.add_argument("--operator-seqs", type=int, default=1, help="operator corpus windows (quick demo: 1)")
    parser.add_argument("--seq-len", type=int, default=12, help="operator corpus window length (quick demo: 12)")
    parser.add_argument("--no-signatures", action="store_true", help="contexts and statistics only")
    parser.add_argument("--json", default=None, help="also write the record to this JSON file")
    args = parser.parse_args()

    from tl_query_lens.atlas import AtlasConfig, build_atlas
    from tl_query_lens.corpus import load_corpus
    from tl_query_lens.models import load_model
    from tl_query_lens.query_lens.lens import QueryLens

    load_before = os.getloadavg()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    model = load_model("smollm2-135m")
    with tempfile.TemporaryDirectory() as tmp:
        tokens = load_corpus("embedded", model, n_seqs=args.operator_seqs, seq_len=args.seq_len, split="train", seed=0)
        lens = QueryLens(model, tokens, cache_dir=Path(tmp) / "operators", progress=False)
        cfg = AtlasConfig(
            out=Path(tmp) / "atlas",
            features=None if args.features == "all" else args.features,
            n_tokens=args.n_tokens,
            signatures=not args.no_signatures,
        )
        wall, cpu = time.perf_counter(), time.process_time()
        result = build_atlas(model, [f"ffkv:{args.layer}"], cfg, lens=lens, progress=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    record = {
        "command": "python " + " ".join(["benchmarks/bench_demo_atlas.py", *sys.argv[1:]]),
        "started_utc": started,
        "settings": vars(args),
        "n_features": result.n_features,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "stages_wall_seconds": {k: round(v, 1) for k, v in result.seconds.items()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
