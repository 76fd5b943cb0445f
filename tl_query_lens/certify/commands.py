"""``tlql certify`` (:class:`~tl_query_lens.certify.config.CertifyCommandConfig`): the checks before the model loads,
the run under either protocol, and the result of the paper protocol's run."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from transformer_lens import HookedTransformer

from tl_query_lens import corpus
from tl_query_lens.budget import check_memory
from tl_query_lens.certify import protocol
from tl_query_lens.certify.bound import hoeffding_coefficient, loss_range_bits, min_sequences
from tl_query_lens.certify.config import CertifyCommandConfig
from tl_query_lens.certify.protocol import ROW_TYPES, ProtocolCertification, ProtocolCertifyConfig
from tl_query_lens.certify.sweep import LayerSweep
from tl_query_lens.errors import InputError
from tl_query_lens.limits import ModelDims, check_limits, dims_of
from tl_query_lens.paths import check_folder, result_names
from tl_query_lens.presentation import Table
from tl_query_lens.ranges import parse_layers
from tl_query_lens.results import SavableResult
from tl_query_lens.sources import load_sources, parse_sources

#: The columns of the paper protocol's table, after the label (the ``shuffled_*`` ones follow with the ablation).
PAPER_COLUMNS = (
    "N",
    "P",
    "m",
    "R_hat",
    "eps_hat",
    "eta_hat",
    "log_choose",
    "bound_occam",
    "bound",
    "bound_direct",
    "R_hat_clean",
    "baseline_bits",
    "nontrivial_occam",
    "N_star_closed_form_occam",
    "N_star_schedule_occam",
    "N_star_closed_form",
    "N_star_schedule",
    "gap_mean",
    "abs_gap_mean",
    "kl_bits",
    "top1_agreement",
)
SHUFFLED_COLUMNS = ("shuffled_bound_occam", "shuffled_abs_gap_mean", "shuffled_gap_mean")


@dataclass
class PaperCertificates(SavableResult):
    """``tlql certify --protocol paper``: the protocol's result, saved without its certificates.

    Attributes:
        protocol_paper: the certification (its ``sweep`` left out), saved in ``<out>/protocol_paper``.
    """

    protocol_paper: ProtocolCertification

    title: ClassVar[str] = "Certification under the paper protocol"

    def scalars(self) -> dict[str, float]:
        """The headline bound per proxy and the evaluation split's sizes (:class:`ProtocolCertification`)."""
        return self.protocol_paper.scalars()

    def tables(self) -> dict[str, Table]:
        """``certificates_paper_protocol``: one row per proxy, the label then :data:`PAPER_COLUMNS` (and the shuffled
        twin's headline and gaps with the ablation)."""
        result = self.protocol_paper
        shuffled = [c for c in SHUFFLED_COLUMNS if result.rows and c in result.rows[0]]
        keys = [*PAPER_COLUMNS, *shuffled]
        columns = {"label": str, **{k: ROW_TYPES.get(k.removeprefix("shuffled_"), float) for k in keys}}
        rows = ([label, *(row[k] for k in keys)] for label, row in zip(result.labels, result.rows))
        return {"certificates_paper_protocol": Table.build(columns, rows)}

    def summary_line(self) -> str:
        result = self.protocol_paper
        return (
            f"paper protocol ({result.n_documents} evaluation documents, {result.n_eligible} long enough; "
            f"headline = {result.headline})"
        )


def check_n_eval(n_eval: int | None, d_vocab: int, cfg: ProtocolCertifyConfig) -> None:
    """An N too small for any non-trivial bound, refused before the model loads (or before any pass)."""
    n_min = min_sequences(math.log2(d_vocab), hoeffding_coefficient(loss_range_bits(d_vocab, cfg.alpha), cfg.delta))
    if n_eval is not None and n_eval < n_min:
        raise InputError(
            f"--n-eval {n_eval} cannot give a non-trivial bound: the minimum is N = {n_min} evaluation sequences "
            f"(delta={cfg.delta}, alpha={cfg.alpha}); real proxies need far more (the README's runs use 1000)."
        )


def check_certify(cfg: CertifyCommandConfig, dims: ModelDims | None) -> None:
    """``tlql certify`` before the model loads: the checkpoint folder, the dictionaries, the memory of the |gap|
    densities, N against the smallest non-trivial one and the TopK size against the model."""
    run, cert = cfg.run, cfg.protocol
    if cert.checkpoint_dir:
        check_folder(cert.checkpoint_dir, "--checkpoint-dir")
    sources = parse_sources(run.dictionary)
    n_layers = len(parse_layers(run.layers, dims.n_layers if dims else None) or [0])
    n_dicts = sum(n_layers if s.kind == "ffkv" and s.layer is None else 1 for s in sources)
    check_memory({f"--bins {cert.bins}": 3 * 8 * cert.bins * 2 * (n_dicts + 1)}, "certify")
    if dims is not None:
        check_n_eval(cert.n_eval, dims.d_vocab, cert)
    if cert.rule == "topk" and all(s.kind == "ffkv" for s in sources):
        check_limits(dims, {"--k": (cert.k, "d_mlp")}, run.model)


def run_certify(model: HookedTransformer, cfg: CertifyCommandConfig) -> LayerSweep | PaperCertificates:
    """``tlql certify``: every dictionary of ``--dictionary`` certified under ``--protocol``.

    The ``tlql`` protocol returns the :class:`~tl_query_lens.certify.sweep.LayerSweep` (one folder per certificate
    under ``--out``, the table, the time split and the bound / gap plots); its evaluation pass saves its progress in
    ``--checkpoint-dir`` (default ``<out>/partial``), so a stopped run resumes. The paper protocol returns
    :class:`PaperCertificates`.
    """
    run = cfg.run
    cert = replace(cfg.protocol, checkpoint_dir=cfg.protocol.checkpoint_dir or str(Path(run.out) / "partial"))
    check_limits(dims_of(model), {"--seq-len": (cert.seq_len, "n_ctx")}, run.model)
    check_n_eval(cert.n_eval, model.cfg.d_vocab, cert)
    loaded = load_sources(parse_sources(run.dictionary), model, parse_layers(run.layers, model.cfg.n_layers))
    narrowest = min(loaded, key=lambda d: int(d.sae.cfg.d_sae))
    if cert.rule == "topk" and cert.k > int(narrowest.sae.cfg.d_sae):
        raise InputError(
            f"--k {cert.k} exceeds the {narrowest.sae.cfg.d_sae} features of {narrowest.label}; give --k ≤ "
            f"{narrowest.sae.cfg.d_sae}."
        )
    result_names([d.label for d in loaded], "--dictionary labels")  # one folder per certificate
    saes: dict[str, Any] = {d.label: d.sae for d in loaded}
    if cert.protocol == "paper":
        paper = protocol.certify_protocol(model, saes, run.corpus, cfg=cert)
        return PaperCertificates(protocol_paper=replace(paper, sweep=None))
    cal = corpus.load_corpus(
        run.corpus, model, n_seqs=cert.n_cal, seq_len=cert.seq_len, split="calibration", seed=run.seed
    )
    ev = corpus.load_corpus(
        run.corpus, model, n_seqs=cert.n_eval or 1000, seq_len=cert.seq_len, split="evaluation", seed=run.seed
    )
    sweep = protocol.certify_protocol(model, saes, tokens=(cal, ev), cfg=cert).sweep
    assert sweep is not None  # certify_protocol attaches the sweep behind its rows
    return sweep
