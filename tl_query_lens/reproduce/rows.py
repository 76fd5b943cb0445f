"""The rows of ``tlql reproduce``: which figure of which experiment, the paper's number, and where to read it.

A row reads its figure through the result's presentation interface: ``("scalar", key)`` from ``scalars()``, or
``("table", name, match, column)`` from ``tables()[name]``, the record whose columns equal ``match``. A row with a
confidence interval names the two columns (or scalar keys) that hold it. What the docs state for each row (value
and interval, per size) is kept apart, in ``documented.json``, written from a measured run by ``--record``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tl_query_lens.errors import InputError
from tl_query_lens.presentation import Presentable
from tl_query_lens.reproduce.experiments import SUITE_LAYERS


@dataclass(frozen=True)
class Row:
    """One reproduced figure.

    Attributes:
        id: stable key (``section.figure``). section: the doc and section it belongs to. headline: the figure.
        paper: the paper's number as the paper states it (text). experiment: which experiment measures it.
        read: where the figure is in the experiment's result (module docstring). ci: where its interval is, if any.
        scale: multiplies the read value (e.g. 100 for a share shown in points). tolerance: the recorded interval
            is at least value ± tolerance (absolute, in the row's units), widened to the recorded run's CI where the
            figure has one (a CI of a few features can have zero width).
        full_only: the quick experiment does not measure it (e.g. layers the quick run leaves out).
    """

    id: str
    section: str
    headline: str
    paper: str
    experiment: str
    read: tuple[Any, ...]
    ci: tuple[Any, ...] | None = None
    scale: float = 1.0
    tolerance: float = 0.0
    full_only: bool = False

    def value(self, result: Presentable) -> tuple[float, float | None, float | None]:
        """(value, ci_lo, ci_hi) read from ``result`` (NaN where the result lacks the entry)."""
        v = _read(result, self.read)
        lo = hi = None
        if self.ci is not None:
            lo, hi = _read(result, self.ci[0]), _read(result, self.ci[1])
            lo, hi = lo * self.scale, hi * self.scale
        return v * self.scale, lo, hi


def _read(result: Presentable, where: tuple[Any, ...]) -> float:
    kind = where[0]
    if kind == "scalar":
        return float(result.scalars().get(where[1], math.nan))
    if kind == "table":
        _, name, match, column = where
        tables = result.tables()
        if name not in tables:
            return math.nan
        for record in tables[name].records():
            if all(record.get(k) == v for k, v in match.items()):
                value = record.get(column)
                return math.nan if value is None else float(value)
        return math.nan
    raise InputError(f"Unknown row reader {where!r}; use ('scalar', key) or ('table', name, match, column).")


def _cert(label: str, column: str) -> tuple[Any, ...]:
    return ("table", "certificates", {"label": label}, column)


def _table1(method: str, column: str) -> tuple[Any, ...]:
    return ("table", "summary", {"method": method}, column)


def _table1_rows(prefix: str, section: str, note: str, experiment: str) -> list[Row]:
    """Table 1's four headline rows (QL/LL key input, QL/LL value output) of one experiment."""
    return [
        Row(
            f"{prefix}.{method.lower()}.{side}",
            section,
            f"{method} {side} score (%){note}",
            paper,
            experiment,
            _table1(method, column),
            ci=(_table1(method, column + "_lo"), _table1(method, column + "_hi")),
            tolerance=2.0,
        )
        for method, side, column, paper in (
            ("QL_KEY", "input", "input", "39.32"),
            ("LL_KEY", "input", "input", "7.84"),
            ("QL_VALUE", "output", "output@0.25", "15.24"),
            ("LL_VALUE", "output", "output@0.25", "12.57"),
        )
    ]


def _compare(label: str, column: str) -> tuple[Any, ...]:
    return ("table", "comparison", {"label": label}, column)


CERT = "reproduction §1 certification"
READOUT = "reproduction §2 readout SAEs"
TABLE1 = "reproduction §3 Query Lens Table 1"
FFKV = "ffkv_comparison quality table"
CERT_BROAD = "reproduction §4.3 certification on the 'broad' corpus"
TABLE1_BROAD = "reproduction §4.2 Table 1, max-activating contexts from 'broad' prose"

ROWS: list[Row] = [
    Row(
        "cert.ffkv24.occam",
        CERT,
        "FF-KV TopK-64 L24 Occam bound (bits)",
        "13.739 < 16.969 (Llama-3.1-8B L30, N=10k)",
        "certify_ffkv",
        _cert("ffkv L24", "bound_occam"),
        tolerance=0.1,
    ),
    Row(
        "cert.ffkv24.direct",
        CERT,
        "direct bound on the clean model (bits)",
        "5.499",
        "certify_ffkv",
        _cert("ffkv L24", "bound_direct"),
        tolerance=0.1,
    ),
    Row(
        "cert.ffkv24.abs_gap",
        CERT,
        "mean |gap| (bits)",
        "-",
        "certify_ffkv",
        _cert("ffkv L24", "abs_gap_mean"),
        tolerance=0.01,
    ),
    Row(
        "cert.ffkv24.abs_gap_shuffled",
        CERT,
        "mean |gap|, feature-shuffled (bits)",
        "shifts of 6.5-9.5",
        "certify_ffkv",
        _cert("ffkv L24", "shuffled_abs_gap_mean"),
        tolerance=0.03,
    ),
    *[
        Row(
            f"cert.sae{layer}.occam",
            CERT,
            f"residual SAE L{layer} Occam bound (bits)",
            "layers 4-16 never certify; L30 does at N=10k",
            "certify_depth",
            _cert(f"sae L{layer}", "bound_occam"),
            tolerance=0.15,
        )
        for layer in SUITE_LAYERS
    ],
    *[
        Row(
            f"cert.sae{layer}.eta",
            CERT,
            f"residual SAE L{layer} pool mismatch eta-hat",
            "-",
            "certify_depth",
            _cert(f"sae L{layer}", "eta_hat"),
            tolerance=0.01,
        )
        for layer in SUITE_LAYERS
    ],
    *[
        Row(
            f"cert_broad.{family}{layer}.{key}",
            CERT_BROAD,
            f"{what} L{layer} {name}",
            paper,
            f"certify_broad_{family}",
            _cert(label, column),
            tolerance=tol,
        )
        for family, what, label_of, paper in (
            (
                "saes",
                "residual SAE",
                "sae L{layer} blocks.{layer}.hook_resid_post",
                "L30 certifies at N=10k; L4-16 never",
            ),
            ("ffkv", "FF-KV TopK-64", "ffkv L{layer}", "13.739 < 16.969 (L30, N=10k)"),
        )
        for layer in SUITE_LAYERS
        for label in (label_of.format(layer=layer),)
        for key, column, name, tol in (
            ("occam", "bound_occam", "Occam bound (bits)", 0.15),
            ("eta", "eta_hat", "pool mismatch eta-hat", 0.01),
        )
    ],
    Row(
        "readout.top1",
        READOUT,
        "top-1 agreement of h·Ŵ with h·W",
        "0.75-0.90",
        "readout_paper",
        ("scalar", "top1"),
        tolerance=0.02,
    ),
    Row(
        "readout.coverage",
        READOUT,
        "coverage (sign kept, rho0 < 0.5)",
        "0.72-0.81",
        "readout_paper",
        ("scalar", "coverage"),
        ci=(("scalar", "coverage_ci_lo"), ("scalar", "coverage_ci_hi")),
        tolerance=0.02,
    ),
    Row("readout.rho0", READOUT, "rho0 median", "reported", "readout_paper", ("scalar", "rho0_median"), tolerance=0.02),
    Row(
        "readout.margin",
        READOUT,
        "margin over the best baseline (points)",
        "+8.9 to +17.3",
        "readout_paper",
        ("scalar", "margin_over_best_baseline"),
        scale=100.0,
        tolerance=2.0,
    ),
    Row(
        "readout.r2",
        READOUT,
        "ablation fit R² (through origin)",
        "0.83-0.93",
        "readout_paper",
        ("scalar", "ablation_r2"),
        tolerance=0.05,
    ),
    Row(
        "readout.r2_control",
        READOUT,
        "ablation fit R², random-feature control",
        "≤ 0.06",
        "readout_paper",
        ("scalar", "ablation_r2_control"),
        tolerance=0.05,
    ),
    *_table1_rows("table1", TABLE1, "", "table1_saes"),
    *_table1_rows("table1_broad", TABLE1_BROAD, ", contexts from prose", "table1_broad"),
    *[
        Row(
            f"ffkv.L{layer}.{key}.{column}",
            FFKV,
            f"L{layer} {label}: {name}",
            paper,
            "ffkv_comparison",
            _compare(f"L{layer} {label}", column),
            tolerance=tol,
            full_only=layer != 24,
        )
        for layer in SUITE_LAYERS
        for key, label in (("topk32", "FF-KV TopK-32"), ("sae", "SAE"), ("transcoder", "transcoder"))
        for column, name, paper, tol in (
            ("explained_variance", "explained variance", "-", 0.02),
            ("ce_delta", "CE change (nats)", "-", 0.01),
        )
    ],
]


def rows_for(size: str, experiments: set[str] | None = None) -> list[Row]:
    """The rows a run of ``size`` measures (optionally only those of ``experiments``)."""
    return [
        r for r in ROWS if (size == "full" or not r.full_only) and (experiments is None or r.experiment in experiments)
    ]
