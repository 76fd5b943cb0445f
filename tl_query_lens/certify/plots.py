"""Plotly figures of certificates: bound vs N per layer, and per-sequence gap distributions real vs shuffled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # certify.py draws its figures with these functions
    from tl_query_lens.certify.certify import Certificate


def bound_vs_n_figure(
    certificates: Mapping[str, Certificate], *, title: str = "Certificate bound vs N", occam: bool = False
):
    """One line per proxy: U (or U_occam) at each prefix N of the evaluation split, with log₂|V| dashed."""
    import plotly.graph_objects as go

    fig = go.Figure()
    baseline = None
    for label, cert in certificates.items():
        ys = cert.curve_bound_occam if occam else cert.curve_bound
        fig.add_trace(go.Scatter(x=cert.curve_N, y=ys, mode="lines+markers", name=str(label)))
        baseline = cert.baseline_bits
    if baseline is not None:
        fig.add_hline(y=baseline, line_dash="dash", annotation_text=f"log2|V| = {baseline:.2f} bits")
    fig.update_layout(
        title=title,
        xaxis_title="N (evaluation sequences)",
        yaxis_title="bound U (bits)",
        xaxis_type="log",
        template="plotly_white",
    )
    return fig


def gap_distribution_figure(
    real: Mapping[str, Certificate],
    shuffled: Mapping[str, Certificate],
    *,
    title: str = "Per-sequence reconstruction gap ℓ(S∘M) − ℓ(M): real vs shuffled",
):
    """Overlaid histograms of per-sequence gaps (bits), one pair per proxy label."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, cert in real.items():
        fig.add_trace(go.Histogram(x=cert.gap.tolist(), name=f"{label} real", opacity=0.6, nbinsx=60))
        if label in shuffled:
            fig.add_trace(
                go.Histogram(x=shuffled[label].gap.tolist(), name=f"{label} shuffled", opacity=0.6, nbinsx=60)
            )
    fig.update_layout(
        title=title, barmode="overlay", xaxis_title="gap (bits)", yaxis_title="sequences", template="plotly_white"
    )
    return fig
