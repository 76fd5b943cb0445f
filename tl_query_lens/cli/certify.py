"""``tlql certify``: certificates (DESIGN §7) of FF-KV or saved SAEs per layer, shuffle ablation, plots, W&B."""

from __future__ import annotations

import argparse
import logging

from tl_query_lens.cli import add_common_args
from tl_query_lens.cli.dictionaries import add_dictionary_arg

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("certify", help="certify the model through SAE / FF-KV proxies (risk bound)")
    add_common_args(parser, out="results/certify")
    parser.add_argument(
        "--layers",
        default="0,6,12,18,24,29",
        help="FF-KV layers, e.g. '3,5' or '0-29' or 'all' (SAEs are read at their own hook)",
    )
    add_dictionary_arg(parser)  # all dictionaries share one clean pass
    parser.add_argument("--n-cal", type=int, default=1000, help="calibration sequences (builds the pool G*)")
    parser.add_argument(
        "--n-eval",
        type=int,
        default=None,
        help="evaluation sequences N (disjoint split); default 1000 (fixed-pool) or one window from "
        "every evaluation document (paper)",
    )
    parser.add_argument(
        "--protocol",
        choices=("fixed-pool", "paper"),
        default="fixed-pool",
        help="'fixed-pool' (this project's: windows of the concatenated split, headline U) or "
        "'paper' (one window per document, headline = Occam bound, direct bound, |gap|)",
    )
    parser.add_argument("--bins", type=int, default=40, help="bins of the |gap| densities (--protocol paper)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--k", type=int, default=64, help="TopK size at evaluation")
    parser.add_argument("--rule", choices=("topk", "native"), default="topk")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--exclude-first-positions",
        type=int,
        default=0,
        metavar="N",
        help="keep positions < N of every window clean (not spliced) and out of every term; 1 for dictionaries "
        "trained without position 0 (the tlql-saes suite: SmolLM2's position 0 is an attention sink)",
    )
    parser.add_argument(
        "--shuffle",
        nargs="?",
        const="all",
        default=None,
        help="add the feature-shuffle ablation: for every proxy, or for comma-separated labels "
        "('ffkv L24,sae L24 <folder>')",
    )
    parser.set_defaults(func=run)


def load_dictionaries(args: argparse.Namespace, model) -> dict[str, object]:
    """``{label: SAE}``: ``"ffkv L{l}"`` per layer (the whole MLP; TopK is applied at evaluation) and
    ``"sae L{l} <name>"`` per saved SAE folder or ``release:sae_id``."""
    from tl_query_lens.cli.dictionaries import load_dictionaries as load
    from tl_query_lens.cli.dictionaries import parse_dictionaries

    return {d.label: d.sae for d in load(parse_dictionaries(args.dictionary), model, args.layers)}


def _shuffle_labels(text: str | None) -> bool | list[str]:
    if text is None:
        return False
    return True if text == "all" else [label.strip() for label in text.split(",") if label.strip()]


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens import load_corpus, load_model
    from tl_query_lens.certify.certify import CertifyConfig
    from tl_query_lens.certify.plots import bound_vs_n_figure, gap_distribution_figure
    from tl_query_lens.certify.sweep import LayerSweep, certify_layers
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    saes = load_dictionaries(args, model)
    if args.protocol == "paper":
        return run_paper(args, model, saes)
    args.n_eval = args.n_eval or 1000
    cal = load_corpus(args.corpus, model, n_seqs=args.n_cal, seq_len=args.seq_len, split="calibration", seed=args.seed)
    ev = load_corpus(args.corpus, model, n_seqs=args.n_eval, seq_len=args.seq_len, split="evaluation", seed=args.seed)
    out = Path(args.out)
    config = {k: v for k, v in vars(args).items() if k != "func"}
    cfg = CertifyConfig(
        k=args.k,
        delta=args.delta,
        alpha=args.alpha,
        rule=args.rule,
        batch_size=args.batch_size,
        exclude_first_positions=args.exclude_first_positions,
    )
    sweep = certify_layers(model, saes, cal, ev, shuffle=_shuffle_labels(args.shuffle), seed=args.seed, cfg=cfg)
    sweep.save(out)
    with Tracker(out, project=args.wandb_project, name="certify", config=config, use_wandb=args.wandb) as tracker:
        table = tracker.log_table("certificates", list(LayerSweep.COLUMNS), sweep.rows())
        tracker.log_scalars(
            "times",
            {
                "clean_s": sweep.times.clean,
                "proxy_s": sweep.times.proxy,
                "restricted_s": sweep.times.restricted,
                "pool_s": sweep.times.pool,
            },
        )
        real = dict(sweep.certificates)
        tracker.log_plot("bound_vs_N", bound_vs_n_figure(real))
        tracker.log_plot("bound_occam_vs_N", bound_vs_n_figure(real, occam=True, title="Occam bound vs N"))
        if sweep.shuffled:
            shuffled = dict(sweep.shuffled)
            tracker.log_plot("gap_real_vs_shuffled", gap_distribution_figure(real, shuffled))
            tracker.log_plot("bound_vs_N_shuffled", bound_vs_n_figure(shuffled, title="Shuffled proxies: bound vs N"))
        tracker.log_artifact("certificates", [p for p in out.iterdir() if (p / "result.json").exists()])
    print(f"certificates: {table}")
    for row in sweep.rows():
        print(
            "  "
            + ", ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(LayerSweep.COLUMNS, row))
        )
    return 0


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


def run_paper(args: argparse.Namespace, model, saes) -> int:
    """``--protocol paper``: :func:`~tl_query_lens.certify.protocol.certify_protocol`, saved, then logged."""
    from pathlib import Path

    from tl_query_lens.certify.protocol import ProtocolCertifyConfig, certify_protocol
    from tl_query_lens.tracking import Tracker

    cfg = ProtocolCertifyConfig(
        protocol="paper",
        n_cal=args.n_cal,
        n_eval=args.n_eval,
        seq_len=args.seq_len,
        k=args.k,
        delta=args.delta,
        alpha=args.alpha,
        rule=args.rule,
        batch_size=args.batch_size,
        shuffle=args.shuffle is not None,
        seed=args.seed,
        bins=args.bins,
        exclude_first_positions=args.exclude_first_positions,
    )
    result = certify_protocol(model, saes, args.corpus, cfg=cfg)
    out = Path(args.out)
    result.save(out / "protocol_paper")
    columns = ["label", *PAPER_COLUMNS]
    shuffled = [
        c for c in ("shuffled_bound_occam", "shuffled_abs_gap_mean", "shuffled_gap_mean") if c in result.rows[0]
    ]
    rows = [
        [label, *(row[c] for c in PAPER_COLUMNS), *(row[c] for c in shuffled)]
        for label, row in zip(result.labels, result.rows)
    ]
    config = {k: v for k, v in vars(args).items() if k != "func"}
    with Tracker(out, project=args.wandb_project, name="certify-paper", config=config, use_wandb=args.wandb) as tr:
        table = tr.log_table("certificates_paper_protocol", columns + shuffled, rows)
    print(
        f"paper protocol ({result.n_documents} evaluation documents, {result.n_eligible} long enough; "
        f"headline = {result.headline}): {table}"
    )
    for row in rows:
        print(
            "  "
            + ", ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(columns + shuffled, row))
        )
    return 0
