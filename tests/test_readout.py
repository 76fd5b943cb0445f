"""Readout SAEs: fit, exact decomposition, SAELens save/load/from_pretrained, diagnostics, baselines, bad input."""

from __future__ import annotations

import pytest
import torch
from sae_lens import SAE

from tests.helpers import STYLES, tiny_model, tiny_tokens
from tl_query_lens.primitives import cluster_bootstrap
from tl_query_lens.readout import (
    ReadoutFitConfig,
    ReadoutSAE,
    bind,
    cached_sae_path,
    collect_states,
    decompose,
    fit_readout,
    group_mean,
    margin,
    register_releases,
    token_logit,
    top1_vs_competitor,
    vocab_mean_contrast,
)
from tl_query_lens.readout import baselines as bl
from tl_query_lens.readout.config import BASELINE_ORDER
from tl_query_lens.readout.diagnostics import ablation_regression, evaluate_reconstruction
from tl_query_lens.readout.sae import unembedding_rows

FIT = {"width": 96, "k": 8, "steps": 60, "batch_rows": 64, "batch_pairs": 32, "log_every": 20, "progress": False}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    out = {}
    for style in STYLES:
        model = tiny_model(style)
        tokens = tiny_tokens(model, n_seqs=6, seq_len=12)
        fit = fit_readout(model, tokens, **FIT)
        out[style] = (model, tokens, fit)
    return out


