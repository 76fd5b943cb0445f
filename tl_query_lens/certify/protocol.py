"""Certification under a named protocol (``protocol=``): the paper's (arXiv 2606.18383, the authors' released code,
``certify/protocols/paper.py``) or this project's (``"tlql"``, formerly ``"fixed-pool"``, ``certify/protocols/tlql.py``).

The protocol files hold what differs (how the evaluation windows are drawn, which bound is the headline); both report
every bound variant, the direct bound on the clean model and N* twice: the closed form (A/(log₂|V| − C))² and the first
point of the N schedule below log₂|V|.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from sae_lens import SAE
from transformer_lens import HookedTransformer

from tl_query_lens.certify.bound import hoeffding_coefficient, log_binomial
from tl_query_lens.certify.certify import Certificate, certificate_prefix
from tl_query_lens.certify.config import ProtocolCertifyConfig
from tl_query_lens.certify.protocols import PROTOCOLS
from tl_query_lens.certify.sweep import LayerSweep, certify_layers
from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import load_corpus
from tl_query_lens.estimates import estimate
from tl_query_lens.presentation import Table, numeric_fields
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)

HEADLINE: dict[str, str] = {name: module.HEADLINE for name, module in PROTOCOLS.items()}


def direct_bound(loss_clean: torch.Tensor, *, delta_bits: float, delta: float) -> float:
    """R̂(M) + Δ√(ln(1/δ)/2N): one Hoeffding term on the clean model's own losses (the authors' ``Direct_U_M``)."""
    n = int(loss_clean.shape[0])
    return loss_clean.double().mean().item() + delta_bits * math.sqrt(math.log(1 / delta) / (2 * n))


def closed_form_n_star(constant: float, coefficient: float, baseline_bits: float) -> float:
    """N* = (A/(log₂|V| − C))², the real-valued N where C + A/√N meets log₂|V| (inf when C ≥ log₂|V|)."""
    return math.inf if constant >= baseline_bits else (coefficient / (baseline_bits - constant)) ** 2


def schedule_n_star(curve_n: list[int], curve_bound: list[float], baseline_bits: float) -> int | None:
    """The first N of the evaluated schedule with a bound below log₂|V| (None when none is)."""
    return next((int(n) for n, u in zip(curve_n, curve_bound) if u < baseline_bits), None)


# The type of each :func:`protocol_row` entry (the table's columns); ``shuffled_<key>`` has the type of ``<key>``.
ROW_TYPES: dict[str, type | tuple[type, None]] = {
    "N": int,
    "n_cal": (int, None),
    "cal_tokens": (int, None),
    "P": int,
    "m": int,
    "nontrivial": bool,
    "nontrivial_occam": bool,
    "N_star_schedule": (int, None),
    "N_star_schedule_occam": (int, None),
}


def protocol_row(cert: Certificate, *, delta: float) -> dict[str, float | int | bool | None]:
    """Every reported scalar of one certificate, both bound variants, the direct bound and both N* readings, with
    the calibration windows and tokens its pool G* was built from (``n_cal``, ``cal_tokens``)."""
    constant = cert.R_hat + cert.eps_hat + cert.Delta * cert.eta_hat
    log_choose = log_binomial(cert.m, cert.P)
    a = hoeffding_coefficient(cert.Delta, delta)
    a_occam = hoeffding_coefficient(cert.Delta, delta, log_choose=log_choose)
    gap = cert.gap.double()
    n_cal, seq_len = cert.config.get("n_cal"), cert.config.get("seq_len")
    return {
        "N": cert.N,
        "n_cal": n_cal,
        "cal_tokens": None if n_cal is None or seq_len is None else n_cal * seq_len,
        "P": cert.P,
        "m": cert.m,
        "log_choose": log_choose,
        "R_hat": cert.R_hat,
        "eps_hat": cert.eps_hat,
        "eta_hat": cert.eta_hat,
        "Delta": cert.Delta,
        "bound": cert.bound,
        "bound_occam": cert.bound_occam,
        "R_hat_clean": cert.loss_clean.double().mean().item(),
        "bound_direct": direct_bound(cert.loss_clean, delta_bits=cert.Delta, delta=delta),
        "baseline_bits": cert.baseline_bits,
        "nontrivial": cert.nontrivial,
        "nontrivial_occam": cert.nontrivial_occam,
        "N_star_closed_form": closed_form_n_star(constant, a, cert.baseline_bits),
        "N_star_closed_form_occam": closed_form_n_star(constant, a_occam, cert.baseline_bits),
        "N_star_schedule": schedule_n_star(cert.curve_N, cert.curve_bound, cert.baseline_bits),
        "N_star_schedule_occam": schedule_n_star(cert.curve_N, cert.curve_bound_occam, cert.baseline_bits),
        "gap_mean": gap.mean().item(),
        "abs_gap_mean": gap.abs().mean().item(),
        "kl_bits": cert.kl_bits,
        "top1_agreement": cert.top1_agreement,
    }


def abs_gap_densities(gaps: list[torch.Tensor], *, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Histogram densities of |gap| on shared edges from 0 to the largest |gap| (each row integrates to 1)."""
    top = max(float(g.abs().max()) for g in gaps) if gaps else 1.0
    edges = torch.linspace(0.0, max(top, 1e-12), bins + 1, dtype=torch.float64)
    width = edges[1] - edges[0]
    rows = []
    for g in gaps:
        counts = torch.histc(g.abs().double(), bins=bins, min=0.0, max=float(edges[-1]))
        rows.append(counts / (counts.sum() * width))
    return edges, torch.stack(rows) if rows else torch.zeros(0, bins, dtype=torch.float64)


