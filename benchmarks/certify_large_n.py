"""Certification under the paper's protocol at N ≥ 5,000 independent documents, on the 'broad' corpus.

docs/reproduction.md §1 certified the suite's residual SAEs (layers 6/12/18/24) and FF-KV at N = 409, the number of
documents of the embedded evaluation split, against the paper's N = 10k. The 'broad' corpus
(``scripts/setup.sh --broad-corpus``) has 10,003 evaluation documents, each long enough for one 32-token window, so N
can grow to 10k. Each cell is one dictionary family (``saes``: the four residual SAEs of ``tlql-saes-smollm2-135m``;
``ffkv``: FF-KV TopK-64 of the same layers) at one N and one calibration size (the pool G* is built from ``n_cal``
calibration windows, cut from the broad corpus' calibration split); the ``cal128`` cells read whether the depth
effect (which layer certifies) changes with the pool; ``saes-L24-Nall-cal512`` certifies the deepest SAE alone on
every eligible document, the check of its closed-form N* (the one layer that does not certify at N = 5,000). Whether
the depth effect changes with N is read from the cells themselves: the first n windows of a cell are a uniform draw
of n distinct documents, so the report adds rows at n = 1,000 / 2,500 / 5,000 below the cell's own N
(``<cell>@N1000``), rebuilt from the saved per-window losses (``ProtocolCertification.at_n``).
The N = 5,000 cells are the ``full`` size of ``tlql reproduce``'s ``certify_broad_*`` experiments (the same call,
``certify_sources``).

Every row names its pool: ``n_cal`` calibration windows of 32 tokens and ``cal_tokens``. The authors build G* from
70,000 windows (2,240,000 tokens, ``CALIBRATION_TOKENS`` in both released scripts); the broad calibration split holds
47,859 windows (1,531,488 tokens). The ``saes-L24-L28-N1000-cal<n>`` cells certify the deepest suite SAE (80 % of
the depth) and the layer-28 SAE (93 %, the depth of the authors' Llama layer 30 of 32) at N = 1,000 (the paper's
Fig. 2 caption) with the pool of the first n windows and, from the same two passes, the pools of the smaller
``CURVE`` sizes (rows ``<label> n_cal=<m>``; ``certify_many``'s ``pool_sizes``). Their calibration pass is shared:
each cell resumes after the windows an earlier cell read (``first_firing``'s checkpoint in ``<out>/partial``), so
running them in order costs one pass over the split. ``saes-L24-L28-Nall-calall`` is the authors' scale (every
window, every document); ``*-bf16`` cells run the passes under bf16 autocast (``saes-L24-N1000-cal512[-bf16]`` is
the check: bf16 moved the fixed-pool bound by 0.10 bits, so the curve runs in fp32). Which cells were measured, and
why the others were not: docs/certification.md, "At the authors' pool size".

Every cell runs in its own process and is resumable (``_cells.py``: command, wall time, peak memory per cell);
inside a cell the evaluation pass saves its per-window losses about once a minute (``checkpoint_dir``), so a stopped
cell resumes after its last saved window. The
report is one table: per cell and dictionary, N, n_cal, P of m, η̂, R̂, ε̂, the Occam and fixed-pool bounds against
log₂|V| and the closed-form N*.

    nice -n 19 python benchmarks/certify_large_n.py --out results/certify_large_n                     # every cell
    python benchmarks/certify_large_n.py --out results/certify_large_n --cells saes-N5000-cal512       # one cell
    python benchmarks/certify_large_n.py --out results/certify_large_n --report                       # table only
    python benchmarks/certify_large_n.py --out results/certify_large_n --report \
        --records <an earlier report's certify_large_n.json>                                  # with earlier cells
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _cells

from tl_query_lens.reproduce.experiments import BROAD_FAMILIES as FAMILIES
from tl_query_lens.reproduce.experiments import SUITE
from tl_query_lens.reproduce.experiments import SUITE_LAYERS as LAYERS

PREFIXES = (1000, 2500, 5000)  # N read from the first windows of a larger cell (ProtocolCertification.at_n)
CURVE = (512, 4096, 8192, 16384, 32768)  # calibration sizes of the pool-size curve below "every calibration window"


@dataclass
class CertifySettings:
    """One cell's settings (paper protocol).

    Attributes:
        dictionary / layers: a ``--dictionary`` spec and the layers of its FF-KV items.
        corpus: calibration and evaluation source (the evaluation windows: one per document).
        n_eval: N (None: every eligible evaluation document). n_cal: calibration windows of the pool (None: every
            window of the calibration split). pool_sizes: smaller calibration sizes certified from the same passes
            (the pool-size curve). autocast: bf16 autocast for the model passes.
        seq_len / k / delta / exclude_first_positions / shuffle / seed: as ``tlql certify --protocol paper``.
        model / device: the model.
    """

    dictionary: str = FAMILIES["saes"]
    layers: tuple[int, ...] = LAYERS
    corpus: str = "broad"
    n_eval: int | None = 5000
    n_cal: int | None = 512
    pool_sizes: tuple[int, ...] = ()
    autocast: bool = False
    seq_len: int = 32
    k: int = 64
    delta: float = 0.05
    exclude_first_positions: int = 1
    shuffle: bool = False
    seed: int = 0
    model: str = "smollm2-135m"
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


def _cells_table() -> dict[str, dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = {}
    for family, spec in FAMILIES.items():
        for n in (5000, None):  # smaller N (PREFIXES): read from the first windows of these (report)
            cells[f"{family}-N{n or 'all'}-cal512"] = {"dictionary": spec, "n_eval": n, "n_cal": 512}
        cells[f"{family}-N5000-cal128"] = {"dictionary": spec, "n_eval": 5000, "n_cal": 128}
    # The deepest SAE alone at every document: the one layer that does not certify at N = 5,000, whose closed-form
    # N* (5,662 there) predicts it does by N = 10k; a check of that extrapolation at ~1/3 of saes-Nall's cost.
    deepest = FAMILIES["saes"].split(",")[-1]
    cells[f"saes-L{LAYERS[-1]}-Nall-cal512"] = {"dictionary": deepest, "n_eval": None, "n_cal": 512}
    # bf16 autocast check: the same small cell in fp32 and under autocast; the bound must move < 0.05 bits.
    for suffix, autocast in (("", False), ("-bf16", True)):
        cells[f"saes-L{LAYERS[-1]}-N1000-cal512{suffix}"] = {
            "dictionary": deepest,
            "n_eval": 1000,
            "n_cal": 512,
            "autocast": autocast,
        }
    # The authors' pool size: G* from every calibration window (47,859 windows, 1.53M tokens; the authors use 70,000
    # windows, 2.24M tokens) for the deepest suite SAE (80 % depth) and the layer-28 SAE (93 % depth, that of the
    # authors' Llama L30 of 32), with the pool-size curve (CURVE) read from the same passes. N = 1,000 (the paper's
    # Fig. 2 caption); each cell's calibration pass resumes after the windows the previous cell read (shared
    # checkpoint), so running them in order costs one pass over the calibration split.
    pair = f"{deepest},{SUITE}:blocks.28.hook_resid_post"
    for n_cal in (*CURVE[1:], None):
        below = tuple(c for c in CURVE if n_cal is None or c < n_cal)
        for suffix, autocast in (("", False), ("-bf16", True)):
            cells[f"saes-L24-L28-N1000-cal{n_cal or 'all'}{suffix}"] = {
                "dictionary": pair,
                "n_eval": 1000,
                "n_cal": n_cal,
                "pool_sizes": below,
                "autocast": autocast,
            }
    cells["saes-L24-L28-Nall-calall"] = {"dictionary": pair, "n_eval": None, "n_cal": None, "pool_sizes": CURVE}
    return cells


CELLS = _cells_table()
ROW_KEYS = (
    "N",
    "n_cal",
    "cal_tokens",
    "P",
    "m",
    "eta_hat",
    "R_hat",
    "eps_hat",
    "bound",
    "bound_occam",
    "baseline_bits",
    "nontrivial_occam",
    "N_star_closed_form_occam",
)


def cell_settings(name: str, base: CertifySettings) -> CertifySettings:
    if name not in CELLS:
        raise SystemExit(f"unknown cell {name!r}; cells: {', '.join(CELLS)}")
    return dataclasses.replace(base, **CELLS[name])


def check_settings(settings: list[CertifySettings]) -> None:
    """Before any heavy work: the broad corpus is installed where a cell reads it and the dictionaries parse."""
    if any(s.corpus == "broad" for s in settings):
        from tl_query_lens.broad_corpus import read_manifest

        read_manifest()  # InputError naming scripts/setup.sh --broad-corpus
    from tl_query_lens.sources import parse_sources

    for spec in dict.fromkeys(s.dictionary for s in settings):
        parse_sources(spec)  # an unknown release or a missing folder fails here, not in the first cell


def compute_cell(settings: CertifySettings, folder: Path, *, model=None) -> dict[str, Any]:
    """One paper-protocol certification with ``settings``; the full result goes to ``folder/certification``."""
    from tl_query_lens import load_model
    from tl_query_lens.certify.config import ProtocolCertifyConfig
    from tl_query_lens.releases import shipped_only
    from tl_query_lens.reproduce.experiments import certify_sources

    s = settings
    model = model if model is not None else load_model(s.model, device=s.device)
    cfg = ProtocolCertifyConfig(
        protocol="paper",
        n_cal=s.n_cal,
        n_eval=s.n_eval,
        seq_len=s.seq_len,
        k=s.k,
        delta=s.delta,
        exclude_first_positions=s.exclude_first_positions,
        shuffle=s.shuffle,
        seed=s.seed,
        pool_sizes=tuple(s.pool_sizes),
        autocast=s.autocast,
        # a stopped cell resumes after its last saved window; the calibration pass is shared by the cells
        checkpoint_dir=str(folder.parent.parent / "partial"),
        **s.extra,
    )
    with shipped_only():  # the dictionaries as they ship (int8), not a float32 copy left in the user cache
        result = certify_sources(model, s.dictionary, s.corpus, cfg, tuple(s.layers))
    result.save(folder / "certification")
    return {
        "labels": list(result.labels),
        "rows": [{k: row[k] for k in ROW_KEYS if k in row} for row in result.rows],
        "n_cal": s.n_cal,
        "n_documents": result.n_documents,
        "n_eligible": result.n_eligible,
    }


def report_table(cells: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per cell and dictionary."""
    head = (
        "| cell | dictionary | N | n_cal (pool tokens) | P / m | η̂ | R̂ | ε̂ | fixed-pool | Occam | log₂\\|V\\| | certifies "
        "| N* (Occam) | wall |"
    )
    lines = [head, "|" + "---|" * 14]
    for name, cell in cells.items():
        res = cell["result"]
        wall = "prefix" if cell["wall_s"] is None else f"{cell['wall_s'] / 60:.0f} min"
        for label, r in zip(res["labels"], res["rows"]):
            n_cal = r.get("n_cal", res["n_cal"])  # records before the pool-size curve: one n_cal per cell
            tokens = r["cal_tokens"] if "cal_tokens" in r else n_cal * cell["settings"]["seq_len"]
            lines.append(
                f"| {name} | {label} | {r['N']} | {n_cal:,} ({tokens:,}) | {r['P']} / {r['m']} | {r['eta_hat']:.3f} | "
                f"{r['R_hat']:.2f} | {r['eps_hat']:.3f} | {r['bound']:.2f} | {r['bound_occam']:.2f} | "
                f"{r['baseline_bits']:.2f} | {'yes' if r['nontrivial_occam'] else 'no'} | "
                f"{r['N_star_closed_form_occam']:.4g} | {wall} |"
            )
    return "\n".join(lines)


