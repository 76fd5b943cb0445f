"""``tlql saes report --protocol saebench``: SAEBench 0.6's core ``run_evals`` through the SAELens-6 adapter.

On a tiny model without special tokens and with no clean first position, SAEBench's CE, KL and L0 are checked against
the project's :func:`suite_quality` (an independent implementation, same positions), and SAEBench's explained variance
against its formula recomputed here from the raw activations (see :mod:`tl_query_lens.saes.saebench_eval`).
"""

from __future__ import annotations

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig

from tests.helpers import tiny_protocol_setup
from tl_query_lens.saes.report import SuiteQuality, suite_quality
from tl_query_lens.saes.saebench_eval import saebench_quality, saebench_view

pytest.importorskip("sae_bench.evals.core.main", reason="SAEBench's core evaluation does not import here")

HOOK = "blocks.1.hook_resid_post"
SHARED = ("ce_clean", "ce_spliced", "ce_zero", "ce_recovered", "kl", "mean_l0")


@pytest.fixture(scope="module")
def setup():
    return tiny_protocol_setup()


def test_the_view_carries_the_saelens5_fields_and_leaves_the_sae_alone(setup):
    _, _, saes = setup
    sae = saes["sae"]
    view = saebench_view(sae)
    assert (view.cfg.hook_name, view.cfg.hook_layer, view.cfg.hook_head_index) == (HOOK, 1, None)
    assert view.W_enc is sae.W_enc and view.cfg.d_sae == sae.cfg.d_sae
    assert not hasattr(sae.cfg, "hook_layer") and not hasattr(sae.cfg, "hook_name")


def test_saebench_core_eval_against_an_independent_computation(setup):
    model, tokens, saes = setup
    theirs = saebench_quality(model, saes, tokens, batch_size=3)
    assert [r["sae_id"] for r in theirs] == ["sae"] and theirs[0]["n_tokens"] == tokens.numel()
    same = suite_quality(model, saes, tokens, batch_size=3, exclude_first_positions=0).row("sae")
    for key in SHARED:
        assert theirs[0][key] == pytest.approx(same[key], rel=1e-4, abs=1e-6), key
    # SAEBench's explained variance, recomputed from the raw activations: 1 - R / (S - (S/d)^2), batches of 3
    _, cache = model.run_with_cache(tokens, names_filter=[HOOK])
    x = cache[HOOK].reshape(-1, 32)
    with torch.no_grad():
        x_hat = saes["sae"].decode(saes["sae"].encode(x))
    r, s = (x - x_hat).pow(2).sum(-1).mean(), x.pow(2).sum(-1).mean()
    assert theirs[0]["explained_variance"] == pytest.approx((1 - r / (s - (s / 32) ** 2)).item(), rel=1e-4)
    true_ev = 1 - r / (s - x.mean(0).pow(2).sum())  # the variance ratio it means; the project's formula
    assert same["explained_variance"] == pytest.approx(true_ev.item(), rel=1e-4)
    assert theirs[0]["explained_variance"] != pytest.approx(true_ev.item(), rel=1e-3)
    quality = SuiteQuality(rows=[same], n_tokens=0, seconds=0.0, saebench=theirs)
    text = quality.markdown()
    assert "SAEBench" in text and f"{theirs[0]['ce_recovered']:.3f} / {same['ce_recovered']:.3f}" in text


def test_saebench_explained_variance_exceeds_one_when_the_mean_square_exceeds_d(setup):
    model, tokens, saes = setup
    sae = saes["sae"]
    big = StandardSAE(StandardSAEConfig(d_in=32, d_sae=48, metadata=sae.cfg.metadata))
    big.load_state_dict(sae.state_dict())
    # scale the residual by 100 at block 1's output: S / d^2 > 1 for this model, so S - (S/d)^2 < 0
    model.blocks[1].hook_resid_post.add_hook(lambda x, hook: x * 100.0)
    try:
        ev = saebench_quality(model, {"big": big.eval()}, tokens, batch_size=3)[0]["explained_variance"]
    finally:
        model.reset_hooks()
    assert ev > 1.0
