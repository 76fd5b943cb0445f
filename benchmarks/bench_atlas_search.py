"""Search time in Chromium at the full atlas' scale: an atlas's search index replicated to N features, then queries
timed in the page (``ATLAS.runSearch``), plus the time to load index.html with that index.

    python benchmarks/bench_atlas_search.py results/atlas-quick --features 85000 --queries ' the,def,return,ing,Paris'

The replicated index keeps the real atlas's token keys and posting lists and repeats them for as many dictionaries
as it takes to reach ``--features``: the number of postings grows with the features, the number of distinct keys
does not (a real 85k-feature atlas has more distinct keys, each with shorter lists).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("atlas")
    parser.add_argument("--features", type=int, default=85_000)
    parser.add_argument("--queries", default=" the,def,return,ing,Paris,x")
    args = parser.parse_args()
    src = Path(args.atlas)
    text = (src / "data" / "search.js").read_text()
    data = json.loads(text[len("ATLAS.search(") : text.rindex(")")])
    n_real = sum(1 for refs in data["refs"] for _ in refs[::3])
    per_dict = max(1, len({(refs[i], refs[i + 1]) for refs in data["refs"] for i in range(0, len(refs), 3)}))
    copies = max(1, args.features // per_dict)
    dicts = [f"{d}-copy{c}" for c in range(copies) for d in data["dicts"]]
    refs = []
    for r in data["refs"]:
        out = []
        for c in range(copies):
            for i in range(0, len(r), 3):
                out += [r[i] + c * len(data["dicts"]), r[i + 1], r[i + 2]]
        refs.append(out)
    work = Path(tempfile.mkdtemp())
    shutil.copytree(
        src, work / "atlas", ignore=shutil.ignore_patterns("exports", "shards", "meta", "operators", "result")
    )
    payload = json.dumps({"dicts": dicts, "keys": data["keys"], "refs": refs}, separators=(",", ":"))
    (work / "atlas" / "data" / "search.js").write_text(f"ATLAS.search({payload});\n")
    options = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu"):
        options.add_argument(a)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    start = time.perf_counter()
    driver.get((work / "atlas" / "index.html").as_uri())
    load = time.perf_counter() - start
    results = {}
    for q in args.queries.split(","):
        times = driver.execute_script(
            "var out=[]; for (var i=0;i<5;i++){var t=performance.now(); ATLAS.runSearch(arguments[0]);"
            " out.push(performance.now()-t);} return out;",
            q,
        )
        results[q] = round(statistics.median(times), 2)
    driver.quit()
    figures = {
        "features": copies * per_dict,
        "postings": n_real * copies,
        "keys": len(data["keys"]),
        "search_js_bytes": len(payload),
        "page_load_s": round(load, 2),
        "median_query_ms": results,
    }
    print(json.dumps(figures, indent=1))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
