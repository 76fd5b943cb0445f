"""Markdown tables and a small plots page (plotly.js from CDN) for docs/certification.md from a `tlql certify` folder.

PYTHONPATH=$PWD python docs/certification_tables.py results/certify_sweep docs/certification_plots.html
"""

import csv
import json
import sys
from pathlib import Path

from tl_query_lens.certify import Certificate
from tl_query_lens.certify.plots import bound_vs_n_figure, gap_distribution_figure


def main(folder: str, html_out: str) -> None:
    root = Path(folder)
    rows = list(csv.DictReader((root / "certificates.csv").read_text().splitlines()))
    cols = [
        "label",
        "proxy",
        "N",
        "P",
        "m",
        "R_hat",
        "eps_hat",
        "eta_hat",
        "bound",
        "bound_occam",
        "nontrivial",
        "N_star",
        "N_star_observed",
        "kl_bits",
        "top1_agreement",
        "mean_gap_bits",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            try:
                f = float(v)
                v = v if c in ("N", "P", "m") else (f"{f:.3f}" if abs(f) < 1e4 else f"{f:.3g}")
            except ValueError:
                pass
            cells.append(v)
        print("| " + " | ".join(cells) + " |")
    certs, shuffled = {}, {}
    for d in sorted(p for p in root.iterdir() if (p / "result.json").exists()):
        cert = Certificate.load(d)
        (shuffled if d.name.endswith("_shuffled") else certs)[d.name.removesuffix("_shuffled")] = cert
    print("\nBound U (bits) at each prefix N of the evaluation split:\n")
    order = [r["label"] for r in rows if r["proxy"] == "real"]
    folder = {"".join(ch if ch.isalnum() else "_" for ch in label): label for label in order}
    names = sorted(certs, key=lambda k: order.index(folder.get(k, order[0])))
    ns = certs[names[0]].curve_N
    print("| N | " + " | ".join(folder.get(k, k).split(" SmolLM2")[0] for k in names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for i, n in enumerate(ns):
        print(f"| {n} | " + " | ".join(f"{certs[k].curve_bound[i]:.3f}" for k in names) + " |")
    print("\nTimes (s):", json.loads((root / "times.json").read_text()))
    figs = [
        bound_vs_n_figure(certs),
        bound_vs_n_figure(certs, occam=True, title="Occam bound vs N"),
        gap_distribution_figure(certs, shuffled),
    ]
    html = "".join(f.to_html(include_plotlyjs="cdn" if i == 0 else False, full_html=False) for i, f in enumerate(figs))
    Path(html_out).write_text(f"<html><body><h1>tlql certify: {root}</h1>{html}</body></html>", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
