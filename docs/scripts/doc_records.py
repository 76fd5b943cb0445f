"""The docs' run figures from their records: render the tables, check the inline headlines.

Every table between ``<!-- table: NAME -->`` and ``<!-- /table -->`` in docs/ is rendered here from the records
in docs/ (and tl_query_lens/reproduce/documented.json); :func:`headlines` lists phrases of the prose, formatted here
from a record, that must appear verbatim.

    python docs/scripts/doc_records.py           # check: list every table or headline that differs, exit 1 if any
    python docs/scripts/doc_records.py --write   # rewrite the tables in place from the records

tests/test_docs_records.py runs the check (no model). Beyond the records it computes only means, ranges, ratios
and differences of recorded values, as the prose quotes them.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "reproduction"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)
METHODS = ("LL_KEY", "LL_VALUE", "QL_KEY", "QL_VALUE")


def _json(name: str) -> Any:
    return json.loads((RECORDS / name).read_text(encoding="utf-8"))


def _csv(name: str, folder: Path | None = None) -> list[dict[str, str]]:
    return list(csv.DictReader(((folder or RECORDS) / name).read_text(encoding="utf-8").splitlines()))


def _f(x: float | str, nd: int = 2) -> str:
    """``x`` to ``nd`` decimals, halves rounded away from zero as in print (91.25 -> 91.3, not Python's 91.2)."""
    q = Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-nd), rounding=ROUND_HALF_UP)
    return f"{q:.{nd}f}"


def _ci(row: dict[str, Any], key: str) -> str:
    return f"{_f(row[key])} [{_f(row[key + '_lo'])}, {_f(row[key + '_hi'])}]"


def sweep_cells() -> dict[str, dict[str, Any]]:
    """Table 1 sweep cells: full cell records first, then the summary-only ones (cell files lost)."""
    cells = {n: {**c, "record_kind": "cell record"} for n, c in _json("table1_sweep.json").items()}
    for n, c in _json("table1_sweep_summary_only.json").items():
        cells.setdefault(n, c)
    return cells


def _rows(cell: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["method"]: r for r in cell["result"]["rows"]}


def reproduce_rows(kind: str) -> dict[str, dict[str, str]]:
    return {r["id"]: r for r in _csv(f"reproduce_{kind}.csv")}


def depth_n409() -> dict[str, list[dict[str, str]]]:
    """Residual-SAE depth sweep at N = 409 (embedded split, 512-window pool): pre-release suite and shipped suite."""
    pre = [
        r
        for f in ("certify_paper_depth_cal512_L6_L12.csv", "certify_paper_depth_cal512_L18_L24.csv")
        for r in _csv(f)
        if r["label"].startswith("sae")
    ]
    full = reproduce_rows("full")
    keys = {"bound_occam": "occam", "eta_hat": "eta"}
    shipped = [
        {"label": f"sae L{n}", **{k: full[f"cert.sae{n}.{v}"]["value"] for k, v in keys.items()}}
        for n in (6, 12, 18, 24)
    ]
    return {"pre-release": pre, "shipped": shipped}


TABLES: dict[str, Callable[[], str]] = {}


