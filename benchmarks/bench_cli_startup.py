"""How fast ``tlql`` answers before any work: ``--help``, each subcommand's ``--help`` and an argument error.

Each case runs ``python -m tl_query_lens ...`` in a fresh interpreter (``--repeat`` times); the script prints the wall
time (median of the repeats) and the peak resident memory of the child (``ru_maxrss``, from ``os.wait4``).

    python benchmarks/bench_cli_startup.py [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ["ffkv", "query-lens", "ql-evaluate", "ql-channels", "readout", "readout fit", "readout decompose",
               "readout eval", "certify", "saes", "saes train", "saes report", "saes compare", "demo"]  # fmt: skip
CASES = {
    "tlql --help": ["--help"],
    "tlql (no command)": [],
    "tlql nonsense (argument error)": ["nonsense"],
    "tlql ffkv --k many (argument error)": ["ffkv", "--k", "many"],
    **{f"tlql {name} --help": [*name.split(), "--help"] for name in SUBCOMMANDS},
}


def run_once(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in MiB, exit status) of ``python -m tl_query_lens args``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tl_query_lens", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    return seconds, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the median is reported)")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    results = []
    print(f"{'case':48} {'seconds':>8} {'peak MiB':>9} {'exit':>5}")
    for name, argv in CASES.items():
        if args.only not in name:
            continue
        runs = [run_once(argv) for _ in range(args.repeat)]
        row = {"case": name, "seconds": statistics.median(r[0] for r in runs),
               "peak_rss_mib": max(r[1] for r in runs), "exit": runs[-1][2]}  # fmt: skip
        results.append(row)
        print(f"{name:48} {row['seconds']:8.2f} {row['peak_rss_mib']:9.0f} {row['exit']:5d}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
