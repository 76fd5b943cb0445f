"""Subspace channels: reduced-rank regression, Adam recipe, overlaps, AUC and permutation p (docs/design.md §5)."""

from __future__ import annotations

import pytest
import torch

from tl_query_lens.query_lens.channels import (
    ChannelAnalysis,
    auc,
    channel_analysis,
    fit_adam,
    fit_metrics,
    module_responses,
    permutation_p,
    reduced_rank_regression,
    subspace_overlap,
)


def _data(n=80, d_in=12, d_out=10, seed=0, noise=0.1):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=gen)
    W = torch.randn(d_out, d_in, generator=gen)
    return X, X @ W.T + noise * torch.randn(n, d_out, generator=gen)


def _lstsq_svd_reference(X, Y, r):
    """Independent construction: OLS by lstsq, then project onto the top-r right singular vectors of the fit."""
    W_ols = torch.linalg.lstsq(X.double(), Y.double()).solution  # [d_in, d_out], Y ≈ X W_ols
    _, _, Vh = torch.linalg.svd(X.double() @ W_ols, full_matrices=False)
    P = Vh[:r].T @ Vh[:r]
    return (W_ols @ P).T  # [d_out, d_in]


@pytest.mark.parametrize("rank", [1, 3, 7])
def test_rrr_matches_lstsq_svd_reference(rank):
    X, Y = _data()
    fit = reduced_rank_regression(X, Y, rank)
    ref = _lstsq_svd_reference(X, Y, rank)
    torch.testing.assert_close(fit.W.double(), ref, atol=1e-4, rtol=1e-4)
    assert torch.linalg.matrix_rank(fit.W) == rank


def test_rrr_rank_deficient_inputs_match_reference():
    X, Y = _data(n=8, d_in=12)  # fewer samples than inputs: the min-norm route must still be optimal
    fit = reduced_rank_regression(X, Y, 3)
    ref = _lstsq_svd_reference(X, Y, 3)
    torch.testing.assert_close(fit(X).double(), X.double() @ ref.T, atol=1e-4, rtol=1e-4)


def test_rrr_train_mse_not_worse_than_adam():
    X, Y = _data()
    closed = fit_metrics(reduced_rank_regression(X, Y, 3), X, Y)["mse"]
    adam = fit_metrics(fit_adam(X, Y, 3, lr=3e-2, epochs=100), X, Y)["mse"]
    assert closed <= adam + 1e-9
    assert adam < fit_metrics(fit_adam(X, Y, 3, lr=1e-2, epochs=0), X, Y)["mse"]  # Adam did learn something


def test_adam_recipe_initialisation():
    X, Y = _data()
    fit = fit_adam(X, Y, 4, epochs=0, init_std=0.01, seed=42)
    assert fit.B.abs().max() == 0 and 0.005 < fit.A.std() < 0.02


def test_fit_metrics_of_exact_fit():
    X, _ = _data()
    W = torch.randn(10, 12)
    Y = X @ W.T
    fit = reduced_rank_regression(X, Y, 10)
    m = fit_metrics(fit, X, Y)
    assert m["explained_energy"] == pytest.approx(1.0, abs=1e-6)
    assert m["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert m["rel_l2"] < 1e-5


def test_overlap_identical_orthogonal_random():
    Q, _ = torch.linalg.qr(torch.randn(20, 6))
    assert subspace_overlap(Q[:, :3], Q[:, :3]) == pytest.approx(1.0)
    assert subspace_overlap(Q[:, :3], Q[:, 3:]) == pytest.approx(0.0, abs=1e-12)
    rot, _ = torch.linalg.qr(torch.randn(3, 3))
    assert subspace_overlap(Q[:, :3], Q[:, :3] @ rot) == pytest.approx(1.0)  # basis choice does not matter


def test_auc_and_permutation_p():
    assert auc(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == 1.0
    assert auc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5
    scores = torch.cat([torch.arange(10.0) + 100, torch.arange(30.0)])
    labels = torch.tensor([True] * 10 + [False] * 30)
    assert permutation_p(scores, labels, n_permutations=500) == pytest.approx(1 / 501)
    assert permutation_p(torch.zeros(40), labels, n_permutations=200) == 1.0


def test_channel_analysis_separates_planted_destinations():
    """Modules of the same block share a planted output subspace; different blocks use different subspaces."""
    d, L, r = 24, 4, 6
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen))
    ops = {}
    for k in range(1, L):
        Qk = basis[:, (k - 1) * r : k * r]
        for m in ("attn", "mlp"):
            ops[f"blocks.{k}.{m}"] = Qk @ torch.randn(r, d, generator=gen)
    values = torch.randn(60, d, generator=gen)
    res = channel_analysis({0: values}, ops, n_layers=L, n_permutations=200, fits=("closed_form",))
    s = res.summary["closed_form"]
    assert res.rank == r and s["n_same"] == 3 and s["n_different"] == 12
    assert s["ol_same"] == pytest.approx(1.0, abs=1e-6) and s["ol_different"] == pytest.approx(0.0, abs=1e-6)
    assert s["auc"] == 1.0
    m = res.metrics["closed_form"]["l0->blocks.2.mlp"]
    assert m["explained_energy"] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="destination='layer'"):
        channel_analysis({0: values}, ops, n_layers=L, destination="module", fits=("closed_form",))


