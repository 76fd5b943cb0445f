"""Cross-lens check, the authors' protocol: vote over layers with a planted dominant feature, nulls, the bank."""

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.operators import value_operators
from tl_query_lens.readout import fit_readout
from tl_query_lens.readout.config import CrossLensConfig
from tl_query_lens.readout.cross_lens_paper import (
    CrossLensPromptResult,
    DominantFeatures,
    bank_states,
    cross_lens_prompts,
    dominant_active,
    final_residuals,
    load_prompt_bank,
    majority_same,
    mid_band_layers,
    wilson,
)
from tl_query_lens.readout.decompose import decompose_rows, token_logit, vocab_mean_contrast
from tl_query_lens.readout.sae import unembedding_rows

FIT = {
    "width": 96,
    "k": 8,
    "steps": 40,
    "batch_rows": 64,
    "batch_pairs": 32,
    "log_every": 20,
    "progress": False,
}


def test_dominant_excludes_inactive_features_and_vote_counts_layers():
    # Feature 2 has the largest |p_i| but β_2 = 0 (not in the row's code): it cannot dominate.
    c = torch.tensor([[0.5, -3.0, 9.0, 0.1]])
    beta = torch.tensor([1.0, 2.0, 0.0, 1.0])
    assert dominant_active(c * (beta != 0), beta).tolist() == [1]
    assert dominant_active(c, torch.zeros(4)).tolist() == [-1]
    a = torch.tensor([[4, 4, 7, 7], [1, 2, 3, 4]])
    b = torch.tensor([[4, 5, 7, 8], [1, 9, 9, 9]])
    # prompt 0: same on 2 of 4 layers → passes at 2 votes, fails at 3; prompt 1: 1 of 4 → fails at 2.
    assert majority_same(a, b, min_votes=2).tolist() == [True, False]
    assert majority_same(a, b, min_votes=3).tolist() == [False, False]
    # -1 (no active feature) never counts as agreement.
    assert not bool(majority_same(torch.tensor([-1, -1]), torch.tensor([-1, -1]), min_votes=1))
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)


def test_prompt_bank_schema():
    bank = load_prompt_bank()
    main = [p for p in bank if not p["group"].startswith("ctrl_")]
    assert len(main) == 80 and len(bank) - len(main) == 12
    assert len({p["id"] for p in bank}) == len(bank)
    assert all(p["answer"] and p["null_targets"] and p["concept"] for p in bank)
    assert mid_band_layers(30) == [20, 22, 24, 27]


def random_bank(seed: int, n: int, n_main: int, prompt_len: int, null_step: tuple[int, int]) -> list[dict]:
    """A seeded bank of random token prompts over the tiny vocabulary: ``n_main`` of one family, the rest controls."""
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "id": f"p{i}",
            "group": "ctrl_x" if i >= n_main else "fam",
            "concept": f"c{i}",
            "prompt": torch.randint(0, 61, (prompt_len,), generator=gen).tolist(),
            "answer": int(torch.randint(0, 61, (1,), generator=gen)),
            "null_targets": [int((i * null_step[0] + null_step[1]) % 61)],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def rms_setup(tmp_path_factory):
    model = tiny_model("gated_rms")
    fit = fit_readout(model, tiny_tokens(model, 6, 12), **FIT)
    return model, fit.sae


