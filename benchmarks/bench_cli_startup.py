"""How fast ``tlql`` answers before any work: ``--help``, each subcommand's ``--help``, an unknown option and an
out-of-range number for every subcommand.

Each case runs ``python -m tl_query_lens ...`` in a fresh interpreter (``--repeat`` times); the script prints the wall
time and the CPU time of the child (user + system, less sensitive to other load; medians of the repeats), its peak
resident memory (``ru_maxrss``, from ``os.wait4``) and its exit status. The parsers are made from torch-free configs
each time (there is no parser cache), so every run is what the first run after an install costs; ``TLQL_CACHE``
points to a fresh folder.

    python benchmarks/bench_cli_startup.py [--repeat 3] [--only TEXT] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ["ffkv", "query-lens", "ql-evaluate", "ql-channels", "readout", "readout fit", "readout decompose",
               "readout eval", "certify", "saes", "saes train", "saes report", "saes compare", "reproduce", "atlas",
               "demo"]  # fmt: skip
# One out-of-range number per subcommand (refused from the options' ranges, before any config is imported).
OUT_OF_RANGE = {"ffkv": "--k 0", "query-lens": "--k 0", "ql-evaluate": "--k 0", "ql-channels": "--epochs -1",
                "readout fit": "--k 0", "readout decompose": "--top 0 text", "readout eval": "--n-boot 0",
                "certify": "--bins 0", "saes train": "--d-sae 0", "saes report": "--batch-size 0",
                "saes compare": "--batch-size 0", "reproduce": "--size huge", "atlas": "--k-tokens 0",
                "demo": "--k 0"}  # fmt: skip
CASES = {
    "tlql --help": ["--help"],
    "tlql (no command)": [],
    "tlql nonsense (argument error)": ["nonsense"],
    "tlql ffkv --k many (argument error)": ["ffkv", "--k", "many"],
    **{f"tlql {name} --help": [*name.split(), "--help"] for name in SUBCOMMANDS},
    **{f"tlql {name} --no-such-option": [*name.split(), "--no-such-option"] for name in OUT_OF_RANGE},
    **{f"tlql {name} {bad}": [*name.split(), *bad.split()] for name, bad in OUT_OF_RANGE.items()},
}


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS in MiB, exit status, CPU seconds) of ``python -m tl_query_lens args``."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tl_query_lens", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    return seconds, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the median is reported)")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TLQL_CACHE": tempfile.mkdtemp(prefix="tlql-bench-")}
    results = []
    load_start = list(os.getloadavg())
    print(f"{'case':48} {'seconds':>8} {'CPU s':>6} {'peak MiB':>9} {'exit':>5}")
    for name, argv in CASES.items():
        if args.only not in name:
            continue
        runs = [run_once(argv, env) for _ in range(args.repeat)]
        row = {"case": name, "seconds": statistics.median(r[0] for r in runs),
               "cpu_seconds": statistics.median(r[3] for r in runs),
               "peak_rss_mib": max(r[1] for r in runs), "exit": runs[-1][2]}  # fmt: skip
        results.append(row)
        print(f"{name:48} {row['seconds']:8.2f} {row['cpu_seconds']:6.2f} {row['peak_rss_mib']:9.0f} {row['exit']:5d}",
              flush=True)  # fmt: skip
    if args.json:
        sys.path.insert(0, str(ROOT))
        from tl_query_lens.paths import relative_command

        record = {
            "command": relative_command([sys.executable, *sys.argv]),
            "settings": {"repeat": args.repeat, "only": args.only},
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_start": load_start,
            "loadavg_end": list(os.getloadavg()),
            "cpu_count": os.cpu_count(),
            "results": results,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
