"""What every ``tlql`` analysis shares and no method's config holds: the model, corpus, sizes, output and W&B."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tl_query_lens.config import check_ranges


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
