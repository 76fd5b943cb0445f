"""``tlql certify``: certificates of FF-KV or saved SAEs per layer, the shuffle ablation, plots and W&B, under this
project's fixed-pool protocol or the paper's (:func:`~tl_query_lens.certify.protocol.certify_protocol`)."""

from __future__ import annotations

import argparse
import math

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN = {"out": "results/certify", "layers": "0,6,12,18,24,29"}


def add_parser(subparsers) -> None:
    command(
        subparsers, "certify", help="certify the model through SAE / FF-KV proxies (risk bound)", configure=configure
    )


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.certify.config import ProtocolCertifyConfig

    taken = add_options(parser, RunConfig, skip=("n_seqs", "seq_len", "features"), defaults=RUN)
    add_options(
        parser,
        ProtocolCertifyConfig,
        taken=taken,
        defaults={"protocol": "tlql"},
        shown={"checkpoint_dir": "<--out>/partial"},
    )
    parser.set_defaults(func=run)


def _check_n_eval(n_eval: int | None, d_vocab: int, cfg) -> None:
    """An N too small for any non-trivial bound, refused before the model loads."""
    from tl_query_lens.certify.bound import hoeffding_coefficient, loss_range_bits, min_sequences
    from tl_query_lens.errors import InputError

    n_min = min_sequences(math.log2(d_vocab), hoeffding_coefficient(loss_range_bits(d_vocab, cfg.alpha), cfg.delta))
    if n_eval is not None and n_eval < n_min:
        raise InputError(
            f"--n-eval {n_eval} cannot give a non-trivial bound: the minimum is N = {n_min} evaluation sequences "
            f"(delta={cfg.delta}, alpha={cfg.alpha}); real proxies need far more (the README's runs use 1000)."
        )


def forward_batches(n_cal: int, n_eval: int, batch_size: int, n_proxies: int) -> int:
    """Forward batches of a fixed-pool certificate: one calibration pass, then per evaluation batch one clean pass and
    one pass per proxy (shuffled twins included); the restricted re-runs of the few rows that leave the pool aside."""
    return math.ceil(n_cal / batch_size) + math.ceil(n_eval / batch_size) * (1 + n_proxies)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens.budget import check_memory
    from tl_query_lens.certify import protocol
    from tl_query_lens.certify.plots import bound_vs_n_figure, gap_distribution_figure
    from tl_query_lens.certify.sweep import LayerSweep
    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.certify_paper import report_paper
    from tl_query_lens.cli.common import load_model, load_tokens, print_rows, tracker
    from tl_query_lens.demo_progress import announce, seconds_per_batch
    from tl_query_lens.errors import InputError
    from tl_query_lens.limits import check_limits, dims_of
    from tl_query_lens.paths import result_names
    from tl_query_lens.ranges import parse_layers
    from tl_query_lens.sources import load_sources, parse_sources

    run_cfg = build(RunConfig, args)
    # the evaluation pass saves its progress there, so a stopped run resumes where it was
    checkpoint = getattr(args, "checkpoint_dir", None) or str(Path(run_cfg.out) / "partial")
    cfg = build(protocol.ProtocolCertifyConfig, args, checkpoint_dir=checkpoint)
    dims = check_run(run_cfg, folders={"--checkpoint-dir": getattr(args, "checkpoint_dir", None)}, seq_len=cfg.seq_len)
    sources = parse_sources(run_cfg.dictionary)
    n_layers = len(parse_layers(run_cfg.layers, dims.n_layers if dims else None) or [0])
    n_dicts = sum(n_layers if s.kind == "ffkv" and s.layer is None else 1 for s in sources)
    check_memory({f"--bins {cfg.bins}": 3 * 8 * cfg.bins * 2 * (n_dicts + 1)}, "certify")
    if dims is not None:
        _check_n_eval(cfg.n_eval, dims.d_vocab, cfg)
    if cfg.rule == "topk" and all(s.kind == "ffkv" for s in sources):
        check_limits(dims, {"--k": (cfg.k, "d_mlp")}, run_cfg.model)
    model = load_model(run_cfg)
    check_limits(dims_of(model), {"--seq-len": (cfg.seq_len, "n_ctx")}, run_cfg.model)
    if dims is None:
        _check_n_eval(cfg.n_eval, model.cfg.d_vocab, cfg)
    loaded = load_sources(sources, model, parse_layers(run_cfg.layers, model.cfg.n_layers))
    narrowest = min(loaded, key=lambda d: int(d.sae.cfg.d_sae))
    if cfg.rule == "topk" and cfg.k > int(narrowest.sae.cfg.d_sae):
        raise InputError(
            f"--k {cfg.k} exceeds the {narrowest.sae.cfg.d_sae} features of {narrowest.label}; give --k ≤ "
            f"{narrowest.sae.cfg.d_sae}."
        )
    result_names([d.label for d in loaded], "--dictionary labels")  # one folder per certificate
    saes = {d.label: d.sae for d in loaded}
    out = Path(run_cfg.out)
    if cfg.protocol == "paper":
        return report_paper(protocol.certify_protocol(model, saes, run_cfg.corpus, cfg=cfg), run_cfg, args, cfg)
    cal = load_tokens(run_cfg, model, "calibration", n_seqs=cfg.n_cal)
    ev = load_tokens(run_cfg, model, "evaluation", n_seqs=cfg.n_eval or 1000)
    n_shuffled = len(saes) if cfg.shuffle is True else len(list(cfg.shuffle or []))
    n_batches = forward_batches(len(cal), len(ev), cfg.batch_size, len(saes) + n_shuffled)
    announce("certify", n_batches, seconds_per_batch(model, ev[: cfg.batch_size]), "--n-eval")
    sweep = protocol.certify_protocol(model, saes, tokens=(cal, ev), cfg=cfg).sweep
    assert sweep is not None  # certify_protocol attaches the sweep behind its rows
    sweep.save(out)
    with tracker(run_cfg, "certify", args, certify=cfg) as track:
        table = track.log_table("certificates", list(LayerSweep.COLUMNS), sweep.rows())
        times = sweep.times
        track.log_scalars(
            "times",
            {"clean_s": times.clean, "proxy_s": times.proxy, "restricted_s": times.restricted, "pool_s": times.pool},
        )
        real = {str(label): cert for label, cert in sweep.certificates.items()}  # the --dictionary labels
        track.log_plot("bound_vs_N", bound_vs_n_figure(real))
        track.log_plot("bound_occam_vs_N", bound_vs_n_figure(real, occam=True, title="Occam bound vs N"))
        if sweep.shuffled:
            shuffled = {str(label): cert for label, cert in sweep.shuffled.items()}
            track.log_plot("gap_real_vs_shuffled", gap_distribution_figure(real, shuffled))
            track.log_plot("bound_vs_N_shuffled", bound_vs_n_figure(shuffled, title="Shuffled proxies: bound vs N"))
        track.log_artifact("certificates", [p for p in out.iterdir() if (p / "result.json").exists()])
    print(f"certificates: {table}")
    print_rows(LayerSweep.COLUMNS, sweep.rows())
    return 0
