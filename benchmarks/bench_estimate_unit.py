"""The unit of the demo's step estimates: seconds per token of the run's first forward batch (what ``tlql demo`` now
times, inside its first step) against a plain forward of 4 x 32 corpus tokens after a warm-up pass (the extra batch
the step factors of ``tl_query_lens/demo_progress.py`` were calibrated with, before it was removed).

Prints and optionally writes one JSON record: both rates, their ratio, the settings, wall and CPU seconds, the load
average before and after, and the command.

    python benchmarks/bench_estimate_unit.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path


class _Timed(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each timing (the median is kept)")
    parser.add_argument("--json", default=None, help="also write the record to this JSON file")
    args = parser.parse_args()

    import torch

    from tl_query_lens import demo
    from tl_query_lens.corpus import load_corpus
    from tl_query_lens.estimates import BatchClock
    from tl_query_lens.models import load_model
    from tl_query_lens.paths import relative_command
    from tl_query_lens.tracking import Tracker

    load_before = os.getloadavg()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    model = load_model("smollm2-135m")
    cfg = demo.DemoConfig.quick()
    plain, first = [], []
    for _ in range(args.repeats):
        tokens = load_corpus(cfg.corpus, model, n_seqs=4, seq_len=32, split="train", seed=cfg.seed)
        with torch.no_grad():
            model(tokens[:1])
            t0 = time.perf_counter()
            model(tokens)
            plain.append((time.perf_counter() - t0) / tokens.numel())

        def report(seconds: float, n_tokens: float) -> None:
            raise _Timed(seconds / n_tokens)

        with tempfile.TemporaryDirectory() as tmp, Tracker(Path(tmp), name="bench", use_wandb=False) as tracker:
            cfg.out = Path(tmp)
            try:
                with BatchClock(report).on_forward(model):
                    demo._ffkv_step(model, cfg, tracker)  # stopped as its second forward batch starts
            except _Timed as timed:
                first.append(float(timed.args[0]))
    record = {
        "command": relative_command([sys.executable, *sys.argv]),
        "started_utc": started,
        "settings": {
            "demo": "DemoConfig.quick()",
            "step": "ffkv",
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
        },
        "plain_forward_seconds_per_token": statistics.median(plain),
        "first_batch_seconds_per_token": statistics.median(first),
        "ratio_first_over_plain": statistics.median(first) / statistics.median(plain),
        "runs": {"plain": plain, "first": first},
        "wall_seconds": round(time.perf_counter() - wall0, 1),
        "cpu_seconds": round(time.process_time() - cpu0, 1),
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