def planting_operator(h: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """Rank-one M with M h = direction (so LN_f(M h) ∝ direction under an RMS final norm)."""
    return torch.outer(direction, h) / (h @ h)


@torch.no_grad()
def test_two_layer_vote_with_a_planted_dominant_feature(rms_setup):
    model, sae = rms_setup
    prompt, answer = [3, 17, 29, 5, 11], 7
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    _, cache = model.run_with_cache(torch.tensor([prompt]), names_filter=hooks)
    h = [cache[k][0, -1].float() for k in hooks]
    # The answer row's active features are its stored code indices. A planted direction u has d_i·u = 0 for every
    # active i except the planted one (d_f·u = 1), so c_i = β_i (h̃·d_i) is non-zero only for the planted feature.
    idx = sae.code_indices[answer][sae.code_values[answer] != 0]
    D = sae.W_dec[idx].detach().float()  # [k_active, d]
    f, g = int(idx[0]), int(idx[1])
    d_f = torch.linalg.pinv(D) @ (idx == f).float()
    d_g = torch.linalg.pinv(D) @ (idx == g).float()
    bank = [{"id": "p", "group": "g", "concept": "c", "prompt": prompt, "answer": answer, "null_targets": []}]
    lens_a = {0: planting_operator(h[0], d_f), 1: planting_operator(h[1], d_f)}
    both = {0: planting_operator(h[0], d_f), 1: planting_operator(h[1], d_f)}
    one = {0: planting_operator(h[0], d_f), 1: planting_operator(h[1], d_g)}
    res = cross_lens_prompts(model, sae, lens_a, both, bank, layers=[0, 1], min_votes=2)
    assert res.dominant_a.tolist() == [[f, f]] and res.dominant_b.tolist() == [[f, f]]
    assert res.passes.tolist() == [True] and res.paper_agreement == 1.0
    res1 = cross_lens_prompts(model, sae, lens_a, one, bank, layers=[0, 1], min_votes=2)
    assert res1.dominant_b[0, 1].item() != f and res1.passes.tolist() == [False] and res1.paper_agreement == 0.0
    assert cross_lens_prompts(model, sae, lens_a, one, bank, layers=[0, 1], min_votes=1).passes.tolist() == [True]


@torch.no_grad()
def test_identical_lenses_pass_and_nulls_are_lower(rms_setup, tmp_path):
    model, sae = rms_setup
    bank = random_bank(seed=0, n=12, n_main=10, prompt_len=6, null_step=(7, 3))
    eye = {layer: torch.eye(model.cfg.d_model) for layer in (0, 1, 2)}
    res = cross_lens_prompts(model, sae, eye, {k: v.clone() for k, v in eye.items()}, bank, layers=[0, 1, 2])
    assert res.paper_agreement == 1.0 and res.own_top1_agreement == 1.0 and res.own_top1_tokens_differ == 0.0
    assert res.n_prompts == 10 and res.n_controls == 2 and res.control_agreement == 1.0
    assert res.null_shuffled < 1.0 and 0.0 <= res.null_unrelated <= 1.0
    own = cross_lens_prompts(model, sae, eye, eye, bank, layers=[0, 1, 2], protocol="own-top1")
    assert own.headline == own.own_top1_agreement and res.headline == res.paper_agreement
    back = CrossLensPromptResult.load(res.save(tmp_path / "r"))
    assert torch.equal(back.dominant_a, res.dominant_a) and back.per_group == res.per_group
    with pytest.raises(KeyError, match="no operator in both lenses"):
        cross_lens_prompts(model, sae, eye, {0: eye[0]}, bank, layers=[0, 1])
    with pytest.raises(ValueError, match="protocol must be"):
        CrossLensConfig(protocol="fixed")


def test_lens_pushed_on_the_bank_states_equals_the_full_operator(rms_setup):
    """The engine's feature basis (only the bank's states pushed) gives the same check as full d x d operators."""
    model, sae = rms_setup
    bank = random_bank(seed=1, n=10, n_main=8, prompt_len=5, null_step=(5, 2))
    layers = [0, 1]
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    corpora = [tiny_tokens(model, 3, 10, seed=s) for s in (0, 1)]
    full = [value_operators(model, t, hooks, progress=False) for t in corpora]
    states = bank_states(model, bank, layers)
    pushed = [
        {
            layer: value_operators(model, t, [h], basis=states[:, j], progress=False)[h]
            for j, (layer, h) in enumerate(zip(layers, hooks))
        }
        for t in corpora
    ]
    for ops, push in zip(full, pushed):  # columns are M h_i, the full operator applied to each state
        for j, (layer, h) in enumerate(zip(layers, hooks)):
            ref = states[:, j] @ ops[h].T
            torch.testing.assert_close(push[layer].T, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    ref = cross_lens_prompts(
        model,
        sae,
        *[{layer: ops[h] for layer, h in zip(layers, hooks)} for ops in full],
        bank,
        layers=layers,
        min_votes=1,
    )
    run = final_residuals(model, [p["prompt"] for p in bank], hooks)  # precomputed: the bank is not run again
    res = cross_lens_prompts(model, sae, pushed[0], pushed[1], bank, states=run, layers=layers, min_votes=1)
    assert torch.equal(res.dominant_a, ref.dominant_a) and torch.equal(res.dominant_b, ref.dominant_b)
    assert res.paper_agreement == ref.paper_agreement and res.own_top1_agreement == ref.own_top1_agreement
    with pytest.raises(ValueError, match="states must be final_residuals"):
        cross_lens_prompts(model, sae, pushed[0], pushed[1], bank, states=(run[0][:, :1], run[1]), layers=layers)
    with pytest.raises(ValueError, match="pushed on the bank"):
        cross_lens_prompts(model, sae, {0: states[:3, 0].T, 1: states[:3, 1].T}, pushed[1], bank, layers=layers)


def test_dominant_features_equal_the_full_decomposition(rms_setup):
    """The check's shortcut β (z_t, or z_t − mean code) picks the same dominant feature as decompose_rows."""
    model, sae = rms_setup
    rows, V = unembedding_rows(model), model.cfg.d_vocab
    states = torch.randn(6, model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    dominant = DominantFeatures(sae)
    proj = dominant.projections(states)
    for i, h in enumerate(states):
        for t in (0, 7, 33, V - 1):
            for vocab_mean, alpha in ((False, token_logit(t, V)), (True, vocab_mean_contrast(t, V))):
                dec = decompose_rows(sae, h, alpha, rows, n_top=0)
                assert dominant(proj[i], t, vocab_mean=vocab_mean) == int(
                    dominant_active(dec.contributions[None], dec.beta)[0]
                )
