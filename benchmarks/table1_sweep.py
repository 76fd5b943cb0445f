"""Query Lens Table 1 as a sweep, one factor at a time, under the paper's protocol on the shipped SAE features.

docs/reproduction.md §3 measured Table 1 on 52 features of the suite's residual SAEs (layers 6/12/18/24) with three
compute-bound departures from the paper: max-activating examples from 128 × 32 docstring tokens, 2 prompts × 10
generated tokens (paper: 100 × 20) and a 64-token operator corpus (paper: ~32k). Each cell below changes one of
them from that base (``base``), keeping the others:

- max-activating corpus (evaluation split): the whole embedded split (~49k tokens), then the 'broad' corpus
  (``scripts/setup.sh --broad-corpus``) at 4k, 64k and 262k tokens, so corpus kind (4k docstrings vs 4k prose) and
  size (4k → 262k prose) are read apart. The features are drawn (seeded) among those active in ≥ 20 windows of the
  cell's corpus, as the protocol asks, so these cells also draw their own features; the others share base's;
- prompts × generated tokens: 20 × 20 and 100 × 20 (the six neutral prompts of the package, then the neutral
  openers of :func:`sweep_prompts`);
- operator corpus (train split of the embedded corpus): 512, 4,096 and 16,384 tokens in fp32, and 64, 512 and 4,096
  with the operator sweeps under bf16 autocast (``*-bf16``; ``base-bf16`` is base's 64 tokens, so it measures what
  bf16 alone changes). ``ops-512``, ``ops-4096``, ``ops-16384`` and ``ops-4096-bf16`` push only the sampled
  features' directions through the engine (``Table1Config.basis="features"``) instead of computing full operators;
  ``base-features`` is base in that basis, so it measures what the basis alone changes.

Every cell runs in its own process and is resumable (``_cells.py``: command, wall time, peak memory per cell); inside a
cell, each layer's scores are kept under ``<out>/cells/<cell>/parts`` as that layer finishes and the operators of a
corpus under ``<out>/operators`` after every minibatch, so a stopped cell resumes from its last layer or minibatch. The report is a markdown table of every cell (mean and
95 % bootstrap interval per method, input and output) and one SVG plot per factor (``<out>/plot_<factor>.svg``).

    nice -n 19 python benchmarks/table1_sweep.py --out results/table1_sweep              # every cell, resumable
    python benchmarks/table1_sweep.py --out results/table1_sweep --cells base,ops-512     # some cells
    python benchmarks/table1_sweep.py --out results/table1_sweep --report                 # the table and plots only
    python benchmarks/table1_sweep.py --out results/table1_sweep --report \
        --records docs/reproduction/table1_sweep.json                                     # with cells measured earlier

The SAE features come from the suite release ``tlql-saes-smollm2-135m`` (``--dictionary`` takes any spec of
``tlql ql-evaluate --dictionary``, e.g. ``ffkv``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _cells

RELEASE = "tlql-saes-smollm2-135m"
LAYERS = (6, 12, 18, 24)
METHODS = ("LL_KEY", "LL_VALUE", "QL_KEY", "QL_VALUE")


@dataclass
class SweepSettings:
    """One cell's settings (defaults: the base cell, i.e. the runs of docs/reproduction.md §3).

    Attributes:
        maxact_corpus / maxact_seqs: the max-activating corpus (evaluation split; ``maxact_seqs=None``: all of it).
        op_corpus / op_seqs: the operator corpus (train split).
        seq_len: tokens per window of both corpora.
        n_prompts / n_generate: neutral prompts and tokens generated after each.
        dictionary / layers: the dictionaries (a ``--dictionary`` spec) and their layers.
        features_per_layer / n_contexts / k / kl_targets / n_steps / exclude_first_positions / seed: Table 1's.
        model / device: the model.
        sweep_dtype / sweep_autocast: the operator sweeps' precision (``EngineConfig``; default fp32).
        basis: ``Table1Config.basis``: ``"identity"`` (full operators) or ``"features"`` (only the 52 sampled
            features' directions through the engine; the same signatures up to rounding, ~11x fewer passes).
        extra: further :class:`~tl_query_lens.query_lens.config.Table1Config` fields (e.g. ``methods``, ``baselines``).
    """

    maxact_corpus: str = "embedded"
    maxact_seqs: int | None = 128
    op_corpus: str = "embedded"
    op_seqs: int = 2
    seq_len: int = 32
    n_prompts: int = 2
    n_generate: int = 10
    dictionary: str = ",".join(f"{RELEASE}:blocks.{layer}.hook_resid_post" for layer in LAYERS)
    layers: tuple[int, ...] = LAYERS
    features_per_layer: int = 13
    n_contexts: int = 20
    k: int = 25
    kl_targets: tuple[float, ...] = (0.25, 0.5)
    n_steps: int = 8
    exclude_first_positions: int = 1
    seed: int = 0
    model: str = "smollm2-135m"
    device: str = "cpu"
    sweep_dtype: str | None = None
    sweep_autocast: bool = False
    basis: str = "identity"
    extra: dict[str, Any] = field(default_factory=dict)


# factor → [(cell, changes from base, x value)]; base is the first point of every factor.
FACTORS: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "maxact": [
        ("maxact-embedded-all", {"maxact_seqs": None}, "docstrings, whole split"),
        ("maxact-broad-4k", {"maxact_corpus": "broad", "maxact_seqs": 128}, "prose 4k"),
        ("maxact-broad-64k", {"maxact_corpus": "broad", "maxact_seqs": 2048}, "prose 64k"),
        ("maxact-broad-262k", {"maxact_corpus": "broad", "maxact_seqs": 8192}, "prose 262k"),
    ],
    "prompts": [
        ("prompts-20x20", {"n_prompts": 20, "n_generate": 20}, "20 × 20"),
        ("prompts-100x20", {"n_prompts": 100, "n_generate": 20}, "100 × 20"),
    ],
    # the larger operator corpora in the feature basis (the full operators of 4,096 tokens were timed at ~2.5 h of
    # sweeps in bf16 with two ranks); base-features against base measures what the basis alone changes
    "ops": [
        ("ops-512", {"op_seqs": 16, "basis": "features"}, "512"),
        ("ops-4096", {"op_seqs": 128, "basis": "features"}, "4,096"),
        ("ops-16384", {"op_seqs": 512, "basis": "features"}, "16,384"),
    ],
    # the same operator corpora swept under bf16 autocast (about 2x faster on this CPU); base-bf16 against base
    # measures what bf16 alone changes
    "ops_bf16": [
        ("base-bf16", {"sweep_dtype": "bfloat16", "sweep_autocast": True}, "64 bf16"),
        ("ops-512-bf16", {"op_seqs": 16, "sweep_dtype": "bfloat16", "sweep_autocast": True}, "512 bf16"),
        (
            "ops-4096-bf16",
            {"op_seqs": 128, "sweep_dtype": "bfloat16", "sweep_autocast": True, "basis": "features"},
            "4,096 bf16",
        ),
    ],
    "basis": [("base-features", {"basis": "features"}, "64, feature basis")],
}
BASE_LABEL = {
    "maxact": "docstrings 4k",
    "prompts": "2 × 10",
    "ops": "64",
    "ops_bf16": "64 fp32",
    "basis": "64, full operators",
}
CELLS: dict[str, dict[str, Any]] = {"base": {}} | {name: change for f in FACTORS.values() for name, change, _ in f}

_SUBJECTS = ("The", "A", "My", "Our", "This", "Every", "One", "Their")
_NOUNS = (
    "day",
    "story",
    "city",
    "teacher",
    "river",
    "letter",
    "house",
    "friend",
    "machine",
    "song",
    "garden",
    "meeting",
)


def sweep_prompts(n: int) -> tuple[str, ...]:
    """``n`` neutral prompts: the package's six (``NEUTRAL_PROMPTS``), then short openers "<determiner> <noun>"
    (8 × 12 = 96 of them, in a fixed shuffled order), so 100 prompts are available."""
    from tl_query_lens.query_lens.config import NEUTRAL_PROMPTS

    openers = [f"{s} {n_}" for s, n_ in itertools.product(_SUBJECTS, _NOUNS)]
    random.Random(0).shuffle(openers)
    prompts = tuple(NEUTRAL_PROMPTS) + tuple(openers)
    if not 1 <= n <= len(prompts):
        raise ValueError(f"n_prompts must be in 1..{len(prompts)}, got {n}.")
    return prompts[:n]


def cell_settings(name: str, base: SweepSettings) -> SweepSettings:
    if name not in CELLS:
        raise SystemExit(f"unknown cell {name!r}; cells: {', '.join(CELLS)}")
    return dataclasses.replace(base, **CELLS[name])


def check_settings(settings: list[SweepSettings]) -> None:
    """What can be checked before any heavy work: the broad corpus is installed where a cell reads it, the prompts
    exist and the dictionaries parse."""
    if any("broad" in (s.maxact_corpus, s.op_corpus) for s in settings):
        from tl_query_lens.broad_corpus import read_manifest

        read_manifest()  # InputError naming scripts/setup.sh --broad-corpus
    for s in settings:
        sweep_prompts(s.n_prompts)
    from tl_query_lens.sources import parse_sources

    for spec in dict.fromkeys(s.dictionary for s in settings):
        parse_sources(spec)  # an unknown release or a missing folder fails here, not in the first cell


def compute_cell(settings: SweepSettings, folder: Path, *, model=None, cache: Path | None = None) -> dict[str, Any]:
    """One Table-1 evaluation with ``settings``; the evaluation goes to ``folder/evaluation``."""
    import torch

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.operators import EngineConfig
    from tl_query_lens.query_lens.config import Table1Config
    from tl_query_lens.query_lens.table1 import PAPER_GPT2, evaluate_table1
    from tl_query_lens.sources import load_sources, parse_sources

    model = model if model is not None else load_model(settings.model, device=settings.device)
    loaded = load_sources(parse_sources(settings.dictionary), model, list(settings.layers))
    dictionaries = {d.label: d.sae for d in loaded}
    s = settings
    ev = load_corpus(s.maxact_corpus, model, n_seqs=s.maxact_seqs, seq_len=s.seq_len, split="evaluation", seed=s.seed)
    op = load_corpus(s.op_corpus, model, n_seqs=s.op_seqs, seq_len=s.seq_len, split="train", seed=s.seed)
    cache = cache or folder / "operators"
    cfg = Table1Config(
        protocol="paper",
        k=s.k,
        n_contexts=s.n_contexts,
        kl_targets=s.kl_targets,
        n_generate=s.n_generate,
        n_steps=s.n_steps,
        prompts=sweep_prompts(s.n_prompts),
        features_per_layer=s.features_per_layer,
        exclude_first_positions=s.exclude_first_positions,
        seed=s.seed,
        engine=EngineConfig(
            # one folder per operator corpus (a corpus given as a file path is named by its file name); the files
            # inside are keyed by dtype, so fp32 and bf16 sweeps share it
            cache_dir=str(cache / f"{Path(s.op_corpus).name}-{s.op_seqs}x{s.seq_len}-seed{s.seed}"),
            sweep_dtype=s.sweep_dtype,
            sweep_autocast=s.sweep_autocast,
        ),
        basis=s.basis,  # type: ignore[arg-type]
        checkpoint_dir=str(folder / "parts"),  # a stopped cell resumes dictionary by dictionary
        **s.extra,
    )
    result = evaluate_table1(model, dictionaries, op, ev, cfg=cfg)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        result.save(folder / "evaluation")  # under torchrun every rank holds the whole result
    rows = result.summary(seed=s.seed)
    return {
        "rows": rows,
        "paper": {m: PAPER_GPT2.get(m) for m in (r["method"] for r in rows)},
        "maxact_tokens": int(ev.numel()),
        "op_tokens": int(op.numel()),
        "n_prompts": s.n_prompts,
        "n_generate": s.n_generate,
        "features": {label: result.select([label]).features.tolist() for label in dictionaries},
        "seconds": result.config.get("seconds"),
    }


# --- report -----------------------------------------------------------------------------------------------------------


def _row(cell: dict[str, Any], method: str) -> dict[str, Any] | None:
    return next((r for r in cell["result"]["rows"] if r["method"] == method), None)


def _output_key(row: dict[str, Any]) -> str:
    return next(k for k in row if k.startswith("output@") and not k.endswith(("_lo", "_hi")))


def _ranks(cell: dict[str, Any]) -> str:
    return f" ({cell['ranks']} ranks)" if cell.get("ranks", 1) > 1 else ""


def report_table(cells: dict[str, dict[str, Any]], methods: tuple[str, ...] = METHODS) -> str:
    """Markdown: one row per cell, ``input / output`` mean [95 % CI] per method (output at the first KL target)."""
    head = "| cell | max-act tokens | prompts × tokens | operator tokens | " + " | ".join(methods) + " | wall |"
    lines = [head, "|" + "---|" * (len(methods) + 5)]
    for name, cell in cells.items():
        res = cell["result"]
        parts = []
        for m in methods:
            r = _row(cell, m)
            if r is None:
                parts.append("—")
                continue
            out = _output_key(r)
            parts.append(
                f"{r['input']:.2f} [{r['input_lo']:.2f}, {r['input_hi']:.2f}] / "
                f"{r[out]:.2f} [{r[out + '_lo']:.2f}, {r[out + '_hi']:.2f}]"
            )
        lines.append(
            f"| {name} | {res['maxact_tokens']:,} | {res['n_prompts']} × {res['n_generate']} | {res['op_tokens']:,} | "
            + " | ".join(parts)
            + f" | {cell['wall_s'] / 60:.0f} min{_ranks(cell)} |"
        )
    return "\n".join(lines)


def svg_plot(title: str, x_labels: list[str], series: dict[str, list[tuple[float, float, float] | None]]) -> str:
    """A small line plot with 95 % interval bars: one line per series over categorical x (mean, lo, hi) in %."""
    width, height, left, right, top, bottom = 640, 360, 60, 170, 30, 60
    values = [v for pts in series.values() for p in pts if p is not None for v in p]
    y_max = max(5.0, math.ceil(max(values, default=1.0) / 5) * 5)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * (i + 0.5) / max(1, len(x_labels)))

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_max)

    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
            f'font-size="11"><rect width="100%" height="100%" fill="white"/>'
        ),
        f'<text x="{left}" y="18" font-size="13">{title}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
    ]
    for tick in range(0, int(y_max) + 1, max(1, int(y_max) // 5)):
        out.append(f'<text x="{left - 6}" y="{y(tick) + 4}" text-anchor="end">{tick}</text>')
        out.append(f'<line x1="{left}" y1="{y(tick)}" x2="{left + plot_w}" y2="{y(tick)}" stroke="#eee"/>')
    out.append(f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})">score %</text>')
    for i, label in enumerate(x_labels):
        out.append(f'<text x="{x(i)}" y="{top + plot_h + 18}" text-anchor="middle">{label}</text>')
    for s, (name, pts) in enumerate(series.items()):
        colour = colours[s % len(colours)]
        shift = (s - (len(series) - 1) / 2) * 4  # keep the interval bars apart
        coords = [(x(i) + shift, p) for i, p in enumerate(pts) if p is not None]
        if len(coords) > 1:
            path = " ".join(f"{cx:.1f},{y(p[0]):.1f}" for cx, p in coords)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}"/>')
        for cx, (mean, lo, hi) in coords:
            out.append(f'<line x1="{cx:.1f}" y1="{y(lo):.1f}" x2="{cx:.1f}" y2="{y(hi):.1f}" stroke="{colour}"/>')
            out.append(f'<circle cx="{cx:.1f}" cy="{y(mean):.1f}" r="3" fill="{colour}"/>')
        ly = top + 14 * s
        out.append(f'<line x1="{width - right + 10}" y1="{ly}" x2="{width - right + 30}" y2="{ly}" stroke="{colour}"/>')
        out.append(f'<text x="{width - right + 34}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


def factor_series(
    cells: dict[str, dict[str, Any]], factor: str, methods: tuple[str, ...] = METHODS
) -> tuple[list[str], dict[str, list[tuple[float, float, float] | None]]]:
    """x labels and (mean, lo, hi) per method side (input, output) for the base cell and the factor's cells."""
    points = [("base", BASE_LABEL[factor])] + [(name, label) for name, _, label in FACTORS[factor]]
    labels = [label for _, label in points]
    series: dict[str, list[tuple[float, float, float] | None]] = {}
    for m in methods:
        for side in ("input", "output"):
            pts = []
            for name, _ in points:
                r = _row(cells[name], m) if name in cells else None
                key = side if r is None or side == "input" else _output_key(r)
                pts.append(None if r is None else (r[key], r[key + "_lo"], r[key + "_hi"]))
            series[f"{m} {side}"] = pts
    return labels, series


def _same_feature_pairs(
    out: Path, cells: dict[str, dict[str, Any]], pairs: list[tuple[str, str]] | None
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The (cell, reference) pairs (default: every cell against base) whose two cells are saved under ``out`` (a cell
    read from a records file has no saved evaluation here) and score the same features, with their evaluations."""
    from tl_query_lens.query_lens.evaluation import SignatureEvaluation

    def saved(name: str) -> bool:
        return name in cells and (_cells.cell_dir(out, name) / "evaluation").is_dir()

    if pairs is None:
        pairs = [(n, "base") for n in cells if n != "base"]
    pairs = [
        (n, r)
        for n, r in pairs
        if saved(n) and saved(r) and cells[n]["result"]["features"] == cells[r]["result"]["features"]
    ]
    loaded = {n: SignatureEvaluation.load(_cells.cell_dir(out, n) / "evaluation") for pair in pairs for n in pair}
    return pairs, loaded


def _pair_table(pairs: list[tuple[str, str]], loaded: dict[str, Any], entry) -> str:
    """Markdown with one row per pair and one column per method of the first reference; ``entry(ev, e, ref, m)``
    formats one method (index ``e`` in the cell's evaluation, ``m`` in the reference's); "—" where one lacks it.
    A row is named by its cell, and by its reference too where that is not base."""
    columns = loaded[pairs[0][1]].methods
    lines = []
    for name, reference in pairs:
        ev, ref = loaded[name], loaded[reference]
        parts = [
            entry(ev, ev.methods.index(method), ref, ref.methods.index(method))
            if method in ev.methods and method in ref.methods
            else "—"
            for method in columns
        ]
        label = name if reference == "base" else f"{name} against {reference}"
        lines.append(f"| {label} | " + " | ".join(parts) + " |")
    head = "| cell | " + " | ".join(columns) + " |"
    return "\n".join([head, "|" + "---|" * (len(columns) + 1), *lines])


def signature_overlap(out: Path, cells: dict[str, dict[str, Any]], pairs: list[tuple[str, str]] | None = None) -> str:
    """Markdown: per (cell, reference) pair that scores the same features (default: every cell against base), each
    method's mean top-k Jaccard with the reference's signatures and, in brackets, how many features' input score
    changed. Pairs whose cells are not saved here (read from a records file) or draw other features are left out;
    empty when none is left.

    A cell with other operators can keep a score while its signatures change (and the reverse): this reads the
    signatures themselves. Methods that do not read the varied factor are a control (1.00, 0 changed).
    """
    from tl_query_lens.primitives import row_jaccard

    pairs, loaded = _same_feature_pairs(out, cells, pairs)
    if not pairs:
        return ""

    def entry(ev, e: int, ref, m: int) -> str:
        sims = row_jaccard(ev.signature_ids[e], ref.signature_ids[m])  # the -1 padding left out
        changed = int((ev.input_scores[e] != ref.input_scores[m]).sum())
        return f"{sims.mean().item():.2f} ({changed})"

    return _pair_table(pairs, loaded, entry)


def score_change(out: Path, cells: dict[str, dict[str, Any]], pairs: list[tuple[str, str]] | None = None) -> str:
    """Markdown: per (cell, reference) pair that scores the same features (pairs as :func:`signature_overlap`), each
    method's mean per-feature change of the input / output score (output at the first KL target), in points, with
    a paired percentile-bootstrap 95 % CI over features (one set of resamples for every cell and method).

    Two cells' own intervals overlap far more easily than their paired difference crosses zero: this is the test
    of whether a factor moves a score on the same features.
    """
    from tl_query_lens.primitives import bootstrap_indices, mean_ci

    pairs, loaded = _same_feature_pairs(out, cells, pairs)
    if not pairs:
        return ""
    idx = bootstrap_indices(len(loaded[pairs[0][1]].features))

    def entry(ev, e: int, ref, m: int) -> str:
        sides = []
        for diff in (ev.input_scores[e] - ref.input_scores[m], ev.output_scores[e, 0] - ref.output_scores[m, 0]):
            ci = {k: round(v, 2) + 0.0 for k, v in mean_ci("d", diff, idx).items()}  # + 0.0: no "-0.00"
            sides.append(f"{ci['d']:+.2f} [{ci['d_lo']:+.2f}, {ci['d_hi']:+.2f}]")
        return " / ".join(sides)

    return _pair_table(pairs, loaded, entry)


def report(out: Path, records: Path | None = None, base: SweepSettings | None = None) -> str:
    """The table, the signature overlap and the plots of the done cells, merged with ``records`` (the
    ``table1_sweep.json`` of an earlier report) for cells not done under ``out``; all go to ``out``. With ``base``
    (this run's options), a record measured under other settings is refused."""
    expected = {n: asdict(cell_settings(n, base)) for n in CELLS} if base is not None else None
    cells = _cells.load_cells(out, list(CELLS), records, expected)
    if not cells:
        return "no cell done yet"
    out.mkdir(parents=True, exist_ok=True)
    text = report_table(cells) + _cells.merged_note(cells, records, out)
    overlap = signature_overlap(out, cells)
    if overlap:
        text += (
            "\n\nSignatures against base's (same features): mean top-k Jaccard per method, and in brackets how many "
            "features' input score changed\n\n" + overlap
        )
    chain = ["base"] + [name for name, _, _ in FACTORS["ops"]]
    steps = list(zip(chain[1:], chain[:-1], strict=True))
    successive = signature_overlap(out, cells, steps)
    if successive:
        text += (
            "\n\nSignatures between successive operator corpora (fp32; whether they settle as the corpus grows): "
            "mean top-k Jaccard per method, and in brackets how many features' input score changed\n\n" + successive
        )
    against_base = [(n, "base") for n in cells if n != "base"]
    change = score_change(out, cells, against_base + [p for p in steps if p[1] != "base"])
    if change:
        text += (
            "\n\nScore change on the same features, paired: mean per-feature difference of the input / output "
            "score in points (output at the first KL target), with a paired 95 % bootstrap interval over features\n\n"
            + change
        )
    for factor in FACTORS:
        labels, series = factor_series(cells, factor)
        (out / f"plot_{factor}.svg").write_text(svg_plot(f"Table 1 against {factor}", labels, series))
    (out / "table1_sweep.md").write_text(text + "\n")
    (out / "table1_sweep.json").write_text(json.dumps(cells, indent=1, default=str))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _cells.add_run_options(
        parser, CELLS, "results/table1_sweep", "table1_sweep.json (docs/reproduction/)", writes="table and plots"
    )
    parser.add_argument("--dictionary", default=SweepSettings.dictionary, help="dictionaries (default: the suite SAEs)")
    parser.add_argument("--layers", default=",".join(map(str, LAYERS)))
    parser.add_argument("--features-per-layer", type=int, default=13)
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="bf16 autocast of the max-activating search, generation and steering passes (Table1Config.autocast); "
        "give it its own --out: its cells are not comparable with fp32 ones",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="torchrun ranks per cell: each rank evaluates every ranks-th dictionary, the operator corpus is split "
        "between them (default 1: one python process)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    base = SweepSettings(
        dictionary=args.dictionary,
        layers=tuple(int(x) for x in args.layers.split(",")),
        features_per_layer=args.features_per_layer,
        seed=args.seed,
        model=args.model,
        device=args.device,
        extra={"autocast": True} if args.autocast else {},
    )
    if args.run_cell:
        settings = cell_settings(args.run_cell, base)
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        if distributed:
            import datetime

            import torch.distributed as dist

            # a rank waits for the others' evaluations (an hour each in the long cells): far beyond gloo's 30 min
            dist.init_process_group("gloo", timeout=datetime.timedelta(hours=24))
            if settings.device.startswith("cuda"):  # one GPU per rank
                settings = dataclasses.replace(settings, device=f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
        _cells.record_cell(
            out, args.run_cell, asdict(settings), lambda f: compute_cell(settings, f, cache=out / "operators")
        )
        if distributed:
            dist.destroy_process_group()
        return 0
    return _cells.run_then_report(
        __file__,
        args,
        argv,
        lambda names: check_settings([cell_settings(n, base) for n in names]),
        lambda: report(out, args.records, base),
        nproc=args.ranks,
    )


if __name__ == "__main__":
    sys.exit(main())
