"""TopK transcoders in SAELens' ``Transcoder`` format, and the training classes SAELens' trainer drives.

SAELens 6.54 ships inference-only transcoders (``Transcoder``: ReLU; ``JumpReLUTranscoder``; skip variants) and no
training class for any of them: ``SAETrainer.step`` hands one activation tensor to
``TrainingSAE.training_forward_pass``, which reconstructs that same tensor. So the trainer itself cannot train a
transcoder, but it can drive any registered training class. :class:`TopKTrainingTranscoder` is SAELens'
``TopKTrainingSAE`` (same TopK rule, same MSE + AuxK loss, same decoder-norm rescaling) whose training batch is the
MLP input and output stacked on the last axis, ``[x, y]``; it predicts y from x. Saving it with
``save_inference_model`` writes a :class:`TopKTranscoder` (a ``Transcoder`` subclass, registered as
``"topk_transcoder"``) that ``SAE.load_from_disk`` and ``HookedSAETransformer.add_sae`` accept: the transcoder reads
``metadata.hook_name`` (the MLP input) and writes ``metadata.hook_name_out`` (``blocks.L.hook_mlp_out``).

:class:`FastTopKTrainingSAE` is SAELens' ``TopKTrainingSAE`` with the decoder applied to the k active features only
(``embedding_bag``), which gives the same output and gradients and skips two of the five dense products of a
training step on a CPU; it saves as SAELens' own ``"topk"`` SAE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from sae_lens import register_sae_class, register_sae_training_class
from sae_lens.registry import SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY
from sae_lens.saes.sae import TrainStepInput, TrainStepOutput
from sae_lens.saes.topk_sae import TopK, TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.saes.transcoder import Transcoder, TranscoderConfig
from torch import nn


def sparse_decode(feature_acts: Float[torch.Tensor, "... d_sae"], W_dec: torch.Tensor, k: int) -> torch.Tensor:
    """``feature_acts @ W_dec`` for rows with at most ``k`` nonzeros, through the k largest entries only."""
    flat = feature_acts.reshape(-1, feature_acts.shape[-1])
    values, idx = flat.topk(k, dim=-1, sorted=False)
    out = F.embedding_bag(idx, W_dec, per_sample_weights=values, mode="sum")
    return out.reshape(*feature_acts.shape[:-1], W_dec.shape[-1])


def _decode_k_active(sae: TopKTrainingSAE, feature_acts: torch.Tensor) -> torch.Tensor:
    """SAELens' ``TopKTrainingSAE.decode`` with the product restricted to the k active features."""
    if feature_acts.is_sparse or feature_acts.shape[-1] <= 4 * sae.cfg.k:
        return TopKTrainingSAE.decode(sae, feature_acts)
    if sae.cfg.rescale_acts_by_decoder_norm:
        feature_acts = feature_acts / sae.W_dec.norm(dim=-1)
    sae_out = sparse_decode(feature_acts, sae.W_dec, sae.cfg.k) + sae.b_dec
    sae_out = sae.hook_sae_recons(sae_out)
    sae_out = sae.run_time_activation_norm_fn_out(sae_out)
    return sae.reshape_fn_out(sae_out, sae.d_head)


class FastTopKTrainingSAE(TopKTrainingSAE):
    """SAELens' TopK training SAE with a k-sparse decoder product (same outputs and gradients; saves as ``"topk"``)."""

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        return _decode_k_active(self, feature_acts)


@dataclass
class TopKTranscoderConfig(TranscoderConfig):
    """Inference config of a TopK transcoder: the k largest pre-activations (ReLU'd) are kept.

    Attributes:
        k: active features per token.
        rescale_acts_by_decoder_norm: rank pre-activations by ``pre·‖W_dec_i‖`` (as SAELens' TopK SAE does).
    """

    k: int = 32
    rescale_acts_by_decoder_norm: bool = False

    @classmethod
    def architecture(cls) -> str:
        return "topk_transcoder"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae={self.d_sae}, got {self.k}.")


class TopKTranscoder(Transcoder):
    """A transcoder whose activation keeps the k largest pre-activations: reads ``hook_name``, writes ``hook_name_out``."""

    cfg: TopKTranscoderConfig  # type: ignore[assignment]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        hidden_pre = self.hook_sae_acts_pre(self.process_sae_in(x) @ self.W_enc + self.b_enc)
        if self.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * self.W_dec.norm(dim=-1)
        return self.hook_sae_acts_post(self.activation_fn(hidden_pre))

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        if self.cfg.rescale_acts_by_decoder_norm:
            feature_acts = feature_acts / self.W_dec.norm(dim=-1)
        return self.hook_sae_recons(feature_acts @ self.W_dec + self.b_dec)

    def get_activation_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return TopK(self.cfg.k)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> TopKTranscoder:
        return cls(TopKTranscoderConfig.from_dict(config_dict))


