"""Two ranks or two threads? Forward-pass throughput of the embedded model on this machine's cores, three ways in
one run: one process with 1 thread (the reference), one process with ``--threads`` threads, and ``--threads``
processes with 1 thread each running at once (what ``torchrun --nproc_per_node`` ranks do, e.g.
``table1_sweep.py --ranks``). Prints each way's throughput as a ratio to the reference, per trial and the median.
It times plain no-grad forward passes only: the engine's JVP / backward sweeps and small-batch generation scale
in their own way, so read it as a guide to the launch choice, not as a cell's speed-up.

    python benchmarks/bench_ranks_vs_threads.py                 # 2 threads vs 2 processes, batch 128 × 22 tokens
    python benchmarks/bench_ranks_vs_threads.py --threads 4 --batch 64 --repeats 5

Run it on an otherwise idle machine: the ratios are only meaningful against the same load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time


def _forwards(threads: int, batch: int, seq_len: int, repeats: int, ready, queue) -> None:
    """Load the model, warm up on the timed shape, wait until every process has (``ready``), then run ``repeats``
    forward passes; put the wall-clock start and end."""
    import torch

    from tl_query_lens import load_model

    torch.set_num_threads(threads)
    model = load_model("smollm2-135m", device="cpu")
    tokens = torch.randint(100, model.cfg.d_vocab, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(tokens)  # warm-up on the shape that is timed
        ready.wait()
        start = time.time()
        for _ in range(repeats):
            model(tokens)
        queue.put((start, time.time()))


def passes_per_second(n_procs: int, threads: int, batch: int, seq_len: int, repeats: int) -> float:
    """Forward passes per second of ``n_procs`` processes started together: all their passes over the span from
    the first start to the last end (so a process that ends early does not count its uncontended tail twice)."""
    ctx = mp.get_context("spawn")
    ready, queue = ctx.Barrier(n_procs), ctx.Queue()
    args = (threads, batch, seq_len, repeats, ready, queue)
    procs = [ctx.Process(target=_forwards, args=args) for _ in range(n_procs)]
    for p in procs:
        p.start()
    spans = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return n_procs * repeats / (max(end for _, end in spans) - min(start for start, _ in spans))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=22)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per process")
    parser.add_argument("--trials", type=int, default=3, help="repetitions of the three ways, interleaved")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # each process sets its own thread count
    shape = (args.batch, args.seq_len, args.repeats)
    threads_label, ranks_label = f"1 process, {args.threads} threads", f"{args.threads} processes, 1 thread each"
    trials: list[dict[str, float]] = []
    for _ in range(args.trials):  # the three ways interleaved, so a drift in the machine's load hits all of them
        reference = passes_per_second(1, 1, *shape)
        trials.append(
            {
                "1 thread, passes/s": reference,
                threads_label: passes_per_second(1, args.threads, *shape) / reference,
                ranks_label: passes_per_second(args.threads, 1, *shape) / reference,
            }
        )
    result = {
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "throughput_vs_1_thread_median": {
            k: statistics.median(t[k] for t in trials) for k in (threads_label, ranks_label)
        },
        "trials": trials,
    }
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
