"""Train one TopK residual SAE for certification demos, through the project's one SAE trainer.

:func:`train_sae` is a thin front to :func:`tl_query_lens.saes.train.train_saes` (SAELens' ``MultiSAETrainer`` over a
cached activation pass, seeded shuffled epochs, checkpoints and resume): a :class:`SAETrainSpec` becomes an
:class:`~tl_query_lens.saes.config.SAESuiteConfig` for one residual SAE. Nothing touches a hub; the SAE is written in
SAELens' inference format (``SAE.load_from_disk`` reads it back).

Departures from the suite's defaults, so that a certification SAE sees what certification scores: every position of
a window is trained on (``exclude_first_positions=0``), in float32 throughout (no bf16 autocast), with no final
learning-rate decay; the runner's 10 warm-up steps.

Example::

    from tl_query_lens import load_model
    from tl_query_lens.certify.train_sae import SAETrainSpec, train_sae

    model = load_model("smollm2-135m")
    path = train_sae(model, SAETrainSpec(layer=20, d_sae=2304, k=32, training_tokens=300_000))
    # → ~/.cache/tl_query_lens/saes/smollm2-135m-blocks.20.hook_resid_post-topk2304-k32/blocks.20.hook_resid_post
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformer_lens import HookedTransformer

from tl_query_lens.corpus import load_corpus
from tl_query_lens.errors import InputError
from tl_query_lens.hooks import check_hook
from tl_query_lens.models import cache_dir
from tl_query_lens.saes.config import SAESuiteConfig
from tl_query_lens.saes.registry import sae_id
from tl_query_lens.saes.train import train_saes

logger = logging.getLogger(__name__)


@dataclass
class SAETrainSpec:
    """What to train.

    Attributes:
        layer: layer of the hook.
        hook: hook suffix inside ``blocks.{layer}``: the residual stream after the block (the one the suite trainer
            trains SAEs at).
        d_sae: dictionary size.
        k: TopK sparsity of the SAE (its native rule).
        training_tokens: tokens to train on (the cached train split is cycled in shuffled epochs if it holds fewer).
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

    def suite_config(self, model_name: str) -> SAESuiteConfig:
        """The suite trainer's config for this one SAE (the module docstring lists the departures)."""
        return SAESuiteConfig(
            model=model_name,
            layers=(self.layer,),
            kinds=("sae",),
            d_sae=self.d_sae,
            k=self.k,
            transcoder_k=None,
            corpus="embedded",
            n_seqs=None,
            seq_len=self.context_size,
            training_tokens=self.training_tokens,
            batch_size_tokens=self.batch_size_tokens,
            lr=self.lr,
            lr_warm_up_steps=10,
            lr_decay_fraction=0.0,
            dead_feature_window=1000,
            n_checkpoints=0,
            seed=self.seed,
            exclude_first_positions=0,
            autocast=False,
            autocast_lm=False,
        )


def default_sae_dir(model: HookedTransformer, spec: SAETrainSpec) -> Path:
    """``<user cache>/saes/<model>-<hook>-topk<d_sae>-k<k>``."""
    name = (model.cfg.model_name or "model").replace("/", "_")
    return cache_dir() / "saes" / f"{name}-{spec.hook_name}-topk{spec.d_sae}-k{spec.k}"


def train_sae(
    model: HookedTransformer,
    spec: SAETrainSpec,
    *,
    tokens: torch.Tensor | None = None,
    out_dir: str | Path | None = None,
    device: str | None = None,
) -> Path:
    """Train a TopK SAE at ``spec.hook_name`` with the suite trainer, fully offline; returns the saved SAE's folder.

    Args:
        model: the TransformerLens model (on the device training runs on).
        spec: what to train.
        tokens: ``[n_seqs, context_size]`` training sequences; default: the whole embedded train split.
        out_dir: the training folder (default :func:`default_sae_dir`); the SAE is saved in its sub-folder named by
            the SAE's id (``blocks.L.hook_resid_post``), the activation cache and checkpoints in ``.train/`` (a rerun
            with the same spec returns the trained SAE at once).
        device: the training device; the model's own (None, the default) is the only one accepted: move the model.
    """
    check_hook(model, spec.hook_name)
    if spec.hook != "hook_resid_post":
        raise InputError(
            f"hook={spec.hook!r}: the SAE trainer trains residual SAEs at blocks.L.hook_resid_post (and MLP "
            "transcoders through tl_query_lens.saes.train.train_saes); use hook='hook_resid_post'."
        )
    model_device = next(model.parameters()).device
    if device is not None and torch.device(device) != model_device:
        raise InputError(f"device={device!r}: training runs on the model's device ({model_device}); move the model.")
    if tokens is None:
        tokens = _whole_split(model, spec.context_size)
    if tokens.shape[1] != spec.context_size:
        raise ValueError(f"tokens have {tokens.shape[1]} positions but spec.context_size={spec.context_size}.")
    out = Path(out_dir) if out_dir is not None else default_sae_dir(model, spec)
    logger.info(
        "training a TopK SAE (d_sae=%d, k=%d) at %s on %d tokens",
        spec.d_sae,
        spec.k,
        spec.hook_name,
        spec.training_tokens,
    )
    result = train_saes(model, spec.suite_config(model.cfg.model_name or "model"), tokens=tokens, folder=out)
    path = Path(result.folder) / sae_id("sae", spec.layer)
    logger.info("saved the SAE to %s", path)
    return path


def _whole_split(model: HookedTransformer, seq_len: int) -> torch.Tensor:
    """Every window of the embedded train split (disjoint from calibration and evaluation by document hash)."""
    try:
        return load_corpus("embedded", model, n_seqs=10**9, seq_len=seq_len, split="train")
    except ValueError as err:  # the message states how many windows the split holds
        n = int(str(err).split(" holds ")[1].split()[0])
        return load_corpus("embedded", model, n_seqs=n, seq_len=seq_len, split="train")
