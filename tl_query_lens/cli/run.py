"""What every ``tlql`` analysis shares and no method's config holds: the model, corpus, sizes, output and W&B."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import ClassVar

from tl_query_lens.config import check_ranges

WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def wandb_env_problem() -> str | None:
    """What is wrong with the W&B environment variables this package reads (``WANDB_MODE``, ``WANDB_INIT_TIMEOUT``,
    ``WANDB_DIR``: a file, a dangling link, read-only, under /proc), naming the variable and the fix; None if
    nothing. W&B itself would fail only at the end, and with advice that does not name the variable."""
    from tl_query_lens.errors import InputError
    from tl_query_lens.paths import check_folder

    skip = "or pass --no-wandb"
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        return (
            f"WANDB_MODE={mode!r} is not a W&B mode; set it to one of {', '.join(WANDB_MODES)} (or unset it), {skip}."
        )
    timeout = os.environ.get("WANDB_INIT_TIMEOUT")
    if timeout:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            return f"WANDB_INIT_TIMEOUT={timeout!r} is not a positive number of seconds; set e.g. 90 (or unset it), {skip}."
    wandb_dir = os.environ.get("WANDB_DIR")
    if wandb_dir:
        try:
            folder = check_folder(wandb_dir, "WANDB_DIR")
        except InputError as err:
            return f"{err} (W&B writes its run files there: unset WANDB_DIR to use --out, {skip})."
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            return f"WANDB_DIR {folder} is read-only for this user; point WANDB_DIR at a writable folder, {skip}."
    return None


def check_wandb_mode() -> None:
    """Refuse a W&B environment (:func:`wandb_env_problem`) before any work."""
    from tl_query_lens.errors import InputError

    problem = wandb_env_problem()
    if problem:
        raise InputError(problem)


@dataclass
class RunConfig:
    """Options of a ``tlql`` run that are not a method's own.

    Attributes:
        model: the embedded model ('smollm2-135m', offline) or a TransformerLens model name.
        corpus: 'embedded', 'stdlib', 'broad' (installed by scripts/setup.sh --broad-corpus), a .txt/.jsonl file or folder of documents, or a Hugging Face dataset name.
        device: torch device of the model, e.g. 'cpu', 'cuda', 'cuda:1' (None: TransformerLens' choice).
        seed: seed of the corpus windows drawn (and of the method, where it has one).
        n_seqs: sequences (windows) drawn from the corpus.
        seq_len: tokens per sequence.
        layers: layers analysed, e.g. '3,5', '0-29' or 'all'.
        features: feature ids per dictionary, e.g. '0-99,512' or 'all'.
        dictionary: dictionaries, comma-separated and repeatable: 'ffkv' (the MLP at each of --layers as an FF-KV
            dictionary), 'ffkv:<layer>[:vanilla|topk|normalized[:<k>]]', folders of SAEs saved with save_model or
            the SAELens runner, SAELens '<release>:<sae_id>' (e.g. 'tlql-saes-smollm2-135m:blocks.12.hook_resid_post')
            or '<hf-org>/<repo>:<sae_id>'; all share one model.
        out: results folder (created; results are written there before anything is logged).
        wandb: log the run to Weights & Biases (offline unless WANDB_MODE says otherwise); results are written to disk
            either way.
        wandb_project: W&B project name.
    """

    model: str = "smollm2-135m"
    corpus: str = "embedded"
    device: str | None = None
    seed: int = 0
    n_seqs: int = 32
    seq_len: int = 64
    layers: str = "all"
    features: str | None = None
    dictionary: tuple[str, ...] = ("ffkv",)
    out: str = "results"
    wandb: bool = True
    wandb_project: str = "tl_query_lens"

    RANGES: ClassVar[dict[str, str]] = {"seed": "[0, 4294967295]", "n_seqs": "[1, 10000000]", "seq_len": "[1, 1048576]"}

    def __post_init__(self) -> None:
        check_ranges(self)
