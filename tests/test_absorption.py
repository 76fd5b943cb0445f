"""First-letter absorption on constructed dictionaries whose answer is known (no model needed)."""

from __future__ import annotations

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tl_query_lens.dictionaries.absorption import LETTERS, FirstLetterActivations, first_letter_absorption
from tl_query_lens.dictionaries.config import AbsorptionConfig

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
    data = FirstLetterActivations(
        words=[f"w{i}" for i in range(n_words)], letters=letters, is_train=is_train, acts={HOOK: x}
    )
    return data, special, d


def _sae(W_enc: torch.Tensor, W_dec: torch.Tensor, b_enc: float = -0.5) -> StandardSAE:
    cfg = StandardSAEConfig(
        d_in=W_enc.shape[0], d_sae=W_dec.shape[0], dtype="float32", device="cpu", metadata=SAEMetadata(hook_name=HOOK)
    )
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
    assert faithful.note == absorbed.note == ""
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


def test_result_saves_and_loads(tmp_path):
    data, special, d = _world()
    clean, _ = _dictionaries(d, special)
    result = first_letter_absorption(clean, data, cfg=AbsorptionConfig(probe_epochs=5, sparse_epochs=5))
    loaded = type(result).load(result.save(tmp_path / "abs"))
    assert loaded.per_letter == result.per_letter
    assert loaded.mean_absorption_fraction == result.mean_absorption_fraction


def test_per_word_rules_equal_saebench_calculator():
    """The per-word absorption fraction and full-absorption flag equal sae_bench 0.6.0's own calculator (an
    independent implementation) on a random ReLU SAE with unit-norm decoder rows, random probe and main latents."""
    calc_mod = pytest.importorskip("sae_bench.evals.absorption.feature_absorption_calculator")
    from tl_query_lens.dictionaries.absorption import _word_absorption

    gen = torch.Generator().manual_seed(0)
    d, d_sae, n = 16, 40, 300
    W_dec = torch.randn(d_sae, d, generator=gen)
    sae = _sae(torch.randn(d, d_sae, generator=gen), W_dec / W_dec.norm(dim=1, keepdim=True), b_enc=-1.0)
    x = torch.randn(n, d, generator=gen)
    probe = torch.randn(d, generator=gen)
    words = [f"w{i}" for i in range(n)]
    by_word = dict(zip(words, x))

    class CachedModel:  # SAEBench's calculator only runs prompts through run_with_cache / to_tokens
        def to_tokens(self, text):
            return torch.zeros(1, 3)

        def run_with_cache(self, prompts, names_filter):
            acts = torch.stack([by_word[p.split("\n")[-1][: -len(":")]] for p in prompts])
            return None, {names_filter[0]: acts[:, None, :]}

    calc = calc_mod.FeatureAbsorptionCalculator(
        model=CachedModel(), icl_word_list=["a", "b"], max_icl_examples=1, word_token_pos=-1
    )
    cfg = AbsorptionConfig()
    direction = probe / probe.norm()
    cos = sae.W_dec.detach() @ direction
    branches = set()
    for main in ([3], [0, 7], []):
        reference = calc.calculate_absorption(sae, words, probe, main, layer=0, show_progress=False)
        for word, ref in zip(words, reference.word_results):
            acts = sae.encode(by_word[word][None])[0].detach()
            fraction, full = _word_absorption((by_word[word] @ direction).item(), acts * cos, cos, acts, main, cfg)
            assert fraction == pytest.approx(ref.absorption_fraction, abs=1e-5), word
            assert full == ref.is_full_absorption, word
            branches.add((round(fraction, 6) in (0.0, 1.0), full))
    assert len(branches) >= 3  # partial, zero/one and full-absorption cases were all exercised


@pytest.mark.slow
def test_first_letter_prompts_on_the_embedded_model():
    """Prompts put the word token at the returned position, answers are right, and the collected activations equal
    TransformerLens' own cache of the full forward pass at that position."""
    from tl_query_lens import load_model
    from tl_query_lens.dictionaries.absorption import (
        build_first_letter_prompts,
        first_letter_activations,
        first_letter_words,
    )

    model = load_model("smollm2-135m")
    tok = model.tokenizer
    cfg = AbsorptionConfig(n_words=24, n_icl_examples=2, batch_size=8)
    words = first_letter_words(tok, 24, cfg.seed)
    assert all(text.strip().isalpha() and len(tok.encode(text, add_special_tokens=False)) >= 1 for _, text in words)
    prompts, pos = build_first_letter_prompts(model, words, [i < 19 for i in range(24)], cfg)
    assert prompts[:, pos].tolist() == [idx for idx, _ in words]
    for line in tok.decode(prompts[0]).split("\n")[1:-1]:  # the in-context examples
        word, answer = line.split(" has the first letter: ")
        assert answer == word.strip()[0].upper()
    hook = "blocks.3.hook_resid_post"
    data = first_letter_activations(model, [hook], cfg=cfg)
    _, cache = model.run_with_cache(prompts[:2], names_filter=[hook])
    torch.testing.assert_close(data.acts[hook][:2], cache[hook][:, pos], atol=1e-4, rtol=1e-4)
    assert data.is_train.sum() == 19 and data.words == [text for _, text in words]


def test_write_vectors_follow_decoder_norm_rescaling():
    """A TopK SAE that divides codes by ‖W_dec_i‖ writes W_dec_i/‖W_dec_i‖ per unit code: the projections used for
    absorption must see that (SAEBench's a·cos is right for it; a·(W_dec·p) would not be)."""
    from sae_lens import TopKSAE, TopKSAEConfig

    from tl_query_lens.dictionaries.absorption import write_vectors

    torch.manual_seed(0)
    sae = TopKSAE(
        TopKSAEConfig(
            d_in=8,
            d_sae=20,
            k=3,
            rescale_acts_by_decoder_norm=True,
            dtype="float32",
            device="cpu",
            metadata=SAEMetadata(hook_name=HOOK),
        )
    )
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
    vectors = write_vectors(sae)
    torch.testing.assert_close(vectors, sae.W_dec / sae.W_dec.norm(dim=1, keepdim=True))
    codes = sae.encode(torch.randn(5, 8))
    torch.testing.assert_close(codes @ vectors + sae.b_dec, sae.decode(codes))