def test_channel_analysis_save_load_and_errors(tmp_path):
    d = 8
    ops = {f"blocks.{k}.{m}": torch.randn(d, d) for k in (1, 2) for m in ("attn", "mlp")}
    values = torch.randn(30, d)
    res = channel_analysis({0: values}, ops, n_layers=4, n_permutations=50, epochs=20)
    assert set(res.metrics) == {"closed_form", "adam"}
    res.save(tmp_path / "ch")
    back = ChannelAnalysis.load(tmp_path / "ch")
    assert back.summary == res.summary and back.channels == res.channels
    torch.testing.assert_close(module_responses(values, ops)["blocks.1.attn"], values @ ops["blocks.1.attn"].T)
    with pytest.raises(ValueError, match="downstream"):
        channel_analysis({2: values}, ops, n_layers=4)
    with pytest.raises(ValueError, match="train_frac"):
        channel_analysis({0: values}, ops, n_layers=4, train_frac=1.0)


def test_permutation_p_matches_naive_auc_permutations():
    """Rank-sum shortcut vs recomputing the AUC on each shuffled labelling (same null, so p-values agree)."""
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(30, generator=gen).round(decimals=1)  # ties included
    labels = torch.zeros(30, dtype=torch.bool)
    labels[:8] = True
    scores[:8] += 0.6
    observed = auc(scores[labels], scores[~labels])
    naive = []
    for _ in range(3000):
        perm = labels[torch.randperm(30, generator=gen)]
        naive.append(auc(scores[perm], scores[~perm]) >= observed - 1e-12)
    p_naive = (sum(naive) + 1) / 3001
    assert permutation_p(scores, labels, n_permutations=3000) == pytest.approx(p_naive, abs=0.02)


def test_subspace_channels_is_the_cli_protocol(tmp_path, monkeypatch):
    """The API function = FF-KV values + module operators of the downstream blocks + channel_analysis, and
    ``tlql ql-channels`` saves exactly what it returns."""
    from tests.helpers import tiny_model, tiny_tokens
    from tl_query_lens import FFKV
    from tl_query_lens.cli import main
    from tl_query_lens.operators import module_operators
    from tl_query_lens.query_lens.channels import subspace_channels

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, 2, 8)
    options = {"epochs": 5, "n_permutations": 20}
    res = subspace_channels(model, {0: FFKV.from_model(model, 0)}, tokens, **options)
    ops = module_operators(model, tokens, [1, 2])
    ref = channel_analysis(
        {0: FFKV.from_model(model, 0).W_dec.detach()}, {n: ops[n] for n in ops}, n_layers=3, **options
    )
    assert res.channels == ref.channels == [f"l0->blocks.{k}.{m}" for k in (1, 2) for m in ("attn", "mlp")]
    assert res.metrics == ref.metrics and res.overlaps == ref.overlaps and res.summary == ref.summary
    with pytest.raises(ValueError, match="key it by 0"):
        subspace_channels(model, {1: FFKV.from_model(model, 0)}, tokens, **options)
    # An attention write (hook_attn_out of block 0) also passes through block 0's MLP, which reads resid_mid.
    from tests.test_query_lens import standard_sae

    attn_sae = standard_sae(model, "blocks.0.hook_attn_out")
    res_attn = subspace_channels(model, {0: attn_sae}, tokens, **options)
    ops0 = module_operators(model, tokens, [0, 1, 2])
    mlp0 = ["blocks.0.mlp"] + [f"blocks.{k}.{m}" for k in (1, 2) for m in ("attn", "mlp")]
    ref_attn = channel_analysis(
        {0: attn_sae.W_dec.detach()}, {n: ops0[n] for n in mlp0}, n_layers=3, downstream={0: mlp0}, **options
    )
    assert res_attn.channels == ref_attn.channels == [f"l0->{n}" for n in mlp0]
    assert res_attn.metrics == ref_attn.metrics

    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr("tl_query_lens.corpus.load_corpus", lambda *a, n_seqs, seq_len, **kw: tiny_tokens(model, 2, 8))
    out = tmp_path / "ch"
    argv = ["ql-channels", "--sources", "0", "--epochs", "5", "--n-permutations", "20", "--no-wandb", "--out", str(out)]
    assert main(argv) == 0
    saved = ChannelAnalysis.load(out / "channels")
    assert saved.summary == res.summary and saved.metrics == res.metrics
    assert (out / "operators").is_dir()