@dataclass
class TopKTrainingTranscoderConfig(TopKTrainingSAEConfig):
    """Training config of a TopK transcoder (SAELens' TopK training config plus the output width ``d_out``)."""

    d_out: int = 0
    apply_b_dec_to_input: bool = False

    @classmethod
    def architecture(cls) -> str:
        return "topk_transcoder"

    def __post_init__(self) -> None:
        if self.d_out <= 0:
            raise ValueError("TopKTrainingTranscoderConfig.d_out must be the width of the output hook (> 0).")
        if self.apply_b_dec_to_input:
            raise ValueError("A transcoder's b_dec lives in the output space: apply_b_dec_to_input must be False.")
        super().__post_init__()


class TopKTrainingTranscoder(TopKTrainingSAE):
    """TopK transcoder trained by SAELens' ``SAETrainer``: each batch row is ``[x, y]`` (input then target)."""

    cfg: TopKTrainingTranscoderConfig  # type: ignore[assignment]

    def initialize_weights(self) -> None:
        super().initialize_weights()
        cfg, kw = self.cfg, {"dtype": self.dtype, "device": self.device}
        w_dec = torch.empty(cfg.d_sae, cfg.d_out, **kw)
        nn.init.kaiming_uniform_(w_dec)
        if cfg.decoder_init_norm is not None:
            w_dec *= cfg.decoder_init_norm / w_dec.norm(dim=-1, keepdim=True)
        self.W_dec = nn.Parameter(w_dec)
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_out, **kw))
        if cfg.d_out == cfg.d_in:
            self.W_enc = nn.Parameter(w_dec.T.clone().contiguous())

    def process_sae_in(self, sae_in: torch.Tensor) -> torch.Tensor:
        sae_in = self.hook_sae_input(sae_in.to(self.dtype))
        sae_in = self.run_time_activation_norm_fn_in(sae_in)
        return sae_in - self.input_mean if hasattr(self, "input_mean") else sae_in

    def center_input(self, mean: torch.Tensor) -> None:
        """Subtract a fixed input mean before the encoder during training (the transcoder's counterpart of an SAE's
        ``b_dec``-on-input: with ``b_enc`` alone, every ``W_enc`` update shifts all pre-activations by
        ``x̄·ΔW_enc``, faster than Adam moves ``b_enc`` back). Saved in checkpoints; folded into ``b_enc`` on export."""
        self.register_buffer("input_mean", mean.detach().to(self.W_enc).clone())

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        if "input_mean" in state_dict and not hasattr(self, "input_mean"):
            self.center_input(state_dict["input_mean"])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def process_state_dict_for_saving_inference(self, state_dict: dict[str, Any]) -> None:
        super().process_state_dict_for_saving_inference(state_dict)
        mean = state_dict.pop("input_mean", None)
        if mean is not None:  # (x − x̄) W + b = x W + (b − x̄ W): the inference transcoder reads raw x
            state_dict["b_enc"] = state_dict["b_enc"] - mean @ state_dict["W_enc"]

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        return _decode_k_active(self, feature_acts)

    def split(self, stacked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[x, y]`` rows → ``(x, y)``."""
        expected = self.cfg.d_in + self.cfg.d_out
        if stacked.shape[-1] != expected:
            raise ValueError(
                f"A transcoder batch stacks input and target: {expected} columns, got {stacked.shape[-1]}."
            )
        return stacked[..., : self.cfg.d_in], stacked[..., self.cfg.d_in :]

    def training_forward_pass(self, step_input: TrainStepInput) -> TrainStepOutput:
        x, y = self.split(step_input.sae_in)
        feature_acts, hidden_pre = self.encode_with_hidden_pre(x)
        sae_out = self.decode(feature_acts)
        mse_loss = self.mse_loss_fn(sae_out, y).sum(dim=-1).mean()
        aux = self.calculate_topk_aux_loss(
            sae_in=y, sae_out=sae_out, hidden_pre=hidden_pre, dead_neuron_mask=step_input.dead_neuron_mask
        )
        return TrainStepOutput(
            sae_in=y,
            sae_out=sae_out,
            feature_acts=feature_acts,
            hidden_pre=hidden_pre,
            loss=mse_loss + aux,
            losses={"mse_loss": mse_loss, "auxiliary_reconstruction_loss": aux},
        )


if "topk_transcoder" not in SAE_CLASS_REGISTRY:
    register_sae_class("topk_transcoder", TopKTranscoder, TopKTranscoderConfig)
if "topk_transcoder" not in SAE_TRAINING_CLASS_REGISTRY:
    register_sae_training_class("topk_transcoder", TopKTrainingTranscoder, TopKTrainingTranscoderConfig)