@dataclass
class ProtocolCertification(SavableResult):
    """Certificates of several proxies under one protocol.

    Attributes:
        protocol: which protocol. headline: the row key of the bound this protocol reports (``bound_occam`` for the
            paper, ``bound`` for tlql).
        labels: proxy labels, in row order.
        rows: per proxy, :func:`protocol_row` of the real proxy (+ ``shuffled_*`` keys with the ablation).
        n_documents: documents in the evaluation split. n_eligible: those long enough for one window (paper).
        one_window_per_document: whether the evaluation windows come from distinct documents.
        abs_gap_edges / abs_gap_density / abs_gap_density_shuffled: |gap| densities per proxy on shared edges.
        sweep: the certificates behind the rows (with curves and per-sequence gaps).
    """

    protocol: str
    headline: str
    labels: list[str]
    rows: list[dict[str, Any]]
    n_documents: int | None
    n_eligible: int | None
    one_window_per_document: bool
    abs_gap_edges: torch.Tensor
    abs_gap_density: torch.Tensor
    abs_gap_density_shuffled: torch.Tensor
    config: dict[str, Any] = field(default_factory=dict)
    sweep: LayerSweep | None = None

    def __post_init__(self) -> None:
        for row in self.rows:  # JSON stores inf as a string
            for key, value in row.items():
                if isinstance(value, str) and value in ("inf", "-inf", "nan"):
                    row[key] = float(value)

    def headline_bounds(self) -> dict[str, float]:
        """label → the headline bound of this protocol."""
        return {label: float(row[self.headline]) for label, row in zip(self.labels, self.rows)}

    def at_n(self, n: int) -> ProtocolCertification:
        """This certification on the first ``n`` evaluation windows only, rebuilt without the model from the
        saved per-window losses (:func:`~tl_query_lens.certify.certify.certificate_prefix`; same pools).

        Under the paper protocol the windows come from a seeded sample of distinct documents in random order, so
        the first ``n`` are a uniform draw of ``n`` documents: one run at the largest N gives the bounds at every
        smaller N (the same documents nested, so the rows at two N differ by N alone, not by another draw).

        Raises:
            ValueError: no per-window losses (``sweep`` is None) or ``n`` outside ``1..N``.
        """
        if self.sweep is None:
            raise ValueError("at_n needs the per-window losses (the result's sweep); this result holds none.")
        cfg = ProtocolCertifyConfig(**{**self.config, "n_eval": n})
        certify_cfg = cfg.certify_config()
        certs = {k: certificate_prefix(c, n, certify_cfg) for k, c in self.sweep.certificates.items()}
        shuffled = {k: certificate_prefix(c, n, certify_cfg) for k, c in self.sweep.shuffled.items()}
        sweep = LayerSweep(certs, shuffled, seed=self.sweep.seed)
        return summarise(
            {str(k): c for k, c in certs.items()},
            {str(k): c for k, c in shuffled.items()},
            cfg=cfg,
            n_documents=self.n_documents,
            n_eligible=self.n_eligible,
            one_window_per_document=self.one_window_per_document,
            sweep=sweep,
        )

    title: ClassVar[str] = "Certification under a protocol"

    def scalars(self) -> dict[str, float]:
        """``{label}/{headline}`` per proxy (the bound this protocol reports), and the split's sizes."""
        out = {f"{label}/{self.headline}": bound for label, bound in self.headline_bounds().items()}
        return out | numeric_fields(self, ("n_documents", "n_eligible", "one_window_per_document"))

    def tables(self) -> dict[str, Table]:
        """``certificates``: one row per proxy, every entry of :func:`protocol_row` (and ``shuffled_*``)."""
        keys = list(self.rows[0]) if self.rows else []
        columns = {"label": str, **{k: ROW_TYPES.get(k.removeprefix("shuffled_"), float) for k in keys}}
        return {
            "certificates": Table.build(
                columns, ([label, *(row[k] for k in keys)] for label, row in zip(self.labels, self.rows))
            )
        }