def _final_states(model, tokens):
    """Logit-lens states of the last layer and the model's own logits on the same positions."""
    logits, cache = model.run_with_cache(tokens, names_filter=[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    resid = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    return model.ln_final(resid).reshape(-1, model.cfg.d_model).detach(), logits.reshape(-1, model.cfg.d_vocab).detach()


def _families(model, h):
    V = model.cfg.d_vocab
    alpha_c, top1, _comp = top1_vs_competitor(h, model)
    return {
        "token_logit": token_logit(top1, V),
        "margin": margin(3, 7, V),
        "group_mean": group_mean([1, 4, 9, 16], V),
        "vocab_mean_contrast": vocab_mean_contrast(top1, V),
        "top1_vs_competitor": alpha_c,
    }


@pytest.mark.parametrize("style", STYLES)
def test_identity_every_family_against_clean_logits(fitted, style):
    model, tokens, fit = fitted[style]
    h_all, logits = _final_states(model, tokens)
    b_U = model.b_U.detach()
    for j in (0, 7, 30):
        h = h_all[j]
        for name, alpha in _families(model, h).items():
            dec = decompose(fit.sae, h, alpha, model=model)
            total = dec.bias + dec.contributions.sum(-1) + dec.residual
            scale = dec.exact.abs().clamp_min(1e-3)
            assert ((total - dec.exact).abs() / scale).max() < 1e-5, name
            # Independent reference: the clean forward pass' logits minus b_U, combined with α.
            ref = (alpha.double() * (logits[j] - b_U).double()).sum()
            assert torch.allclose(dec.exact, ref, rtol=1e-4, atol=1e-4), name
            if name in ("margin", "vocab_mean_contrast", "top1_vs_competitor"):
                assert abs(dec.alpha_sum) < 1e-6 and dec.bias.abs().max() < 1e-6


@pytest.mark.parametrize("style", STYLES)
def test_stored_codes_match_encoder_and_contributions_match_per_feature(fitted, style):
    model, _, fit = fitted[style]
    sae, rows = fit.sae, unembedding_rows(model)
    # SAELens path (encode → decode) vs stored sparse codes.
    assert torch.allclose(sae.decode(sae.encode(rows)), sae.reconstructed_rows(), atol=1e-5)
    # c_i recomputed feature by feature from the definition β_i = Σ_t α_t z_{t,i}, p_i = h·d_i.
    h = torch.randn(model.cfg.d_model)
    alpha = margin([2, 5], [11], model.cfg.d_vocab)
    dense_z = sae.encode(rows).double()
    beta_ref = alpha.double() @ dense_z
    c_ref = beta_ref * (sae.W_dec.double() @ h.double())
    dec = decompose(sae, h, alpha, model=model)
    assert torch.allclose(dec.contributions, c_ref, atol=1e-5)
    assert dec.top_features and dec.top_features[0]["feature"] == int(c_ref.abs().argmax())


def test_batched_states_and_bind(fitted):
    model, tokens, fit = fitted["gelu_ln"]
    bank = collect_states(model, tokens, ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post"])
    assert len(bank) == 6 * 11 * 2 and set(bank.hook_index.tolist()) == {0, 1}
    sae = bind(model, fit.sae)
    dec = decompose(sae, bank.states[:5], vocab_mean_contrast(4, model.cfg.d_vocab))
    single = decompose(sae, bank.states[3], vocab_mean_contrast(4, model.cfg.d_vocab))
    assert dec.contributions.shape == (5, sae.cfg.d_sae)
    assert torch.allclose(dec.contributions[3], single.contributions)


def test_training_logged(fitted):
    _, _, fit = fitted["gated_rms"]
    assert [r["step"] for r in fit.history] == [20, 40, 60]
    assert {"mse", "prism", "dead_rate_window", "rare_rate_window"} <= set(fit.history[0])
    assert 0 <= fit.final["dead_rate"] <= 1 and fit.final["row_ev"] > 0.5
    assert torch.allclose(fit.sae.W_dec.norm(dim=-1), torch.ones(fit.sae.cfg.d_sae), atol=1e-5)


def test_save_load_and_from_pretrained_round_trip(fitted, tmp_path, monkeypatch):
    model, _, fit = fitted["gated_rms"]
    fit.sae.save_model(tmp_path / "sae")
    loaded = SAE.load_from_disk(tmp_path / "sae")
    assert isinstance(loaded, ReadoutSAE)
    for name, tensor in fit.sae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor) and loaded.state_dict()[name].dtype == tensor.dtype, name

    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    register_releases({"tiny-test": {"model": "tiny", "repo_id": None, "sae_ids": ["cpu"]}})
    with pytest.raises(FileNotFoundError, match="tlql readout fit --model tiny-test"):
        SAE.from_pretrained("tlql-readout-tiny-test", "cpu")
    fit.sae.save_model(cached_sae_path("tiny-test", "cpu"))
    pre = SAE.from_pretrained("tlql-readout-tiny-test", "cpu")
    assert isinstance(pre, ReadoutSAE)
    h = torch.randn(model.cfg.d_model)
    alpha = margin(1, 2, model.cfg.d_vocab)
    a, b = decompose(fit.sae, h, alpha, model=model), decompose(pre, h, alpha, model=model)
    assert torch.equal(a.contributions, b.contributions) and torch.equal(a.residual, b.residual)


def test_bad_input_errors(fitted):
    model, _, fit = fitted["gelu_ln"]
    sae, V, d = fit.sae, model.cfg.d_vocab, model.cfg.d_model
    with pytest.raises(ValueError, match="d_model"):
        decompose(sae, torch.randn(d), token_logit(0, V), model=tiny_model("gelu_ln", d_model=48, d_head=12))
    with pytest.raises(ValueError, match="Vocabulary mismatch"):
        decompose(sae, torch.randn(d), token_logit(0, V), model=tiny_model("gelu_ln", d_vocab=V + 3))
    with pytest.raises(ValueError, match="LM-head rows differ"):
        other = tiny_model("gelu_ln")
        with torch.no_grad():
            other.W_U.mul_(2.0)
        decompose(sae, torch.randn(d), token_logit(0, V), model=other)
    with pytest.raises(ValueError, match=rf"shape \({V},\)"):
        decompose(sae, torch.randn(d), torch.zeros(V + 1), model=model)
    with pytest.raises(ValueError, match="NaN or inf"):
        decompose(sae, torch.full((d,), float("nan")), token_logit(0, V), model=model)
    with pytest.raises(ValueError, match="last dimension"):
        decompose(sae, torch.randn(d + 1), token_logit(0, V), model=model)
    with pytest.raises(ValueError, match="pass model="):
        decompose(SAE.from_dict(sae.cfg.to_dict()), torch.randn(d), token_logit(0, V))
    with pytest.raises(IndexError):
        token_logit(V, V)
    with pytest.raises(ValueError, match="preset"):
        ReadoutFitConfig.preset("huge")


def test_diagnostics_and_baselines(fitted):
    model, tokens, fit = fitted["gelu_ln"]
    rows = unembedding_rows(model)
    bank = collect_states(model, tokens)
    perfect = evaluate_reconstruction("dense", rows, rows.clone(), bank, b_U=model.b_U.detach(), n_boot=50)
    assert perfect.top1 == 1.0 and abs(perfect.kl_mean_bits) < 1e-5 and perfect.coverage == 1.0
    assert abs(perfect.row_ev - 1.0) < 1e-6
    srp = evaluate_reconstruction("srp", rows, fit.sae.reconstructed_rows(), bank, b_U=model.b_U.detach(), n_boot=50)
    assert 0 <= srp.coverage <= 1 and srp.coverage_ci[0] <= srp.coverage <= srp.coverage_ci[1]
    assert abs(srp.row_ev - fit.final["row_ev"]) < 1e-4
    # PCA at full rank reproduces the rows; every baseline returns rows of the right shape.
    assert torch.allclose(bl.pca(rows, rank=model.cfg.d_model), rows, atol=1e-4)
    cent = bl.spherical_kmeans(bl.normalise_rows(rows)[2], 8, iters=3)
    for hat in (
        bl.shuffled_codes(fit.sae, rows),
        bl.random_support(fit.sae, rows),
        bl.hard_assignment(rows, cent),
        bl.kmeans_ridge(rows, cent, k=4),
        bl.knn_basis(rows, n_neighbours=8),
        bl.nearest_row_ridge(rows, n_neighbours=8),
    ):
        assert hat.shape == rows.shape and torch.isfinite(hat).all()
    # Cluster bootstrap of a constant is that constant.
    assert cluster_bootstrap(torch.ones(10), torch.arange(10) // 2, n_boot=20) == [1.0, 1.0]


def test_ablation_regression_controls(fitted):
    model, tokens, fit = fitted["gated_rms"]
    bank = collect_states(model, tokens)
    reg = ablation_regression(fit.sae, unembedding_rows(model), bank, max_states=40)
    assert reg.n_points == 120
    assert 0 <= reg.r2_random <= 1 and 0 <= reg.r2 <= 1


def test_cross_lens_identical_lenses_agree(fitted):
    from tl_query_lens.operators import value_operators
    from tl_query_lens.readout.cross_lens import cross_lens_check

    model, tokens, fit = fitted["gelu_ln"]
    hook = "blocks.1.hook_resid_post"
    M = value_operators(model, tokens[:2], [hook], progress=False)[hook]
    assert M.shape == (model.cfg.d_model, model.cfg.d_model)
    _, cache = model.run_with_cache(tokens[2:4], names_filter=[hook])
    resid = cache[hook].reshape(-1, model.cfg.d_model)
    same = cross_lens_check(model, fit.sae, resid, M, M.clone(), hook=hook)
    assert same.feature_agreement == 1.0 and same.token_disagreement == 0.0
    other = cross_lens_check(model, fit.sae, resid, M, torch.eye(model.cfg.d_model), hook=hook)
    assert 0.0 <= other.feature_agreement <= 1.0 and other.n_states == resid.shape[0]


def test_evaluate_readout_runs_every_baseline(fitted, tmp_path):
    from tl_query_lens.readout.evaluate import ReadoutReport, evaluate_readout
    from tl_query_lens.tracking import Tracker

    model, tokens, fit = fitted["gated_rms"]
    bank = collect_states(model, tokens)
    report = evaluate_readout(model, fit.sae, bank, ablation_states=10, n_boot=20)
    assert set(report.baselines) == set(BASELINE_ORDER)
    with Tracker(tmp_path, use_wandb=False) as tracker:
        tracker.log_table("readout_vs_baselines", *report.table())
    assert (tmp_path / "readout_vs_baselines.csv").exists()
    report.save(tmp_path / "report")
    assert ReadoutReport.load(tmp_path / "report").srp.top1 == report.srp.top1
    with pytest.raises(ValueError, match="Unknown baselines"):
        evaluate_readout(model, fit.sae, bank, baselines=["nope"], ablation_states=0)


def test_cli_parser_has_readout_actions():
    from tl_query_lens.cli import build_parser

    def command(args):  # the runner's entry: functools.partial(run_command, <the Command>)
        return args.func.args[0].run.rsplit(":", 1)[1]

    parser = build_parser()
    assert command(parser.parse_args(["readout", "fit", "--preset", "paper", "--no-wandb"])) == "run_fit"
    args = parser.parse_args(["readout", "decompose", "The cat", "--margin", " dog", " cat"])
    assert command(args) == "run_decompose" and args.margin == [" dog", " cat"]
    assert command(parser.parse_args(["readout", "eval", "--baselines", "pca256"])) == "run_eval"
