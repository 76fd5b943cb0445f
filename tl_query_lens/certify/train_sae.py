"""Train a small real SAE offline with SAELens' own ``LanguageModelSAETrainingRunner`` (for certification demos).

The runner accepts an in-memory model (``override_model``) and an in-memory dataset (``override_dataset``): we hand
it the loaded TransformerLens model and a ``datasets.Dataset`` with one ``input_ids`` row per corpus sequence (from
:func:`tl_query_lens.load_corpus`, train split), so nothing touches a hub. W&B logging of the runner is off; the
trained SAE is written with SAELens' ``save_inference_model`` (``SAE.load_from_disk`` reads it back).

Example::

    from tl_query_lens import load_model
    from tl_query_lens.certify.train_sae import SAETrainSpec, train_sae

    model = load_model("smollm2-135m")
    path = train_sae(model, SAETrainSpec(layer=20, d_sae=2304, k=32, training_tokens=300_000))
    # → ~/.cache/tl_query_lens/saes/smollm2-135m-blocks.20.hook_resid_post-topk2304-k32/
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig
from transformer_lens import HookedTransformer

from tl_query_lens.corpus import load_corpus
from tl_query_lens.hooks import check_hook, hook_dims
from tl_query_lens.models import cache_dir

logger = logging.getLogger(__name__)


@dataclass
class SAETrainSpec:
    """What to train.

    Attributes:
        layer: layer of the hook.
        hook: hook suffix inside ``blocks.{layer}`` (default the residual stream after the block).
        d_sae: dictionary size.
        k: TopK sparsity of the SAE (its native rule).
        training_tokens: tokens to train on (the train split is cycled if it holds fewer).
        context_size: tokens per sequence (the corpus windows have this length).
        batch_size_tokens: tokens per optimiser step.
        lr: Adam learning rate.
        seed: corpus and training seed.
    """

    layer: int
    hook: str = "hook_resid_post"
    d_sae: int = 2304
    k: int = 32
    training_tokens: int = 300_000
    context_size: int = 32
    batch_size_tokens: int = 1024
    lr: float = 4e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layer < 0:
            raise ValueError(f"layer must be >= 0, got {self.layer}.")
        if not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae={self.d_sae}, got {self.k}.")
        if self.training_tokens < self.batch_size_tokens:
            raise ValueError("training_tokens must be at least one batch (batch_size_tokens).")

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.{self.hook}"


def default_sae_dir(model: HookedTransformer, spec: SAETrainSpec) -> Path:
    """``<user cache>/saes/<model>-<hook>-topk<d_sae>-k<k>``."""
    name = (model.cfg.model_name or "model").replace("/", "_")
    return cache_dir() / "saes" / f"{name}-{spec.hook_name}-topk{spec.d_sae}-k{spec.k}"


def corpus_dataset(tokens: torch.Tensor):
    """A ``datasets.Dataset`` with an ``input_ids`` column, one row per sequence (what the runner's store reads)."""
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": tokens.tolist()})


def train_sae(
    model: HookedTransformer,
    spec: SAETrainSpec,
    *,
    tokens: torch.Tensor | None = None,
    out_dir: str | Path | None = None,
    device: str = "cpu",
) -> Path:
    """Train a TopK SAE at ``spec.hook_name`` with SAELens' runner, fully offline; returns the saved folder.

    Args:
        model: the TransformerLens model (passed to the runner as ``override_model``).
        spec: what to train.
        tokens: ``[n_seqs, context_size]`` training sequences; default: the whole embedded train split.
        out_dir: where to save (default :func:`default_sae_dir`).
        device: training device.
    """

    check_hook(model, spec.hook_name)
    d_in = hook_dims(model, [spec.hook_name])[spec.hook_name]
    if tokens is None:
        tokens = _whole_split(model, spec.context_size)
    if tokens.shape[1] != spec.context_size:
        raise ValueError(f"tokens have {tokens.shape[1]} positions but spec.context_size={spec.context_size}.")
    out = Path(out_dir) if out_dir is not None else default_sae_dir(model, spec)
    cfg = LanguageModelSAERunnerConfig(
        sae=TopKTrainingSAEConfig(d_in=d_in, d_sae=spec.d_sae, k=spec.k, dtype="float32", device=device),
        model_name=model.cfg.model_name or "override",
        hook_name=spec.hook_name,
        dataset_path="",  # in-memory dataset, see override_dataset
        is_dataset_tokenized=True,
        streaming=False,
        context_size=spec.context_size,
        prepend_bos=False,  # our corpus windows carry no BOS; certification sees the same windows
        training_tokens=spec.training_tokens,
        train_batch_size_tokens=spec.batch_size_tokens,
        store_batch_size_prompts=16,
        # SAELens sizes its mixing buffer as n_batches_in_buffer × context_size tokens; keep it ≥ 2 batches.
        n_batches_in_buffer=max(8, -(-2 * spec.batch_size_tokens // spec.context_size)),
        lr=spec.lr,
        lr_warm_up_steps=10,
        n_batches_for_norm_estimate=10,
        n_eval_batches=2,
        eval_batch_size_prompts=8,
        device=device,
        seed=spec.seed,
        dtype="float32",
        logger=LoggingConfig(log_to_wandb=False),
        checkpoint_path=None,
        n_checkpoints=0,
        output_path=str(out),
        verbose=False,
    )
    runner = LanguageModelSAETrainingRunner(cfg, override_dataset=corpus_dataset(tokens), override_model=model)
    logger.info(
        "training a TopK SAE (d_sae=%d, k=%d) at %s on %d tokens",
        spec.d_sae,
        spec.k,
        spec.hook_name,
        spec.training_tokens,
    )
    runner.run()
    logger.info("saved the SAE to %s", out)
    return out


def _whole_split(model: HookedTransformer, seq_len: int) -> torch.Tensor:
    """Every window of the embedded train split (disjoint from calibration and evaluation by document hash)."""
    try:
        return load_corpus("embedded", model, n_seqs=10**9, seq_len=seq_len, split="train")
    except ValueError as err:  # the message states how many windows the split holds
        n = int(str(err).split(" holds ")[1].split()[0])
        return load_corpus("embedded", model, n_seqs=n, seq_len=seq_len, split="train")
