"""``tlql saes``: train the SAE/transcoder suite (``train``), measure its quality (``report``), and run the FF-KV
paper's comparison (``compare``)."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, fields

from tl_query_lens.cli import saes_compare, saes_report
from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command, configure
from tl_query_lens.config import RunConfig


@dataclass
class TrainOptions:
    """How ``tlql saes train`` starts.

    Attributes:
        restart: start training again (earlier checkpoints are set aside) instead of resuming.
    """

    restart: bool = False


def add_parser(subparsers) -> None:
    command(
        subparsers,
        "saes",
        help="trained SAEs / transcoders of the model and their comparison",
        configure=_configure_actions,
    )


def _configure_actions(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="SAES_COMMAND")
    saes_compare.add_parser(actions)
    command(actions, "train", help="train (or resume) the suite into the user cache", configure=configure_train)
    saes_report.add_parser(actions)
    for action in actions.choices.values():
        configure(action)
    parser.set_defaults(func=functools.partial(print_help, parser))


def print_help(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``tlql saes`` without an action: its help."""
    parser.print_help()
    return 0


def configure_train(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.saes.config import SAESuiteConfig

    device = [f.name for f in fields(RunConfig) if f.name != "device"]
    taken = add_options(parser, RunConfig, skip=device, defaults={"device": "cpu"})
    taken = add_options(parser, SAESuiteConfig, taken=taken, aliases={"batch_size_tokens": "--batch-size"})
    add_options(parser, TrainOptions, taken=taken)
    parser.__dict__["tlql_ranges"]["n_seqs"] = "[0, inf)"  # --n-seqs 0: every window
    parser.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from tl_query_lens.budget import check_memory
    from tl_query_lens.checks import check_corpus, check_device, check_model_name
    from tl_query_lens.cli.common import load_model
    from tl_query_lens.ranges import parse_layers
    from tl_query_lens.saes.config import SAESuiteConfig
    from tl_query_lens.saes.train import train_saes

    cfg = build(SAESuiteConfig, args, n_seqs=args.n_seqs or None)  # --n-seqs 0: every window of the train split
    run_cfg = build(RunConfig, args, exclude=("n_seqs", "seq_len"), model=cfg.model, corpus=cfg.corpus, seed=cfg.seed)
    dims = check_model_name(cfg.model)
    check_device(run_cfg.device)
    check_corpus(cfg.corpus)
    layers = ",".join(map(str, cfg.layers))
    parse_layers(layers, dims.n_layers if dims else None)
    if dims is not None and dims.d_model:
        n_dicts = len(cfg.layers) * len(cfg.kinds)
        check_memory(
            {
                f"--d-sae {cfg.d_sae}": n_dicts * 4 * 4 * 2 * dims.d_model * cfg.d_sae,
                f"--batch-size {cfg.batch_size_tokens}": n_dicts * 4 * 3 * cfg.batch_size_tokens * cfg.d_sae,
            },
            "saes train",
        )
    model = load_model(run_cfg)
    parse_layers(layers, model.cfg.n_layers)
    result = train_saes(model, cfg, resume=not args.restart)
    print(
        f"{result.release}: {len(result.sae_ids)} dictionaries, {result.training_tokens_seen} tokens each "
        f"({result.epochs:.1f} epochs over {result.n_cached_tokens} cached tokens) in {result.folder}; "
        f"activation pass {result.seconds_activations:.0f} s, training {result.seconds_training:.0f} s"
    )
    return 0
