"""``tlql readout decompose``: one score of one prompt split into readout features (exact, with bias and residual)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.paths import plain_name

RUN_SKIP = ("n_seqs", "seq_len", "layers", "features", "dictionary", "corpus")


@dataclass
class DecomposeOptions:
    """Which readout SAE, state and score ``tlql readout decompose`` reads (the score: one of --token, --margin,
    --group, --vocab-contrast; none given: top-1 minus runner-up).

    Attributes:
        sae_id: readout SAE id in the model's release (fitted with `tlql readout fit`).
        sae_path: a saved readout SAE folder instead of the release.
        hook: residual hook read (default: the last block's hook_resid_post).
        position: token position of the state (-1: the last).
        top: features listed.
    """

    sae_id: str = "small"
    sae_path: str | None = None
    hook: str | None = None
    position: int = -1
    top: int = 10

    RANGES: ClassVar[dict[str, str]] = {"position": "(-inf, inf)", "top": "[1, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)
        plain_name(self.sae_id, "sae_id")  # a folder of the user cache: nothing outside it


def add_parser(subparsers) -> None:
    command(
        subparsers, "decompose", help="decompose one score of one prompt into readout features", configure=configure
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="text; the state is read at --position")
    add_options(
        parser,
        DecomposeOptions,
        taken=add_options(parser, RunConfig, skip=RUN_SKIP, defaults={"out": "results/readout/decompose"}),
    )
    family = parser.add_mutually_exclusive_group()
    family.add_argument("--token", help="the logit of this token (a string; mind the leading space)")
    family.add_argument("--margin", nargs=2, metavar=("POS", "NEG"), help="the logit difference POS − NEG")
    family.add_argument("--group", nargs="+", help="the mean logit of these tokens")
    family.add_argument("--vocab-contrast", help="this token's logit minus the vocabulary mean")
    parser.set_defaults(func=run_decompose)


def load_readout(model_name: str, sae_id: str, sae_path: str | None) -> Callable[[], Any]:
    """Check that the readout SAE exists (the folder, or ``sae_id`` fitted in the user cache) and return its loader."""
    from tl_query_lens.errors import InputError
    from tl_query_lens.readout.registry import READOUT_RELEASES, fit_command, release_name
    from tl_query_lens.sources import load_dictionary, parse_source

    if not sae_path and sae_id not in READOUT_RELEASES.available_ids(model_name):
        preset = sae_id if sae_id in ("small", "paper") else "small"
        raise InputError(
            f"No readout SAE {sae_id!r} for {model_name} is shipped or cached (available: "
            f"{READOUT_RELEASES.available_ids(model_name) or 'none'}); fit "
            f"it with `{fit_command(model_name, sae_id, preset)}`, or pass --sae-id one of those or --sae-path <folder>."
        )
    source = parse_source(sae_path or f"{release_name(model_name)}:{sae_id}", "--sae-path" if sae_path else "--sae-id")
    return lambda: load_dictionary(source)


def _token_id(model, text: str) -> int:
    from tl_query_lens.errors import InputError

    ids = model.to_tokens(text, prepend_bos=False)[0].tolist()
    if len(ids) != 1:
        raise InputError(f"{text!r} is {len(ids)} tokens ({ids}); give a single token (mind the leading space).")
    return ids[0]


def check_targets(args: argparse.Namespace) -> None:
    """Before the model loads: a prompt and score tokens that can name something (an empty string is no token; a
    margin of a token against itself is 0 by construction)."""
    from tl_query_lens.errors import InputError

    if args.prompt == "":
        raise InputError(
            "the prompt is empty; give the text whose state to decompose, e.g. 'The capital of France is'."
        )
    given = {
        "--token": [args.token],
        "--vocab-contrast": [args.vocab_contrast],
        "--margin": list(args.margin or []),
        "--group": list(args.group or []),
    }
    for option, texts in given.items():
        if any(text == "" for text in texts):
            raise InputError(f"{option} got an empty string, which is no token; give a token's text, e.g. ' Paris'.")
    if args.margin and args.margin[0] == args.margin[1]:
        raise InputError(f"--margin {args.margin[0]!r} {args.margin[1]!r}: one token against itself is 0; give two.")


def run_decompose(args: argparse.Namespace) -> int:
    import torch

    from tl_query_lens import readout as ro
    from tl_query_lens.cli.checks import check_run
    from tl_query_lens.cli.common import load_model
    from tl_query_lens.errors import InputError
    from tl_query_lens.hooks import check_hook
    from tl_query_lens.readout.states import logit_lens

    run_cfg, options = build(RunConfig, args, exclude=RUN_SKIP), build(DecomposeOptions, args)
    check_run(run_cfg)
    check_targets(args)
    sae_spec = load_readout(run_cfg.model, options.sae_id, options.sae_path)  # checked before the model loads
    model = load_model(run_cfg)
    sae = sae_spec()
    hook = check_hook(model, options.hook or f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    n_tokens = model.to_tokens(args.prompt).shape[1]
    if not -n_tokens <= options.position < n_tokens:
        raise InputError(
            f"--position {options.position} is outside the prompt's {n_tokens} tokens; "
            f"use 0..{n_tokens - 1} or -1 for the last."
        )
    with torch.no_grad():
        _, cache = model.run_with_cache(args.prompt, names_filter=[hook])
        h = logit_lens(model)(cache[hook][0, options.position]).float()
    V = model.cfg.d_vocab
    if args.token is not None:
        alpha, what = ro.token_logit(_token_id(model, args.token), V), f"logit {args.token!r}"
    elif args.margin:
        pos, neg = args.margin
        if _token_id(model, pos) == _token_id(model, neg):
            raise InputError(f"--margin {pos!r} {neg!r} are one token; the margin would be 0. Give two tokens.")
        alpha, what = ro.margin(_token_id(model, pos), _token_id(model, neg), V), f"margin {pos!r} − {neg!r}"
    elif args.group:
        alpha, what = ro.group_mean([_token_id(model, t) for t in args.group], V), f"group mean {args.group}"
    elif args.vocab_contrast is not None:
        token = args.vocab_contrast
        alpha, what = ro.vocab_mean_contrast(_token_id(model, token), V), f"{token!r} − vocabulary mean"
    else:
        alpha, top1, comp = ro.top1_vs_competitor(h, model)
        what = f"top-1 {model.to_string([top1])!r} − runner-up {model.to_string([comp])!r}"
    dec = ro.decompose(sae, h, alpha, model=model, n_top=options.top)
    dec.save(run_cfg.out)
    print(
        f"{what} at {hook}[{options.position}]: exact {dec.exact.item():.4f} = bias {dec.bias.item():.4f} "
        f"+ Σc {dec.contributions.sum().item():.4f} + residual {dec.residual.item():.4f}"
    )
    for row in dec.top_features:
        print(
            f"  feature {row['feature']:>6}  c = {row['contribution']:+.4f}  (β {row['beta']:+.3f}, "
            f"p {row['projection']:+.3f})  {row['label']}"
        )
    return 0