def table(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        TABLES[name] = fn
        return fn

    return register


_SWEEP_ORDER = (  # by factor: base, max-activating corpus, prompts, operator corpus and basis, bf16
    "base", "maxact-broad-4k", "maxact-embedded-all", "maxact-broad-64k", "maxact-broad-262k", "prompts-20x20",
    "prompts-100x20", "base-features", "ops-512", "ops-4096", "ops-16384", "base-bf16", "ops-512-bf16", "ops-4096-bf16",
)  # fmt: skip


@table("table1-sweep")
def _table1_sweep() -> str:
    cells = sweep_cells()
    names = [n for n in _SWEEP_ORDER if n in cells] + sorted(set(cells) - set(_SWEEP_ORDER))
    head = "| cell | max-act tokens (corpus) | prompts × tokens | operator tokens | LL_KEY | LL_VALUE | QL_KEY | QL_VALUE | record (1-min load average at start → end) |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        c, res = cells[n], cells[n]["result"]
        rows = _rows(c)
        kind = "docstrings" if c["settings"]["maxact_corpus"] == "embedded" else "prose"
        scores = [
            f"{_ci(rows[m], 'input')} / {_f(rows[m]['output@0.25'])}"
            if m.endswith("KEY")
            else f"{_f(rows[m]['input'])} / {_ci(rows[m], 'output@0.25')}"
            for m in METHODS
        ]
        record = (
            f"cell, {c['started_utc'][:10]}: {c['wall_s'] / 60:.0f} min wall, {c['cpu_s'] / 60:.0f} min CPU, "
            f"{c.get('ranks', 1)} rank(s), load {c['loadavg_start'][0]:.1f} → {c['loadavg_end'][0]:.1f}"
            if c["record_kind"] == "cell record"
            else f"**summary only**, no per-feature record ({c['wall']} wall)"
        )
        lines.append(
            f"| `{n}` | {res['maxact_tokens']:,} ({kind}) | {res['n_prompts']} × {res['n_generate']} | "
            f"{res['op_tokens']:,} | " + " | ".join(scores) + f" | {record} |"
        )
    paper = cells["base"]["result"]["paper"]
    lines.append(
        "| paper (GPT-2 small, SAE features) | — | 100 × 20 | ~32k | "
        + " | ".join(f"{paper[m][0]} / {paper[m][1]}" for m in METHODS)
        + " | the paper's Table 1 |"
    )
    return "\n".join(lines)


@table("table1-sweep-summary-only")
def _table1_sweep_summary_only() -> str:
    """The summary-only cells in the layout of the sweep report (docs/reproduction/table1_sweep.md)."""
    lines = [
        "| cell | max-act tokens | prompts × tokens | operator tokens | LL_KEY | LL_VALUE | QL_KEY | QL_VALUE | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, c in _json("table1_sweep_summary_only.json").items():
        res, rows = c["result"], _rows(c)
        scores = " | ".join(f"{_ci(rows[m], 'input')} / {_ci(rows[m], 'output@0.25')}" for m in METHODS)
        lines.append(
            f"| {n} | {res['maxact_tokens']:,} | {res['n_prompts']} × {res['n_generate']} | {res['op_tokens']:,} | "
            f"{scores} | {c['wall']} |"
        )
    return "\n".join(lines)


@table("table1-headline")
def _table1_headline() -> str:
    """The three Table-1 runs under the paper's protocol on 52 residual-SAE features, and which one is the headline."""
    pre = {r["method"]: r for r in _csv("table1_paper_saes.csv")}
    full = reproduce_rows("full")
    base = _rows(sweep_cells()["base"])

    def rep(key: str) -> str:
        r = full[key]
        return f"{_f(r['value'])} [{_f(r['value_lo'])}, {_f(r['value_hi'])}]"

    lines = [
        "| run | suite | corpus of the 4,096 max-activating and 64 operator tokens | QL_KEY input | LL_KEY input | QL_VALUE output | LL_VALUE output | status |",
        "|---|---|---|---|---|---|---|---|",
        (
            f"| `tlql reproduce`, experiment `table1_saes` (`docs/reproduction/reproduce_full.csv`) | shipped | `stdlib` "
            f"(evaluation / train split) | {rep('table1.ql_key.input')} | {rep('table1.ll_key.input')} | "
            f"{rep('table1.ql_value.output')} | {rep('table1.ll_value.output')} | **headline** |"
        ),
        (
            f"| sweep cell `base` (`docs/reproduction/table1_sweep.json`) | shipped | `embedded` (evaluation / "
            f"train split) | {_ci(base['QL_KEY'], 'input')} | {_ci(base['LL_KEY'], 'input')} | {_ci(base['QL_VALUE'], 'output@0.25')} "
            f"| {_ci(base['LL_VALUE'], 'output@0.25')} | reference point of the §4.2 sweep |"
        ),
        (
            f"| §3 run (`docs/reproduction/table1_paper_saes.csv`) | pre-release (fp32, 2026-12-03) | "
            f"`embedded` (evaluation / train split) | {_ci(pre['QL_KEY'], 'input')} | {_ci(pre['LL_KEY'], 'input')} | "
            f"{_ci(pre['QL_VALUE'], 'output@0.25')} | {_ci(pre['LL_VALUE'], 'output@0.25')} | superseded (other dictionaries) |"
        ),
    ]
    return "\n".join(lines)


@table("readout-fit-spread")
def _readout_fit_spread() -> str:
    rec = _json("readout_fit_spread.json")
    fits = rec["fits"]
    order = ["s0-t1", "s0-t2", "s1-t1", "s2-t1"]
    best = _json("readout_1000step_both_protocols.json")["paper"]
    base_cov = best["coverage_baselines"][best["best_baseline"]]
    rows = [  # (label, key in the record, decimals)
        ("rowEV", "row_ev", 3), ("top-1 agreement (paper protocol)", "top1", 3),
        ("coverage (paper protocol)", "coverage", 3), ("ρ₀ median", "rho0_median", 3),
        ("ablation R² (through origin, top-10)", "ablation_r2", 3), ("ablation slope", "ablation_slope", 2),
        ("cross-lens agreement (prompts of 80)", "cross_lens_of_80", 0),
        ("cross-lens, own top-1 definition", "cross_lens_own_top1", 3), ("dead features", "dead_fraction", 3),
        ("fit wall time (s)", "fit_wall_s", 0),
    ]  # fmt: skip
    lines = ["| headline | " + " | ".join(order) + " | mean | range |", "|---|" + "---|" * (len(order) + 2)]
    for label, key, nd in rows:
        vals = [fits[c][key] for c in order]
        lines.append(
            f"| {label} | " + " | ".join(_f(v, nd) for v in vals) + f" | {_f(mean(vals), nd)} | "
            f"{_f(min(vals), nd)} – {_f(max(vals), nd)} |"
        )
    margins = [100 * (fits[c]["coverage"] - base_cov) for c in order]
    lines.append(
        f"| margin over the best baseline (points; coverage − {base_cov:.3f}) | "
        + " | ".join(f"{m:+.1f}" for m in margins)
        + f" | {mean(margins):+.1f} | {min(margins):+.1f} – {max(margins):+.1f} |"
    )
    return "\n".join(lines)


@table("reproduce-rows")
def _reproduce_rows() -> str:
    doc = json.loads((ROOT / "tl_query_lens" / "reproduce" / "documented.json").read_text(encoding="utf-8"))
    lines = [
        (
            "| size | rows in the run's table (`docs/reproduction/reproduce_<size>.csv`) | documented rows "
            "(`tl_query_lens/reproduce/documented.json`) | rows added after that run, recorded by subset runs |"
        ),
        "|---|---|---|---|",
    ]
    for kind in ("quick", "full"):
        ran = reproduce_rows(kind)
        extra = sorted(set(doc[kind]) - set(ran))
        groups = sorted({e.split(".")[0] for e in extra})
        shown = ", ".join(f"`{g}` ({sum(e.startswith(g + '.') for e in extra)})" for g in groups) or "none"
        lines.append(f"| {kind} | {len(ran)} | {len(doc[kind])} | {len(extra)}: {shown} |")
    return "\n".join(lines)


@table("bf16-benchmark")
def _bf16_benchmark() -> str:
    """fp32 against bf16 in one run (docs/benchmarks/bf16.json, written by benchmarks/bench_bf16.py)."""
    rec = json.loads((DOCS / "benchmarks" / "bf16.json").read_text(encoding="utf-8"))
    res, tol = rec["results"], rec["tolerances"]
    lines = [
        "| part | figure | fp32 | bf16 | bf16 against fp32 | tolerance | within |",
        "|---|---|---|---|---|---|---|",
    ]

    def times(part: str, label: str) -> None:
        r = res[part]
        lines.append(
            f"| {label} | wall / CPU time, s | {_f(r['fp32']['wall_s'], 1)} / {_f(r['fp32']['cpu_s'], 1)} | "
            f"{_f(r['bf16']['wall_s'], 1)} / {_f(r['bf16']['cpu_s'], 1)} | "
            f"{_f(r['ratios']['wall_s_fp32_over_bf16'])}× / {_f(r['ratios']['cpu_s_fp32_over_bf16'])}× faster | | |"
        )

    def jaccard(label: str, name: str, j: dict[str, float]) -> None:
        ok = "yes" if j["mean"] >= tol["jaccard"] else "**no**"
        lines.append(
            f"| {label} | {name}: top-k Jaccard, mean (min) over {j['n']} | reference | {_f(j['mean'], 3)} "
            f"({_f(j['min'], 3)}) | | ≥ {tol['jaccard']} | {ok} |"
        )

    if "operators" in res:
        r = res["operators"]
        label = f"(a) operator sweeps, {r['tokens']} tokens"
        times("operators", label)
        for side, err in r["operator_rel_frobenius_error"].items():
            ok = "yes" if err <= tol["operator_rel_error"] else "**no**"
            lines.append(
                f"| {label} | {side}: relative Frobenius error | | | {err:.2e} | ≤ {tol['operator_rel_error']:.0e} | {ok} |"
            )
        for name, j in r["signature_jaccard"].items():
            jaccard(label, name, j)
    if "atlas" in res:
        r = res["atlas"]
        label = f"(b) atlas, {r['features']} features"
        times("atlas", label)
        stages = r["ratios"]["stages_wall_fp32_over_bf16"]
        lines.append(
            f"| {label} | stage wall time, fp32 / bf16 | | | "
            + ", ".join(f"{k.replace('_', ' ')} {_f(v)}×" for k, v in stages.items() if r["fp32"]["stages_s"][k] >= 1)
            + " | | |"
        )
        for name, j in r["jaccard"].items():
            jaccard(label, name, j)
    if "certificate" in res:
        r = res["certificate"]
        label = f"(c) certificate, N = {r['n_eval']}, {r['n_cal']} calibration windows"
        times("certificate", label)
        for key, name in (("bound", "fixed-pool bound U, bits"), ("bound_occam", "Occam bound, bits")):
            d = r["difference_bf16_minus_fp32"][key]
            ok = "yes" if abs(d) <= tol["bound_bits"] else "**no**"
            lines.append(
                f"| {label} | {name} | {_f(r['fp32'][key], 3)} | {_f(r['bf16'][key], 3)} | {d:+.4f} | "
                f"≤ {tol['bound_bits']} | {ok} |"
            )
        for key, name in (("eta_hat", "η̂"), ("P", "pool size P")):
            lines.append(
                f"| {label} | {name} | {r['fp32'][key]:g} | {r['bf16'][key]:g} | "
                f"{r['difference_bf16_minus_fp32'][key]:+g} | | |"
            )
    load = " → ".join(f"{x[0]:.1f}" for x in (rec["loadavg_start"], rec["loadavg_end"]))
    lines.append(
        f"| run | `{rec['command']}`, {rec['started_utc'][:16].replace('T', ' ')} UTC | | | {rec['wall_s'] / 60:.1f} min "
        f"wall, {rec['cpu_s'] / 60:.1f} min CPU, peak RSS {rec['peak_rss_mb'] / 1024:.1f} GB, {rec['torch_threads']} "
        f"threads, nice {rec['nice']}, load {load} | | |"
    )
    return "\n".join(lines)


@table("certificates-n1000")
def _certificates_n1000() -> str:
    """docs/certification.md's N = 1000 sweep, in the layout docs/certification_tables.py prints."""
    rows = _csv("certificates.csv", DOCS / "certification")
    cols = [c for c in rows[0] if c not in ("hook", "baseline_bits")]

    def cell(col: str, value: str) -> str:
        try:
            x = float(value)
        except ValueError:
            return value
        return value if col in ("N", "P", "m") else f"{x:.3f}" if abs(x) < 1e4 else f"{x:.3g}"

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(cell(c, r[c]) for c in cols) + " |" for r in rows])


