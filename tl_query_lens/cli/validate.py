"""Every ``tlql`` argument and path, checked before a model is loaded or an operator computed.

:func:`validate_args` reads the parsed arguments by name (``--layers``, ``--features``, ``--out``, ``--corpus``, …),
whatever the subcommand, so a subcommand gets these checks by using the shared option names. Errors are
:class:`~tl_query_lens.errors.InputError`; ``tlql`` prints them in one or two lines and exits with status 2.
Bounds that need the model (number of layers, dictionary width) are checked here for the embedded model, whose
config is known without loading it, and again by the parsers once any other model is loaded.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tl_query_lens.errors import InputError, MissingFileError

_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
MAX_IDS = 10_000_000  # a range larger than this is a typo, not a request

# Options that must be ≥ 1 / ≥ 0 / in (0, 1) / > 0 wherever a subcommand has them.
POSITIVE_INTS = (
    "k",
    "n_seqs",
    "seq_len",
    "chunk",
    "features_per_layer",
    "op_seqs",
    "op_seq_len",
    "n_contexts",
    "n_generate",
    "n_prompts",
    "n_steps",
    "epochs",
    "n_permutations",
    "rank",
    "width",
    "steps",
    "n_cal",
    "n_eval",
    "batch_size",
    "top",
)
NON_NEGATIVE_INTS = ("seed", "skip_positions", "exclude_first_positions")
OPEN_UNIT = ("delta", "alpha")
POSITIVE_FLOATS = ("temperature", "max_seconds")
# Range options and what they index: "layers" = the model's blocks, "features" = an FF-KV dictionary's neurons.
RANGE_OPTIONS = {"layers": "layers", "sources": "layers", "operator_layers": "layers", "features": "features"}
FOLDER_OPTIONS = ("out", "save", "cache_dir")


@dataclass(frozen=True)
class ModelDims:
    """What the checks need of a model: blocks, FF-KV width, vocabulary, context."""

    n_layers: int
    d_mlp: int
    d_vocab: int
    n_ctx: int


def parse_ranges(text: str, upper: int | None, what: str) -> list[int]:
    """``'3,5,7'`` or ``'0-9,15'`` → sorted ids; each must lie in ``0..upper-1`` (when ``upper`` is given).

    Raises:
        InputError: empty text or item, a malformed item (``'3-'``, ``'a'``), a reversed range (``'5-3'``), or ids
            out of range (the message names the option, the bad items and the valid range).
    """
    if not text.strip():
        raise InputError(f"{what} is empty; give ids such as '3', '0-9' or '0-9,15'.")
    spans = []
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise InputError(
                f"{what} {text!r}: {item.strip()!r} is not an id or a range lo-hi; write e.g. '3', '0-9' or '0-9,15'."
            )
        lo = int(match[1])
        hi = int(match[2]) if match[2] is not None else lo
        if hi < lo:
            raise InputError(
                f"{what} {text!r}: the range {item.strip()!r} is empty (start after end); did you mean '{hi}-{lo}'?"
            )
        spans.append((lo, hi))
    if upper is not None:
        bad = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in spans if hi >= upper]
        if bad:
            valid = f"0..{upper - 1}" if upper > 0 else "none"
            raise InputError(f"{what} {', '.join(bad[:10])} out of range; valid: {valid}.")
    if sum(hi - lo + 1 for lo, hi in spans) > MAX_IDS:
        raise InputError(f"{what} {text!r} asks for more than {MAX_IDS:,} ids; give a smaller range.")
    return sorted({i for lo, hi in spans for i in range(lo, hi + 1)})


def parse_layers(text: str, n_layers: int, what: str = "--layers") -> list[int]:
    """``'3,5,7'``, ``'0-29'`` or ``'all'`` → sorted layers, checked against ``n_layers``."""
    return list(range(n_layers)) if text.strip() == "all" else parse_ranges(text, n_layers, what)


def parse_features(text: str, d_sae: int, what: str = "--features") -> list[int] | None:
    """``'0-9,15'`` → feature ids checked against the dictionary width; ``'all'`` → None (every feature)."""
    return None if text.strip() == "all" else parse_ranges(text, d_sae, what)


def parse_floats(text: str, what: str, *, positive: bool = True) -> list[float]:
    """``'0.25,0.5'`` → floats (finite, > 0 when ``positive``)."""
    values = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise InputError(f"{what} {text!r}: {item.strip()!r} is not a number; write e.g. '0.25,0.5'.") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise InputError(f"{what} {text!r}: {item.strip()!r} must be a finite number > 0.")
        values.append(value)
    return values


def check_folder(path: str | Path, what: str = "--out") -> Path:
    """A folder that can be created and written: not a file, under a writable existing ancestor."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{what} {folder} is a file, not a folder; pass a folder path (it is created if missing).")
    ancestor = folder
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{what} {folder} cannot be created: {ancestor} is a file. Choose another path.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(
            f"{what} {folder} cannot be written: {ancestor} is read-only for this user. Choose a writable folder."
        )
    return folder


