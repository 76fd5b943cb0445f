"""Faithfulness of a transcoder to the MLP it replaces: which features have a matching FF-KV neuron (arXiv 2510.22332).

The FF-KV paper asks whether a transcoder's features translate the MLP's own key-value memories or are new
directions. For every transcoder feature i: the best |cosine| of its encoder direction against every FF key,
``max_j |cos(k_i, K_j)|``, and of its decoder direction against every FF value, ``max_j |cos(v_i, V_j)|`` (absolute:
a SwiGLU neuron's activation is signed, so −K_j is the same neuron). A feature *matches* when both exceed the
``quantile`` of the same statistics after a Haar-random rotation of the transcoder's directions (the null: the same
geometry, no alignment with the MLP's basis); ``matched_same`` also asks that both maxima come from one neuron.
With identical directions every share is 1; for random directions it is the null level ``1 − quantile`` (enc or dec)
and about its square for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Float

from tl_query_lens.config import check_ranges, resolve_config
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.results import SavableResult


@dataclass
class FaithfulnessConfig:
    """Options of :func:`transcoder_faithfulness`.

    Attributes:
        quantile: quantile of the null distribution (best cosines after random rotations) a match must exceed.
        n_rotations: random rotations of the transcoder's vectors that make the null distribution.
        chunk: rows per block of the all-pairs cosine search (memory grows with chunk x d_mlp).
        seed: seed of the random rotations.
    """

    quantile: float = 0.99
    n_rotations: int = 4
    chunk: int = 1024
    seed: int = 0

    RANGES: ClassVar[dict[str, str]] = {
        "quantile": "(0, 1)",
        "n_rotations": "[1, inf)",
        "chunk": "[1, inf)",
        "seed": "[0, 4294967295]",
    }

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class FaithfulnessResult(SavableResult):
    """Share of a transcoder's features with a matching FF-KV neuron.

    Attributes:
        share_matched_enc / share_matched_dec: features whose best key / value cosine exceeds the null threshold.
        share_matched: features matching on both sides (the paper's criterion).
        share_matched_same: both sides, and the best key and best value belong to one neuron.
        null_share_matched: ``share_matched`` of the rotated transcoder (what chance gives).
        threshold_enc / threshold_dec: null quantiles of the best |cosine|.
        mean_max_cos_enc / mean_max_cos_dec: means of the best |cosine|; ``null_mean_max_cos_*`` for the rotations.
        max_cos_enc / max_cos_dec: per-feature best |cosine| ``[d_sae]``; ``best_neuron_enc/dec`` their argmax.
    """

    share_matched_enc: float
    share_matched_dec: float
    share_matched: float
    share_matched_same: float
    null_share_matched: float
    threshold_enc: float
    threshold_dec: float
    mean_max_cos_enc: float
    mean_max_cos_dec: float
    null_mean_max_cos_enc: float
    null_mean_max_cos_dec: float
    max_cos_enc: torch.Tensor
    max_cos_dec: torch.Tensor
    best_neuron_enc: torch.Tensor
    best_neuron_dec: torch.Tensor


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def max_abs_cosine(
    a: Float[torch.Tensor, "n d"], b: Float[torch.Tensor, "m d"], chunk: int = 1024
) -> tuple[Float[torch.Tensor, " n"], torch.Tensor]:
    """For each row of ``a``: the largest |cosine| with any row of ``b`` and the index of that row."""
    b = _unit(b.double())
    best, idx = [], []
    for part in _unit(a.double()).split(chunk):
        values, index = (part @ b.T).abs().max(dim=1)
        best.append(values)
        idx.append(index)
    return torch.cat(best).float(), torch.cat(idx)


def random_rotation(d: int, generator: torch.Generator) -> Float[torch.Tensor, "d d"]:
    """A Haar-random orthogonal matrix (QR of a Gaussian, signs fixed by R's diagonal)."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


@torch.no_grad()
def transcoder_faithfulness(
    transcoder, ffkv, *, cfg: FaithfulnessConfig | None = None, **overrides
) -> FaithfulnessResult:
    """Match ``transcoder``'s encoder / decoder directions against ``ffkv``'s keys / values (module docstring).

    Both are any dictionaries :func:`as_key_value` accepts whose read and write spaces have the same widths.
    """
    cfg = resolve_config(FaithfulnessConfig, cfg, overrides)
    tc, ff = as_key_value(transcoder), as_key_value(ffkv)
    if tc.d_in != ff.d_in or tc.d_out != ff.d_out:
        raise ValueError(
            f"Widths differ: transcoder reads {tc.d_in} / writes {tc.d_out}, FF-KV reads {ff.d_in} / writes "
            f"{ff.d_out}; compare dictionaries of the same layer's MLP."
        )
    keys, values = tc.keys.cpu(), tc.values.cpu()
    ff_keys, ff_values = ff.keys.cpu(), ff.values.cpu()
    enc, enc_idx = max_abs_cosine(keys, ff_keys, cfg.chunk)
    dec, dec_idx = max_abs_cosine(values, ff_values, cfg.chunk)
    gen = torch.Generator().manual_seed(cfg.seed)
    null_enc, null_dec = [], []
    for _ in range(cfg.n_rotations):
        rot_in = random_rotation(tc.d_in, gen)
        rot_out = random_rotation(tc.d_out, gen)
        null_enc.append(max_abs_cosine(keys.double() @ rot_in, ff_keys, cfg.chunk)[0])
        null_dec.append(max_abs_cosine(values.double() @ rot_out, ff_values, cfg.chunk)[0])
    null_enc_t, null_dec_t = torch.stack(null_enc), torch.stack(null_dec)
    thr_enc = torch.quantile(null_enc_t.flatten().double(), cfg.quantile).item()
    thr_dec = torch.quantile(null_dec_t.flatten().double(), cfg.quantile).item()
    match_enc, match_dec = enc > thr_enc, dec > thr_dec
    null_both = ((null_enc_t > thr_enc) & (null_dec_t > thr_dec)).float().mean().item()
    return FaithfulnessResult(
        share_matched_enc=match_enc.float().mean().item(),
        share_matched_dec=match_dec.float().mean().item(),
        share_matched=(match_enc & match_dec).float().mean().item(),
        share_matched_same=(match_enc & match_dec & (enc_idx == dec_idx)).float().mean().item(),
        null_share_matched=null_both,
        threshold_enc=thr_enc,
        threshold_dec=thr_dec,
        mean_max_cos_enc=enc.mean().item(),
        mean_max_cos_dec=dec.mean().item(),
        null_mean_max_cos_enc=null_enc_t.mean().item(),
        null_mean_max_cos_dec=null_dec_t.mean().item(),
        max_cos_enc=enc,
        max_cos_dec=dec,
        best_neuron_enc=enc_idx,
        best_neuron_dec=dec_idx,
    )
