"""Readout diagnostics under the authors' protocol: through-origin R², final-layer pool, ablation measured directly."""

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.readout import collect_states, fit_readout
from tl_query_lens.readout.diagnostics_paper import (
    PaperReadoutDiagnostics,
    random_support_own_magnitudes,
    readout_diagnostics_paper,
    through_origin_r2,
)

FIT = {
    "width": 96,
    "k": 8,
    "steps": 40,
    "batch_rows": 64,
    "batch_pairs": 32,
    "log_every": 20,
    "progress": False,
}


def test_through_origin_r2_by_hand():
    assert through_origin_r2(torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])) == pytest.approx((1.0, 2.0))
    # slope = (1·1 + 2·(−1))/(1 + 4) = −0.2; residuals 1.2, −0.6 → 1.8; Σm² = 2 → R² = 1 − 0.9 = 0.1.
    r2, slope = through_origin_r2(torch.tensor([1.0, 2.0]), torch.tensor([1.0, -1.0]))
    assert slope == pytest.approx(-0.2) and r2 == pytest.approx(0.1)


def test_paper_diagnostics_on_final_layer_states(tmp_path):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, 6, 12)
    sae = fit_readout(model, tokens, **FIT).sae
    check_paper_diagnostics(model, sae, tmp_path)


@torch.no_grad()
def check_paper_diagnostics(model, sae, tmp_path):
    states = collect_states(
        model, tiny_tokens(model, 4, 10, seed=5), [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    )
    res = readout_diagnostics_paper(model, sae, states, max_states=20)
    by = res.coverage_by_family
    assert res.coverage == pytest.approx((by["top1_vs_competitor"] + by["vocab_mean_contrast"]) / 2)
    assert 0 <= res.coverage <= 1 and 0 <= res.coverage_random_support <= 1
    assert res.n_points > 0 and res.n_points == res.n_points_control
    # the ablation fit from the decomposition's own numbers, recomputed here for one covered contrast
    rows = model.W_U.detach().T.float()
    h = states.states[0].double()
    logits = h @ rows.double().T
    t1, t2 = logits.topk(2).indices.tolist()
    q = rows.double()[t1] - rows.double()[t2]
    d = sae.W_dec.detach().double()
    # measured Δs of removing feature i's direction = −(h·d_i)(d_i·q), the quantity the regression uses
    i = 0
    measured = (h - (h @ d[i]) * d[i]) @ q - h @ q
    assert measured.item() == pytest.approx(-((h @ d[i]) * (d[i] @ q)).item(), abs=1e-9)
    back = PaperReadoutDiagnostics.load(res.save(tmp_path / "r"))
    assert back.coverage == res.coverage and back.coverage_by_family == res.coverage_by_family
    rand = random_support_own_magnitudes(sae, seed=1)
    assert rand.shape == (model.cfg.d_vocab, model.cfg.d_model)
    assert not torch.allclose(rand, sae.reconstructed_rows())