def summarise(
    certificates: Mapping[str, Certificate],
    shuffled: Mapping[str, Certificate],
    *,
    cfg: ProtocolCertifyConfig,
    n_documents: int | None = None,
    n_eligible: int | None = None,
    one_window_per_document: bool = False,
    sweep: LayerSweep | None = None,
) -> ProtocolCertification:
    """Build the protocol's result from finished certificates (no model needed)."""
    labels = [str(label) for label in certificates]
    rows = []
    for label, cert in certificates.items():
        row = protocol_row(cert, delta=cfg.delta)
        if label in shuffled:
            row.update({f"shuffled_{k}": v for k, v in protocol_row(shuffled[label], delta=cfg.delta).items()})
        rows.append(row)
    edges, density = abs_gap_densities([c.gap for c in certificates.values()], bins=cfg.bins)
    shuffled_gaps = [shuffled[label].gap for label in certificates if label in shuffled]
    if shuffled_gaps:
        edges, both = abs_gap_densities([c.gap for c in certificates.values()] + shuffled_gaps, bins=cfg.bins)
        density, density_shuffled = both[: len(labels)], both[len(labels) :]
    else:
        density_shuffled = torch.zeros(0, cfg.bins, dtype=torch.float64)
    return ProtocolCertification(
        protocol=cfg.protocol,
        headline=HEADLINE[cfg.protocol],
        labels=labels,
        rows=rows,
        n_documents=n_documents,
        n_eligible=n_eligible,
        one_window_per_document=one_window_per_document,
        abs_gap_edges=edges,
        abs_gap_density=density,
        abs_gap_density_shuffled=density_shuffled,
        config=dict(vars(cfg)),
        sweep=sweep,
    )


def forward_batches(n_cal: int, n_eval: int, batch_size: int, n_proxies: int) -> int:
    """Forward batches of a certificate pass: one calibration pass, then per evaluation batch one clean pass and one
    pass per proxy (shuffled twins included); the restricted re-runs of the few rows that leave the pool aside."""
    return math.ceil(n_cal / batch_size) + math.ceil(n_eval / batch_size) * (1 + n_proxies)


def certify_protocol(
    model: HookedTransformer,
    saes_by_label: Mapping[str, SAE],
    corpus: Any = "embedded",
    *,
    tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
    cfg: ProtocolCertifyConfig | None = None,
    **overrides: Any,
) -> ProtocolCertification:
    """Certify each dictionary under ``cfg.protocol`` (default ``"paper"``); all proxies share one clean pass.

    Args:
        model: the frozen model (needs a tokenizer: the windows are drawn from ``corpus`` here).
        saes_by_label: label → dictionary (SAELens SAE, transcoder or FF-KV).
        corpus: a corpus source as for :func:`~tl_query_lens.corpus.load_corpus`.
        tokens: (calibration, evaluation) windows already drawn, instead of ``corpus`` (fixed-pool only: the
            paper's evaluation windows come one per document).
        cfg: options; keywords override its fields.

    Raises:
        ValueError: ``n_eval`` larger than the documents the paper protocol can draw from (the message gives the
            count), or any error of :func:`~tl_query_lens.certify.certify.certify`.
    """
    cfg = resolve_config(ProtocolCertifyConfig, cfg, overrides)
    if tokens is not None and cfg.protocol == "paper":
        raise ValueError("tokens= is for the tlql protocol; the paper's draws one window per document.")
    protocol = PROTOCOLS[cfg.protocol]
    n_documents = n_eligible = None
    if tokens is not None:
        cal, ev = tokens
    else:
        cal = load_corpus(corpus, model, n_seqs=cfg.n_cal, seq_len=cfg.seq_len, split="calibration", seed=cfg.seed)
        ev, n_documents, n_eligible = protocol.evaluation_windows(model, corpus, cfg)
    shuffle = cfg.shuffle if isinstance(cfg.shuffle, bool) else list(cfg.shuffle)
    labelled: dict[int | str, Any] = {label: sae for label, sae in saes_by_label.items()}
    n_shuffled = len(labelled) if shuffle is True else len(shuffle or [])
    n_batches = forward_batches(len(cal), len(ev), cfg.batch_size, len(labelled) + n_shuffled)
    with estimate("certify", n_batches, "--n-eval").on_forward(model):
        sweep = certify_layers(model, labelled, cal, ev, cfg=cfg.certify_config(), shuffle=shuffle, seed=cfg.seed)
    return summarise(
        sweep.certificates,  # type: ignore[arg-type]  # labelled by the given (str) labels
        sweep.shuffled,  # type: ignore[arg-type]
        cfg=cfg,
        n_documents=n_documents,
        n_eligible=n_eligible,
        one_window_per_document=protocol.ONE_WINDOW_PER_DOCUMENT,
        sweep=sweep,
    )