@table("depth-n409")
def _depth_n409() -> str:
    d = depth_n409()
    lines = [
        (
            "| suite (N = 409 documents, 512-window pool) | Occam bound, bits: L6 / L12 / L18 / L24 | η̂ | certify "
            "(< log₂\\|V\\| = 15.58) | record |"
        ),
        "|---|---|---|---|---|",
    ]
    for suite, record in (
        ("shipped (`tlql-saes-smollm2-135m`)", "`docs/reproduction/reproduce_full.csv` (`cert.sae*`)"),
        ("pre-release (fp32, 2026-12-03)", "`docs/reproduction/certify_paper_depth_cal512_*.csv`"),
    ):
        rows = d["shipped" if suite.startswith("shipped") else "pre-release"]
        occ = [float(r["bound_occam"]) for r in rows]
        eta = [float(r["eta_hat"]) for r in rows]
        ok = [r["label"].split()[1] for r, o in zip(rows, occ) if o < 15.58496]
        lines.append(
            f"| {suite} | {' / '.join(_f(o) for o in occ)} | {' / '.join(_f(e, 3) for e in eta)} | "
            f"{', '.join(ok) or 'none'} | {record} |"
        )
    return "\n".join(lines)


def pool_curve() -> tuple[str, dict[tuple[int, str], dict[str, Any]]]:
    """The largest pool-size cell of certify_pool_curve.json and its rows by (pool windows, layer): one cell's
    calibration pass and evaluation pass give every smaller pool of the curve too."""
    cells = {k: v for k, v in _json("certify_pool_curve.json").items() if k.startswith("saes-L24-L28-N1000-cal")}
    name = max(cells, key=lambda k: max(r["n_cal"] for r in cells[k]["result"]["rows"]))
    result = cells[name]["result"]
    return name, {(r["n_cal"], label.split()[1]): r for label, r in zip(result["labels"], result["rows"], strict=True)}