def looks_like_path(source: str) -> bool:
    """True for sources meant as local paths (absolute, ./, ~, or a corpus suffix); else an HF dataset name."""
    return (
        source.startswith(("/", ".", "~"))
        or Path(source).suffix in {".txt", ".jsonl", ".json"}
        or source.count("/") > 1
    )


def check_corpus(source: str, what: str = "--corpus") -> None:
    """'embedded', an existing .txt/.jsonl file or folder with documents (every line of a .jsonl parsed), or an HF
    dataset name (read later: needs a hub)."""
    from tl_query_lens.corpus import read_documents

    if source == "embedded":
        return
    path = Path(source).expanduser()
    if path.exists():
        if path.is_file() and path.suffix not in {".txt", ".jsonl"}:
            raise InputError(
                f"{what} {path}: corpus files are .txt (blank-line-separated documents) or .jsonl "
                "({'text': ...} per line); rename or convert it."
            )
        if not read_documents(path):
            raise InputError(
                f"{what} {path} holds no documents; a .txt needs text (documents separated by blank "
                "lines), a .jsonl one {'text': ...} object per line."
            )
        return
    if looks_like_path(source):
        raise MissingFileError(
            f"{what} {source}: no such file or folder. Give an existing .txt/.jsonl file or folder, or 'embedded'."
        )


def check_model_name(name: str) -> ModelDims | None:
    """Refuse names neither embedded nor known to TransformerLens; dimensions of the embedded model (else None)."""
    from tl_query_lens.models import _ALIASES, EMBEDDED_MODELS, smollm2_config

    key = _ALIASES.get(name.lower(), name.lower())
    if key in EMBEDDED_MODELS:
        cfg = smollm2_config()
        return ModelDims(cfg.n_layers, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx)
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        get_official_model_name(name)
    except ValueError:
        raise InputError(
            f"--model {name!r} is neither the embedded model ('smollm2-135m', offline) nor a "
            "TransformerLens model name (transformer_lens.loading.OFFICIAL_MODEL_NAMES)."
        ) from None
    return None


def check_device(device: str | None) -> None:
    import torch

    if device is None:
        return
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise InputError(f"--device {device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:N'.") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available here; use --device cpu.")


def check_readout_available(model: str, sae_id: str) -> None:
    """A readout SAE id that ``SAE.from_pretrained`` can serve from the user cache (fitted locally)."""
    from tl_query_lens.dictionaries.saved import check_sae_folder
    from tl_query_lens.readout.registry import READOUT_RELEASES, cached_sae_path, fit_command

    folder = cached_sae_path(model, sae_id)
    if folder.is_dir():
        check_sae_folder(folder)
        return
    if sae_id in READOUT_RELEASES.shipped_ids(model):
        return
    cached = READOUT_RELEASES.available_ids(model)
    preset = sae_id if sae_id in ("small", "paper") else "small"
    raise InputError(
        f"No readout SAE {sae_id!r} for {model} is cached (cached: {cached or 'none'}); fit it with "
        f"`{fit_command(model, sae_id, preset)}`, or pass --sae-id one of those or --sae-path <folder>."
    )


def _check_numbers(args: argparse.Namespace) -> None:
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for name in POSITIVE_INTS:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise InputError(f"{flag(name)} must be ≥ 1, got {value}.")
    for name in NON_NEGATIVE_INTS:
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise InputError(f"{flag(name)} must be ≥ 0, got {value}.")
    for name in OPEN_UNIT:
        value = getattr(args, name, None)
        if value is not None and not 0 < value < 1:
            raise InputError(f"{flag(name)} must lie strictly between 0 and 1, got {value}.")
    for name in POSITIVE_FLOATS:
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError(f"{flag(name)} must be a finite number > 0, got {value}.")
    seq_len, skip = getattr(args, "seq_len", None), getattr(args, "skip_positions", None)
    if seq_len is not None and skip is not None and skip >= seq_len:
        raise InputError(f"--skip-positions {skip} leaves no position of --seq-len {seq_len}; lower it.")
    exclude = getattr(args, "exclude_first_positions", None)
    if seq_len is not None and exclude is not None and exclude >= seq_len:
        raise InputError(f"--exclude-first-positions {exclude} leaves no position of --seq-len {seq_len}; lower it.")
    if args.command == "certify" and seq_len is not None and seq_len < 2:
        raise InputError("--seq-len must be ≥ 2 for certify (the loss scores next-token predictions).")