def with_prefixes(
    out: Path, cells: dict[str, dict[str, Any]], earlier: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """``cells`` and, after each done cell, its rows at every N of :data:`PREFIXES` below its own N, read from its
    first windows without the model (``<cell>@N1000``; no wall time of their own). A cell without its saved
    certification here (read from a records file) takes those rows from ``earlier`` (the same file's records)."""
    from tl_query_lens.certify.protocol import ProtocolCertification

    merged: dict[str, dict[str, Any]] = {}
    for name, cell in cells.items():
        merged[name] = cell
        folder = _cells.cell_dir(out, name) / "certification"
        n_cell = min(r["N"] for r in cell["result"]["rows"])
        if "records_file" in cell:  # measured elsewhere: its smaller-N rows come from the same records
            merged |= {f"{name}@N{n}": earlier[f"{name}@N{n}"] for n in PREFIXES if f"{name}@N{n}" in (earlier or {})}
            continue
        if not folder.is_dir():
            continue
        if not any(n < n_cell for n in PREFIXES):
            continue
        whole = ProtocolCertification.load(folder)
        for n in (n for n in PREFIXES if n < n_cell):
            part = whole.at_n(n)
            rows = [{k: row[k] for k in ROW_KEYS if k in row} for row in part.rows]
            merged[f"{name}@N{n}"] = cell | {"result": cell["result"] | {"rows": rows}, "wall_s": None}
    return merged


def report(out: Path, records: Path | None = None, base: CertifySettings | None = None) -> str:
    """The table of the done cells (and their rows at smaller N), merged with ``records`` (the
    ``certify_large_n.json`` of an earlier report) for cells not done under ``out``; both files go to ``out``. With
    ``base`` (this run's options), a record measured under other settings is refused."""
    expected = {n: asdict(cell_settings(n, base)) for n in CELLS} if base is not None else None
    cells = _cells.load_cells(out, list(CELLS), records, expected)
    if not cells:
        return "no cell done yet"
    out.mkdir(parents=True, exist_ok=True)
    earlier = _cells.read_records(records) if records is not None else {}
    table = with_prefixes(out, cells, earlier)
    text = report_table(table) + _cells.merged_note(cells, records, out)
    (out / "certify_large_n.md").write_text(text + "\n")
    (out / "certify_large_n.json").write_text(json.dumps(table, indent=1, default=str))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _cells.add_run_options(parser, CELLS, "results/certify_large_n", "certify_large_n.json", writes="table")
    parser.add_argument("--corpus", default="broad")
    parser.add_argument("--shuffle", action="store_true", help="add the feature-shuffle ablation (doubles the cost)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    base = CertifySettings(
        corpus=args.corpus, shuffle=args.shuffle, seed=args.seed, model=args.model, device=args.device
    )
    if args.run_cell:
        settings = cell_settings(args.run_cell, base)
        _cells.record_cell(out, args.run_cell, asdict(settings), lambda f: compute_cell(settings, f))
        return 0
    return _cells.run_then_report(
        __file__,
        args,
        argv,
        lambda names: check_settings([cell_settings(n, base) for n in names]),
        lambda: report(out, args.records, base),
    )


if __name__ == "__main__":
    sys.exit(main())