@table("pool-curve")
def _pool_curve() -> str:
    """docs/certification.md: η̂, bounds and N* per layer and pool size at N = 1,000 (one cell, every pool)."""
    name, by = pool_curve()
    depth = {"L24": "80 %", "L28": "93 %"}
    head = "| dictionary (depth) | pool: windows (tokens) | P / m | η̂ | R̂ | ε̂ | fixed-pool | Occam | certifies "
    lines = [head + "| N* (Occam, closed form) |", "|" + "---|" * 10]
    for (n_cal, layer), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(
            f"| SAE {layer} ({depth[layer]}) | {n_cal:,} ({r['cal_tokens']:,}) | {r['P']:,} / {r['m']:,} | "
            f"{_f(r['eta_hat'], 3)} | {_f(r['R_hat'])} | {_f(r['eps_hat'], 3)} | {_f(r['bound'])} | "
            f"{_f(r['bound_occam'])} | {'yes' if r['nontrivial_occam'] else 'no'} | "
            f"{r['N_star_closed_form_occam']:,.0f} |"
        )
    return "\n".join(lines) + f"\n\nAll rows: cell `{name}` of `docs/reproduction/certify_pool_curve.json`."


def pool_all_phrases() -> list[str]:
    """docs/certification.md's reading of the full pool: both layers' Occam bound and N* at every window."""
    _, by = pool_curve()
    n_all = max(n for n, _ in by)
    l24, l28 = by[(n_all, "L24")], by[(n_all, "L28")]
    return [
        f"the Occam bound is {_f(l24['bound_occam'])} bits for L24 (80 % depth) and {_f(l28['bound_occam'], 3)} for L28",
        f"the closed-form N* is {l24['N_star_closed_form_occam']:,.0f} and {l28['N_star_closed_form_occam']:,.0f}",
        f"every calibration window of the 'broad' corpus: {n_all:,} windows,\n{l24['cal_tokens']:,} tokens",
    ]