def _check_lists(args: argparse.Namespace) -> None:
    if getattr(args, "kl_targets", None) is not None:
        parse_floats(args.kl_targets, "--kl-targets")
    if getattr(args, "fits", None) is not None:
        fits = [f.strip() for f in args.fits.split(",")]
        if not fits or set(fits) - {"closed_form", "adam"}:
            raise InputError(f"--fits {args.fits!r}: use 'closed_form', 'adam' or 'closed_form,adam'.")
    if getattr(args, "baselines", None):
        from tl_query_lens.readout.baselines import BASELINE_ORDER
        from tl_query_lens.readout.diagnostics_paper import OWN_VARIANTS, PAPER_BASELINES

        paper = getattr(args, "protocol", None) == "paper"
        known = PAPER_BASELINES + OWN_VARIANTS if paper else BASELINE_ORDER
        unknown = [b for b in args.baselines.split(",") if b and b not in known]
        if unknown:
            raise InputError(
                f"--baselines {unknown} unknown for --protocol {args.protocol}; choose from {list(known)} ('' for none)."
            )
    if getattr(args, "n_prompts", None) is not None:
        from tl_query_lens.query_lens.steering import NEUTRAL_PROMPTS

        if args.n_prompts > len(NEUTRAL_PROMPTS):
            raise InputError(f"--n-prompts {args.n_prompts}: only {len(NEUTRAL_PROMPTS)} neutral prompts exist.")


def _check_ranges(args: argparse.Namespace, dims: ModelDims | None) -> None:
    for name, kind in RANGE_OPTIONS.items():
        text = getattr(args, name, None)
        if text is None:
            continue
        what = "--" + name.replace("_", "-")
        upper = None if dims is None else (dims.n_layers if kind == "layers" else dims.d_mlp)
        if kind == "features" and _names_saes(args):
            upper = None  # checked against every dictionary's width once they are loaded
        if kind == "features" and text.strip() == "all":
            continue
        if kind == "layers" and text.strip() == "all":
            continue
        parse_ranges(text, upper, what)
    if dims is not None:
        for name in ("seq_len", "op_seq_len"):
            value = getattr(args, name, None)
            if value is not None and value > dims.n_ctx:
                raise InputError(f"--{name.replace('_', '-')} {value} exceeds the model context {dims.n_ctx}.")


def _names_saes(args: argparse.Namespace) -> bool:
    """True when ``--dictionary`` names anything besides FF-KV (whose width the embedded model's d_mlp gives)."""
    from tl_query_lens.cli.dictionaries import dictionary_text

    if not hasattr(args, "dictionary"):
        return False
    return any(item.strip() != "ffkv" for item in dictionary_text(args.dictionary).split(","))


def _check_dictionaries(args: argparse.Namespace, dims: ModelDims | None) -> None:
    from tl_query_lens.cli.dictionaries import parse_dictionaries

    parse_dictionaries(args.dictionary)
    if dims is not None and getattr(args, "n_eval", None) is not None:
        from tl_query_lens.certify.bound import hoeffding_coefficient, loss_range_bits, min_sequences

        coefficient = hoeffding_coefficient(loss_range_bits(dims.d_vocab, args.alpha), args.delta)
        n_min = min_sequences(math.log2(dims.d_vocab), coefficient)
        if args.n_eval < n_min:
            raise InputError(
                f"--n-eval {args.n_eval} cannot give a non-trivial bound: the minimum is N = {n_min} "
                f"evaluation sequences (delta={args.delta}, alpha={args.alpha}); real proxies need "
                "far more (the README's runs use 1000)."
            )


def validate_args(args: argparse.Namespace) -> None:
    """Check every argument and path a subcommand received; raise :class:`InputError` naming the fix."""
    dims = check_model_name(args.model) if getattr(args, "model", None) else None
    check_device(getattr(args, "device", None))
    _check_numbers(args)
    _check_lists(args)
    _check_ranges(args, dims)
    for name in FOLDER_OPTIONS:
        if getattr(args, name, None):
            check_folder(args.__dict__[name], "--" + name.replace("_", "-"))
    if getattr(args, "corpus", None):
        check_corpus(args.corpus)
    if hasattr(args, "dictionary"):
        _check_dictionaries(args, dims)
    if getattr(args, "sae_path", None):
        from tl_query_lens.dictionaries.saved import check_sae_folder

        check_sae_folder(args.sae_path)
    elif getattr(args, "sae_id", None) and getattr(args, "readout_command", None) in ("decompose", "eval"):
        check_readout_available(args.model, args.sae_id)
