"""Spread of the readout headlines over independent fits of the readout SAE (seeds, and 1 vs 2 threads).

docs/reproduction.md §2 reports one fit of the ``small`` preset (width 2304, k 128, 1000 steps). A refit with another
seed, or the same seed with another thread count (other BLAS reduction orders), gives another dictionary, and the
headlines move by more than their Wilson / bootstrap intervals show. This script fits the preset once per cell, one fit
at a time, and scores every fit the same way:

- rowEV of the fit;
- the authors' diagnostics (``readout_diagnostics_paper``, 32 × 17 evaluation tokens, final-layer states): top-1
  agreement, coverage, ρ₀ median, ablation R² and slope (and, with ``--baselines``, the margin over the best one:
  the strongest baseline reads only the LM head, so the margin moves with coverage alone);
- cross-lens agreement under the authors' protocol (the package's prompt bank, mid band, vote ≥ 2 of 4) with lenses of
  ``--lens-windows`` × 64 positions (docstrings vs the language reference, as docs/scripts/cross_lens_paper.py); the
  lens operators do not depend on the dictionary, so they are computed once (``<out>/lens_ops``) and shared;
- and, between fits of the same seed, how many dominant features (prompt × layer, both lenses) coincide.

The table gives each headline per fit, their mean and range (min–max). Each cell is one fit in its own process
(``_cells.py``: resumable, with command, wall time and peak memory); the SAE is kept in the cell's folder.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/readout_fit_spread.py --out results/readout_fit_spread
    python benchmarks/readout_fit_spread.py --out results/readout_fit_spread --report   # the table only

Cells: ``s<seed>-t<threads>`` (default ``s0-t1,s0-t2,s1-t1,s2-t1``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _cells

DEFAULT_CELLS = "s0-t1,s0-t2,s1-t1,s2-t1"
HEADLINES = (  # key, label, format
    ("row_ev", "rowEV", "{:.3f}"),
    ("top1", "top-1 agreement (paper protocol)", "{:.3f}"),
    ("coverage", "coverage (paper protocol)", "{:.3f}"),
    ("rho0_median", "ρ₀ median", "{:.3f}"),
    ("ablation_r2", "ablation R² (through origin, top-10)", "{:.3f}"),
    ("ablation_slope", "ablation slope", "{:.2f}"),
    ("margin_over_best_baseline", "margin over the best baseline (points)", "{:+.1f}"),
    ("cross_lens_pass", "cross-lens agreement (prompts of 80)", "{:.0f}"),
    ("own_top1_agreement", "cross-lens, own top-1 definition", "{:.3f}"),
    ("dead_rate", "dead features", "{:.3f}"),
    ("fit_s", "fit wall time (s)", "{:.0f}"),
)


def parse_cell(name: str) -> tuple[int, int]:
    """``s<seed>-t<threads>`` → (seed, threads)."""
    try:
        seed, threads = name.split("-")
        if not (seed.startswith("s") and threads.startswith("t")):
            raise ValueError
        return int(seed[1:]), int(threads[1:])
    except ValueError as err:
        raise SystemExit(f"cell {name!r}: write cells as s<seed>-t<threads>, e.g. s0-t1,s0-t2,s1-t1") from err


def language_reference() -> list[str]:
    """Lens B's corpus: CPython's language-reference topics (``pydoc_data.topics``), one document each."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def lens_operators(model, layers: list[int], states, n_windows: int, cache: Path, window: int = 80, skip: int = 16):
    """Value operators of both lenses on the bank's states (feature basis), ``n_windows`` windows of ``window``
    tokens per lens, one per document, the first ``skip`` positions left out (64 positions per window)."""
    from tl_query_lens.documents import one_window_per_document
    from tl_query_lens.operators import value_operators

    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    lenses = {}
    for name, source in (("docstrings", "embedded"), ("language_reference", language_reference())):
        w = one_window_per_document(
            source, model, n_seqs=n_windows, seq_len=window, split="train", random_start=False, seed=0
        )
        ops = {}
        for j, (layer, hook) in enumerate(zip(layers, hooks)):
            for i in range(n_windows):
                one = value_operators(
                    model,
                    w.tokens[i : i + 1],
                    [hook],
                    skip_positions=skip,
                    cache_dir=cache / name,
                    progress=False,
                    basis=states[:, j],
                )
                ops[layer] = one if layer not in ops else ops[layer].merge(one)
        lenses[name] = {layer: ops[layer][hook] for layer, hook in zip(layers, hooks)}
    return lenses["docstrings"], lenses["language_reference"]