def pool_curve_phrases() -> list[str]:
    """The §4.3 sentence on the pool size at N = 1,000: per layer, η̂, the Occam bound and N* from 512 windows to
    every window of the calibration split."""
    _, by = pool_curve()
    n_all = max(n for n, _ in by)
    out = []
    for layer in ("L24", "L28"):
        small, large = by[(512, layer)], by[(n_all, layer)]
        out.append(
            f"{layer}: η̂ {_f(small['eta_hat'], 3)} → {_f(large['eta_hat'], 3)}, Occam "
            f"{_f(small['bound_occam'])} → {_f(large['bound_occam'])} bits, N* "
            f"{small['N_star_closed_form_occam']:,.0f} → {large['N_star_closed_form_occam']:,.0f}"
        )
    return out


def bf16_phrases() -> list[str]:
    """The figures docs/benchmarks.md quotes from docs/benchmarks/bf16.json in the prose after its table."""
    res = json.loads((DOCS / "benchmarks" / "bf16.json").read_text(encoding="utf-8"))["results"]
    ops, atlas, cert = res["operators"], res["atlas"], res["certificate"]
    err = ops["operator_rel_frobenius_error"]
    jac = ops["signature_jaccard"]
    diff = cert["difference_bf16_minus_fp32"]
    return [
        f"value directions {err['value (M v)']:.1e}, key gradients {err['key (N^T k)']:.1e}",
        f"QL_VALUE top-25 {_f(jac['QL_VALUE top-25']['mean'], 3)}",
        f"QL_KEY top-25 {_f(jac['QL_KEY top-25']['mean'], 3)}",
        f"top-context Jaccard {_f(atlas['jaccard']['top contexts']['mean'], 3)}",
        f"corpus pass's fp32 / bf16 wall time {_f(atlas['ratios']['stages_wall_fp32_over_bf16']['forward_pass'])}",
        f"{_f(atlas['fp32']['cpu_s'], 1)} s of CPU in fp32 and {_f(atlas['bf16']['cpu_s'], 1)} s in bf16",
        f"U {diff['bound']:+.3f} bits, Occam {diff['bound_occam']:+.3f} bits",
    ]


