"""Build an atlas and report its time per stage, features per minute and size (raw and gzip) per feature.

    OMP_NUM_THREADS=2 python benchmarks/bench_atlas.py --quick --out results/atlas-quick
    python benchmarks/bench_atlas.py --out results/atlas-full                      # the default atlas (long)
    python benchmarks/bench_atlas.py --dictionary tlql-saes-smollm2-135m:blocks.12.transcoder --out results/atlas-tc

The output folder is emptied first unless --resume is given.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time

from tl_query_lens import load_model
from tl_query_lens.atlas import AtlasConfig, build_atlas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dictionary", default=None, help="comma-separated specs (default: the config's)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if not args.resume:
        shutil.rmtree(args.out, ignore_errors=True)
    given = {"out": args.out}
    if args.dictionary:
        given["dictionary"] = tuple(args.dictionary.split(","))
    cfg = AtlasConfig.preset_quick(**given) if args.quick else AtlasConfig(**given)
    start = time.perf_counter()
    model = load_model("smollm2-135m", device="cpu")
    load = time.perf_counter() - start
    result = build_atlas(model, None, cfg, progress=False)
    total = time.perf_counter() - start
    n = result.n_features
    figures = {
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "load_model_s": round(load, 1),
        "build_s": round(result.seconds["total"], 1),
        "stages_s": {k: round(v, 1) for k, v in result.seconds.items()},
        "total_s": round(total, 1),
        "features": n,
        "features_per_minute": round(n / (result.seconds["total"] / 60), 1),
        "data_bytes": result.bytes_total,
        "data_bytes_gzip": result.bytes_gzip,
        "bytes_per_feature_gzip": round(result.bytes_gzip / n, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
