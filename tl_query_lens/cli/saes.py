"""``tlql saes``: train the SAE/transcoder suite (``train``) and measure its quality (``report``)."""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("saes", help="TopK residual SAEs and transcoders: train, report")
    verbs = parser.add_subparsers(dest="saes_command", metavar="VERB", required=True)

    train = verbs.add_parser("train", help="train (or resume) the suite into the user cache")
    train.add_argument("--model", default="smollm2-135m")
    train.add_argument("--layers", default="6,12,18,24", help="e.g. '12' or '6,12,18,24'")
    train.add_argument("--kinds", default="sae,transcoder", help="'sae', 'transcoder' or both")
    train.add_argument("--d-sae", type=int, default=4608)
    train.add_argument("--k", type=int, default=32)
    train.add_argument("--corpus", default="stdlib")
    train.add_argument("--n-seqs", type=int, default=1024, help="training sequences cached (0: the whole split)")
    train.add_argument("--seq-len", type=int, default=128)
    train.add_argument("--training-tokens", type=int, default=2_000_000, help="activations per dictionary")
    train.add_argument("--batch-size", type=int, default=1024)
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--n-checkpoints", type=int, default=20)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu")
    train.add_argument("--restart", action="store_true", help="start again (earlier checkpoints are set aside)")
    train.set_defaults(func=run_train)

    report = verbs.add_parser("report", help="quality of each trained dictionary on the evaluation split")
    report.add_argument("--model", default="smollm2-135m")
    report.add_argument("--ids", default="all", help="comma-separated dictionary ids, or 'all' of the release")
    report.add_argument("--corpus", default="stdlib")
    report.add_argument("--n-seqs", type=int, default=64)
    report.add_argument("--seq-len", type=int, default=128)
    report.add_argument("--seed", type=int, default=0)
    report.add_argument("--device", default="cpu")
    report.add_argument("--out", default="results/saes_report")
    report.add_argument("--no-wandb", dest="wandb", action="store_false")
    report.add_argument("--wandb-project", default="tl_query_lens")
    report.set_defaults(func=run_report)


def run_train(args: argparse.Namespace) -> int:
    from tl_query_lens import load_model
    from tl_query_lens.cli import parse_layers
    from tl_query_lens.saes.train import SAESuiteConfig, train_saes

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    cfg = SAESuiteConfig(model=args.model, layers=tuple(layers), kinds=kinds, d_sae=args.d_sae, k=args.k,
                         corpus=args.corpus, n_seqs=args.n_seqs or None, seq_len=args.seq_len,
                         training_tokens=args.training_tokens, batch_size_tokens=args.batch_size, lr=args.lr,
                         n_checkpoints=args.n_checkpoints, seed=args.seed)
    result = train_saes(model, cfg, resume=not args.restart)
    print(f"{result.release}: {len(result.sae_ids)} dictionaries, {result.training_tokens_seen} tokens each "
          f"({result.epochs:.1f} epochs over {result.n_cached_tokens} cached tokens) in {result.folder}; "
          f"activation pass {result.seconds_activations:.0f} s, training {result.seconds_training:.0f} s")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from tl_query_lens.saes.report import SAEReportConfig, report_cli

    cfg = SAEReportConfig(corpus=args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len, seed=args.seed)
    return report_cli(args, cfg)