def headlines() -> dict[str, list[str]]:
    """Per doc, the phrases formatted from the records that must appear in it verbatim."""
    full = reproduce_rows("full")
    cells = sweep_cells()
    sp = _json("readout_fit_spread.json")["fits"]
    paper = _json("readout_1000step_both_protocols.json")["paper"]
    d = depth_n409()
    ffkv = {r["label"]: r for r in _csv("certify_paper_ffkv_L24.csv")}["ffkv L24"]

    def v(key: str, nd: int = 2) -> str:
        return _f(full[key]["value"], nd)

    def cellv(name: str, method: str, key: str, nd: int = 2) -> str:
        return _f(_rows(cells[name])[method][key], nd)

    def rng(key: str, nd: int = 3) -> str:
        vals = [f[key] for f in sp.values()]
        return f"{_f(min(vals), nd)}–{_f(max(vals), nd)}"

    shipped = " / ".join(_f(r["bound_occam"]) for r in d["shipped"])
    pre = ", ".join(_f(r["bound_occam"]) for r in d["pre-release"][:3])
    margins = [100 * (f["coverage"] - paper["coverage_baselines"][paper["best_baseline"]]) for f in sp.values()]
    top_in, top_lo, top_hi = (cellv("maxact-broad-262k", "QL_KEY", k) for k in ("input", "input_lo", "input_hi"))
    l24 = _json("certify_large_n.json")["saes-L24-Nall-cal512"]["result"]["rows"][0]
    summary = _json("certify_large_n_summary_only.json")

    def large_n(cell: str, key: str, nd: int = 2) -> str:
        return " / ".join(f"{float(r[key]):,.0f}" if nd == 0 else _f(r[key], nd) for r in summary[cell]["rows"])

    n250 = [_f(r["bound"]) for r in _csv("certificates_n250.csv", DOCS / "certification") if r["proxy"] == "real"]
    certs = _csv("certificates.csv", DOCS / "certification")
    r_hat = [float(r["R_hat"]) for r in certs if r["label"].startswith("ffkv") and r["proxy"] == "real"]
    n1000 = f"{_f(min(r_hat))}–{_f(max(r_hat))} bits"
    pre128 = {r["label"].split()[1]: r for r in _csv("certify_paper_depth.csv") if r["label"].startswith("sae")}
    cl = _json("cross_lens_paper_summary.json")
    mixed = _json("readout_1000step_both_protocols.json")["mixed_layers"]
    saes = {r["method"]: r for r in _csv("table1_paper_saes.csv")}

    def occ128(key: str) -> str:
        return " / ".join(_f(pre128[layer][key]) for layer in ("L6", "L12", "L18", "L24"))

    def ratio(method: str, key: str, nd: int) -> str:
        vals = [_rows(c)[method][key] for c in cells.values()]
        paper = cells["base"]["result"]["paper"][method][0 if key == "input" else 1]
        return f"{paper / max(vals):.0f}–{paper / min(vals):.0f}" if nd == 0 else f"{_f(min(vals))}–{_f(max(vals))}"

    def ql(method: str) -> str:
        return f"{_f(full[f'table1.{method}']['value'], 1)} %"

    s512, s128, f512, f128 = (f"{kind}-N5000-cal{n}" for kind in ("saes", "ffkv") for n in (512, 128))
    return {
        "reproduction.md": [
            # §4.3 the pool-size curve at N = 1,000 (docs/reproduction/certify_pool_curve.json)
            *pool_curve_phrases(),
            # §1 certification: FF-KV L24 and the depth sweep (pre-release and shipped suites)
            f"**Occam {_f(ffkv['bound_occam'])} < 15.58 bits",
            f"**{_f(ffkv['bound_direct'])} bits** (R̂(M) = {_f(ffkv['R_hat_clean'])})",
            f"closed form Occam **{float(ffkv['N_star_closed_form_occam']):.1f}**",
            f"mean \\|gap\\| **{_f(ffkv['abs_gap_mean'], 3)} → {_f(ffkv['shuffled_abs_gap_mean'], 3)} bits**",
            f"Occam {occ128('bound_occam')} bits vs log₂\\|V\\| = 15.58",
            f"fixed-pool {occ128('bound').rsplit(' / ', 2)[0]} / **{_f(pre128['L18']['bound'])}**",
            f"Occam **{pre.replace(', ', ' / ')}** / {_f(d['pre-release'][3]['bound_occam'])}",
            f"Occam {pre} < 15.58 bits",
            f"Occam **{shipped}** bits",
            # the shipped release as `tlql reproduce` measured it
            f"QL_KEY input **{ql('ql_key.input')}**",
            f"top-1 {v('readout.top1', 3)}, coverage **{v('readout.coverage', 3)}**",
            f"margin over\n  the best baseline **{float(full['readout.margin']['value']):+.1f} points**",
            # §2 readout, the 1000-step dictionary, and the cross-lens check
            f"**{_f(paper['top1'], 3)}** (512 final-layer states)",
            f"**{100 * paper['margin_over_best_baseline']:+.1f} points**: SAE {_f(paper['coverage'], 3)}",
            f"**R² {_f(paper['ablation_r2'], 3)}**, slope {_f(paper['ablation_slope'])} ({paper['n_points']} points)",
            f"R² {_f(paper['ablation_r2_control'], 3)} |",
            f"**{cl['1024']['paper_agreement'] * 80:.0f} / 80 = {100 * cl['1024']['paper_agreement']:.0f} %**",
            f"(64: {_f(100 * cl['64']['paper_agreement'], 1)} %",
            f"same run, same lenses: {_f(cl['1024']['own_top1_agreement'], 3)} at 1,024 positions",
            f"r² {_f(re.findall(r'r2=([0-9.]+)', mixed['ablation'])[0], 3)} (squared Pearson, top-3, 768 points)",
            # §3 Table 1 (pre-release suite)
            (
                f"| QL_KEY | 39.32 / 1.97 | **{_f(saes['QL_KEY']['input'])}** [{_f(saes['QL_KEY']['input_lo'])}, "
                f"{_f(saes['QL_KEY']['input_hi'])}] / {_f(saes['QL_KEY']['output@0.25'])} |"
            ),
            # §4.1 the four fits
            f"coverage ranges over {rng('coverage')}",
            f"ablation R² over {rng('ablation_r2')}",
            f"top-1 over {rng('top1')}",
            f"slope {rng('ablation_slope', 2)} in every fit",
            f"margin over the best baseline {min(margins):+.1f} to {max(margins):+.1f} points",
            # §4.2 the sweep
            f"{len(cells)} cells, {len(_json('table1_sweep.json'))} with a full cell record",
            f"**{top_in} % [{top_lo}, {top_hi}]",
            f"QL_VALUE output {cellv('base', 'QL_VALUE', 'output@0.25', 1)} % at 2 × 10",
            (
                f"**{cellv('ops-16384', 'QL_KEY', 'input', 1)} % [{cellv('ops-16384', 'QL_KEY', 'input_lo', 1)}, "
                f"{cellv('ops-16384', 'QL_KEY', 'input_hi', 1)}]**"
            ),
            (
                f"(**{cellv('prompts-100x20', 'QL_VALUE', 'output@0.25', 1)} % "
                f"[{cellv('prompts-100x20', 'QL_VALUE', 'output@0.25_lo', 1)}, "
                f"{cellv('prompts-100x20', 'QL_VALUE', 'output@0.25_hi', 1)}]**)"
            ),
            f"LL_KEY input {ratio('LL_KEY', 'input', 0)}× below: {ratio('LL_KEY', 'input', 2)} % against",
            f"LL_VALUE output {ratio('LL_VALUE', 'output@0.25', 0)}× below: {ratio('LL_VALUE', 'output@0.25', 2)} % against",
            # §4.3 certification at large N on 'broad' (summary-only cells and the L24 cell record)
            f"| **{large_n(s512, 'bound_occam')}** | **L6, L12, L18** | {large_n(s512, 'N_star_occam', 0)} |",
            f"| {large_n(s512, 'eta_hat', 3)} | {large_n(s512, 'R_hat')} |",
            f"| **{large_n(s128, 'eta_hat', 3)}** | {large_n(s128, 'bound_occam')} |",
            f"| {_f(max(r['eta_hat'] for r in summary[f512]['rows']), 0)} | {large_n(f512, 'R_hat')} |",
            f"(η̂ {large_n(f128, 'eta_hat', 3).split(' / ')[2]}, Occam {large_n(f128, 'bound_occam').split(' / ')[2]})",
            (
                f"| **{l24['N']:,}** (every eligible document) | same pool | {_f(l24['eta_hat'], 3)} | "
                f"{_f(l24['R_hat'])} | {_f(l24['eps_hat'], 3)} | **{_f(l24['bound_occam'])}** |"
            ),
        ],
        "benchmarks.md": bf16_phrases(),
        "certification.md": [
            f"Occam {shipped} bits",
            f"(U = {' / '.join(n250[:4])} /",
            f"does not (U = {n250[5]},",
            f"R̂ ≈ {n1000}",
            *pool_all_phrases(),
        ],
        "query_lens_evaluation.md": [
            (
                f"(QL_KEY {ql('ql_key.input')} vs LL_KEY {_f(full['table1.ll_key.input']['value'], 1)} % input, "
                f"QL_VALUE {ql('ql_value.output')} vs LL_VALUE {ql('ll_value.output')} output"
            ),
            # no record: the paired differences quoted in §2's prose are those of its own list
            "(paired difference +7.31 pts [5.15, 9.69] at KL 0.25,\n  +5.08 pts [3.31, 7.15] at KL 0.5)",
            "* output@0.25 QL_VALUE full - LL_VALUE: mean diff 7.31 pts [5.15, 9.69]",
            "* output@0.5 QL_VALUE full - LL_VALUE: mean diff 5.08 pts [3.31, 7.15]",
        ],
    }


def _docs() -> list[Path]:
    return sorted(DOCS.glob("*.md")) + sorted(RECORDS.glob("*.md"))


def render(text: str) -> str:
    """``text`` with every marked table rendered anew from the records (an unknown name raises KeyError)."""
    return BLOCK.sub(lambda m: f"{m[1]}{TABLES[m['name']]()}\n{m[4]}", text)


def problems() -> list[str]:
    """What differs between docs/*.md and the records: one line per table or headline phrase."""
    out = []
    for path in _docs():
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            where = f"{path.relative_to(ROOT)}: table {m['name']!r}"
            if m["name"] not in TABLES:
                out.append(f"{where} has no renderer in docs/scripts/doc_records.py")
            elif m["body"] != TABLES[m["name"]]() + "\n":
                out.append(f"{where} differs from its records (run with --write)")
    for doc, phrases in headlines().items():
        text = (DOCS / doc).read_text(encoding="utf-8")
        out += [f"docs/{doc}: headline not found as recorded: {p!r}" for p in phrases if p not in text]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the marked tables from the records")
    args = parser.parse_args(argv)
    if args.write:
        for path in _docs():
            path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    found = problems()
    print("\n".join(found) if found else "every table and headline matches its records")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
