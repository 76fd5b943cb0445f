"""First-letter absorption on constructed dictionaries whose answer is known (no model needed)."""

from __future__ import annotations

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tl_query_lens.dictionaries.absorption import (
    LETTERS,
    AbsorptionConfig,
    FirstLetterActivations,
    first_letter_absorption,
)

HOOK = "blocks.0.hook_resid_post"
N_TRAIN, N_TEST = 30, 40  # words per letter; one stray test word moves F1 by less than the 0.03 split threshold
SPECIAL_EVERY = 3  # every third test word is "special": the absorbing SAE hands its letter to a token latent


def _world(seed: int = 0):
    """x_w = e_letter (+ 0.3 t_w for special test words) with orthonormal letter and token directions, small noise."""
    gen = torch.Generator().manual_seed(seed)
    per_letter = N_TRAIN + N_TEST
    n_words = len(LETTERS) * per_letter
    letters = torch.arange(len(LETTERS)).repeat_interleave(per_letter)
    rank = torch.arange(n_words) % per_letter
    is_train = rank < N_TRAIN
    special = ~is_train & ((rank - N_TRAIN) % SPECIAL_EVERY == 0)
    d = len(LETTERS) + int(special.sum())
    x = torch.zeros(n_words, d)
    x[torch.arange(n_words), letters] = 1.0
    x[special, len(LETTERS) + torch.arange(int(special.sum()))] = 0.3
    x += 1e-4 * torch.randn(x.shape, generator=gen)
    data = FirstLetterActivations(words=[f"w{i}" for i in range(n_words)], letters=letters, is_train=is_train,
                                  acts={HOOK: x})
    return data, special, d


def _sae(W_enc: torch.Tensor, W_dec: torch.Tensor, b_enc: float = -0.5) -> StandardSAE:
    cfg = StandardSAEConfig(d_in=W_enc.shape[0], d_sae=W_dec.shape[0], dtype="float32", device="cpu",
                            metadata=SAEMetadata(hook_name=HOOK))
    sae = StandardSAE(cfg)
    with torch.no_grad():
        sae.W_enc.copy_(W_enc)
        sae.W_dec.copy_(W_dec)
        sae.b_enc.fill_(b_enc)
        sae.b_dec.zero_()
    return sae


def _dictionaries(d: int, special: torch.Tensor):
    """A faithful SAE (one latent per letter) and one that also has a latent per special word which fires instead
    of the letter latent and writes letter + 0.3 token (unit norm): the letter is absorbed on those words."""
    n_let = len(LETTERS)
    eye = torch.eye(d)
    clean = _sae(eye[:, :n_let].clone(), eye[:n_let].clone())
    words = torch.nonzero(special).flatten()
    letters, tok = words // (N_TRAIN + N_TEST), n_let + torch.arange(len(words))
    absorber = eye[letters] + 0.3 * eye[tok]
    W_enc = torch.cat([eye[:, :n_let], eye[:, tok] * (absorber.norm(dim=1) + 0.5) / 0.3], dim=1)
    W_enc[tok, letters] = -4.0  # silence the letter latent on special words
    W_dec = torch.cat([eye[:n_let], absorber / absorber.norm(dim=1, keepdim=True)])
    return clean, _sae(W_enc, W_dec)


def test_absorbing_sae_scores_higher_than_a_faithful_one():
    data, special, d = _world()
    clean, absorbing = _dictionaries(d, special)
    cfg = AbsorptionConfig()
    faithful = first_letter_absorption(clean, data, cfg=cfg)
    absorbed = first_letter_absorption(absorbing, data, cfg=cfg)
    assert faithful.n_letters == absorbed.n_letters == len(LETTERS)
    assert faithful.mean_absorption_fraction == pytest.approx(0.0, abs=1e-6)
    assert faithful.mean_full_absorption == pytest.approx(0.0, abs=1e-6)
    # Expected: the share of special words among each letter's test words the probe fires on.
    expected = special.sum().item() / (~data.is_train).sum().item()
    assert absorbed.mean_absorption_fraction == pytest.approx(expected, abs=1e-6)
    assert absorbed.mean_full_absorption == pytest.approx(expected, abs=1e-6)
    assert all(len(v["main_latents"]) == 1 for v in absorbed.per_letter.values())


def test_too_few_letters_is_flagged():
    data, special, d = _world()
    clean, _ = _dictionaries(d, special)
    result = first_letter_absorption(clean, data, cfg=AbsorptionConfig(probe_epochs=30), min_letters=27)
    assert result.n_letters == 26 and "SAEBench needs 27" in result.note
    assert first_letter_absorption(clean, data, cfg=AbsorptionConfig(probe_epochs=30)).note == ""


def test_result_saves_and_loads(tmp_path):
    data, special, d = _world()
    clean, _ = _dictionaries(d, special)
    result = first_letter_absorption(clean, data, cfg=AbsorptionConfig(probe_epochs=5, sparse_epochs=5))
    loaded = type(result).load(result.save(tmp_path / "abs"))
    assert loaded.per_letter == result.per_letter
    assert loaded.mean_absorption_fraction == result.mean_absorption_fraction