def compute_cell(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Fit one readout SAE (seed and threads of the cell) and score it; the SAE goes to ``folder/sae``."""
    import torch

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.readout import collect_states
    from tl_query_lens.readout.config import ReadoutFitConfig
    from tl_query_lens.readout.cross_lens_paper import (
        cross_lens_prompts,
        final_residuals,
        load_prompt_bank,
        mid_band_layers,
    )
    from tl_query_lens.readout.diagnostics_paper import readout_diagnostics_paper
    from tl_query_lens.readout.fit import fit_readout

    seed, threads = parse_cell(name)
    torch.set_num_threads(threads)
    model = load_model(args.model, device="cpu")
    overrides = {"seed": seed} | ({"steps": args.steps} if args.steps else {})
    cfg = ReadoutFitConfig.preset(args.preset, **overrides)
    t0 = time.perf_counter()
    fit = fit_readout(model, cfg=cfg, progress=False)
    fit_s = time.perf_counter() - t0
    fit.sae.save_model(folder / "sae")
    torch.set_num_threads(args.eval_threads)  # the scoring is the same for every fit

    t0 = time.perf_counter()
    tokens = load_corpus("embedded", model, n_seqs=32, seq_len=17, split="evaluation", seed=0)
    final = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    baselines = tuple(b for b in args.baselines.split(",") if b)
    paper = readout_diagnostics_paper(model, fit.sae, final, baselines=baselines)
    diag_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    layers = mid_band_layers(model.cfg.n_layers)
    bank = load_prompt_bank()
    bank_run = final_residuals(
        model, [p["prompt"] for p in bank], [f"blocks.{layer}.hook_resid_post" for layer in layers]
    )
    lens_cache = Path(args.lens_cache) if args.lens_cache else Path(args.out) / "lens_ops"
    ops_a, ops_b = lens_operators(model, layers, bank_run[0], args.lens_windows, lens_cache)
    lens_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cross = cross_lens_prompts(model, fit.sae, ops_a, ops_b, bank, states=bank_run, layers=layers)
    cross_s = time.perf_counter() - t0
    torch.save({"dominant_a": cross.dominant_a, "dominant_b": cross.dominant_b}, folder / "dominant.pt")
    n_pass = round(cross.paper_agreement * cross.n_prompts)
    return {
        "seed": seed,
        "threads": threads,
        "row_ev": fit.final["row_ev"],
        "dead_rate": fit.final["dead_rate"],
        "steps": fit.final["steps"],
        "fit_s": fit_s,
        "top1": paper.top1,
        "coverage": paper.coverage,
        "coverage_ci": paper.coverage_ci,
        "rho0_median": paper.rho0_median,
        "ablation_r2": paper.ablation_r2,
        "ablation_slope": paper.ablation_slope,
        "ablation_r2_control": paper.ablation_r2_control,
        "margin_over_best_baseline": 100 * paper.margin_over_best_baseline if baselines else None,
        "best_baseline": paper.best_baseline,
        "cross_lens_pass": n_pass,
        "cross_lens_n": cross.n_prompts,
        "cross_lens_agreement": cross.paper_agreement,
        "cross_lens_ci": cross.paper_agreement_ci,
        "own_top1_agreement": cross.own_top1_agreement,
        "lens_positions": 64 * args.lens_windows,
        "diagnostics_s": diag_s,
        "lens_s": lens_s,
        "cross_lens_s": cross_s,
        "provenance": fit.provenance,
        "fit_config": asdict(cfg),
    }


def dominant_overlap(out: Path, a: str, b: str) -> tuple[int, int]:
    """(coinciding, total) dominant features of two fits over prompts × layers × both lenses."""
    import torch

    da, db = (torch.load(_cells.cell_dir(out, n) / "dominant.pt") for n in (a, b))
    same = sum(int((da[k] == db[k]).sum()) for k in ("dominant_a", "dominant_b"))
    return same, sum(da[k].numel() for k in ("dominant_a", "dominant_b"))


def summarise(out: Path, names: list[str]) -> str:
    """Markdown: one column per fit, then mean and range; the dominant-feature overlap of same-seed fits."""
    cells = _cells.load_cells(out, names)
    if not cells:
        return "no cell done yet"
    done = list(cells)
    head = "| headline | " + " | ".join(done) + " | mean | range |"
    lines = [head, "|" + "---|" * (len(done) + 3)]
    summary: dict[str, Any] = {}
    for key, label, fmt in HEADLINES:
        values = [cells[n]["result"].get(key) for n in done]
        if any(v is None for v in values):
            continue
        mean = statistics.fmean(values)
        summary[key] = {"values": dict(zip(done, values)), "mean": mean, "min": min(values), "max": max(values)}
        lines.append(
            f"| {label} | "
            + " | ".join(fmt.format(v) for v in values)
            + f" | {fmt.format(mean)} | {fmt.format(min(values))} – {fmt.format(max(values))} |"
        )
    pairs = [(a, b) for i, a in enumerate(done) for b in done[i + 1 :] if parse_cell(a)[0] == parse_cell(b)[0]]
    notes = []
    for a, b in pairs:
        same, total = dominant_overlap(out, a, b)
        summary[f"dominant_overlap {a} {b}"] = [same, total]
        notes.append(f"dominant features coinciding, {a} vs {b}: {same} of {total}")
    records = {
        n: {k: cells[n][k] for k in ("command", "wall_s", "peak_rss_mb", "loadavg_start", "loadavg_end")} for n in done
    }
    (out / "summary.json").write_text(json.dumps({"headlines": summary, "cells": records}, indent=1, default=str))
    text = "\n".join(lines + [""] + notes)
    (out / "summary.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=DEFAULT_CELLS, help="comma list of s<seed>-t<threads> (default %(default)s)")
    parser.add_argument("--out", default="results/readout_fit_spread")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--preset", default="small", choices=("small", "paper"))
    parser.add_argument("--steps", type=int, default=None, help="override the preset's steps (tiny checks only)")
    parser.add_argument("--lens-windows", type=int, default=1, help="lens windows of 64 positions (default 1)")
    parser.add_argument(
        "--baselines",
        default="",
        help="paper baselines to score for the margin (default none: the strongest, nearest-row ridge without the "
        "contrast tokens, reads only the LM head, so its coverage is the same for every fit)",
    )
    parser.add_argument("--lens-cache", default=None, help="lens operator cache (default <out>/lens_ops)")
    parser.add_argument("--eval-threads", type=int, default=1, help="torch threads of the scoring (default 1)")
    parser.add_argument("--report", action="store_true", help="only print the table of the done cells")
    parser.add_argument("--run-cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out)
    names = [n.strip() for n in args.cells.split(",") if n.strip()]
    for name in names:
        parse_cell(name)
    if args.run_cell:
        _cells.record_cell(
            out, args.run_cell, {"cell": args.run_cell} | vars(args), lambda f: compute_cell(args.run_cell, args, f)
        )
        return 0
    failed = []
    if not args.report:
        forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]

        def env(name: str) -> dict[str, str]:
            threads = str(parse_cell(name)[1])
            return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

        failed = _cells.run_cells(__file__, out, names, forwarded, env=env)
    print(summarise(out, names))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
