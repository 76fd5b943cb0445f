"""Fit the default (CPU preset) readout SAE on the embedded SmolLM2-135M and cache it for the demo and registry.

Run: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/readout_fit_embedded.py [--max-seconds 900]
Prints the wall time and the final training record; saves the SAE under the user cache (see docs/readout.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from tl_query_lens import load_model
from tl_query_lens.readout.fit import fit_readout
from tl_query_lens.readout.registry import cached_sae_path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--sae-id", default="cpu")
    parser.add_argument("--out", default="results/readout/fit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    model = load_model("smollm2-135m", device="cpu")
    start = time.perf_counter()
    fit = fit_readout(model, max_seconds=args.max_seconds)
    fit.save(args.out)
    seconds = time.perf_counter() - start
    path = cached_sae_path("smollm2-135m", args.sae_id)
    fit.sae.save_model(path)
    print(
        json.dumps(
            {
                "wall_seconds_total": seconds,
                "final": fit.final,
                "last": fit.history[-1] if fit.history else None,
                "saved": str(path),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
