"""Readout SAE on the embedded SmolLM2-135M (slow): the exact identity for every score family."""

from __future__ import annotations

import pytest
import torch

from tl_query_lens import load_corpus
from tl_query_lens.readout import (
    collect_states,
    decompose,
    fit_readout,
    group_mean,
    margin,
    token_logit,
    top1_vs_competitor,
    vocab_mean_contrast,
)


@pytest.mark.slow
def test_identity_every_family_embedded(embedded_model, tmp_path):
    model = embedded_model
    tokens = load_corpus("embedded", model, n_seqs=2, seq_len=12, split="evaluation", seed=3)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    states = collect_states(model, tokens, [last, "blocks.20.hook_resid_post"])
    fit = fit_readout(model, states=states, width=1152, k=32, steps=5, batch_rows=128, batch_pairs=32, progress=False)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=[last])
    h = model.ln_final(cache[last][0, -1]).float()
    clean = (logits[0, -1] - model.b_U).double()
    V = model.cfg.d_vocab
    bug, insect = model.to_single_token(" bug"), model.to_single_token(" insect")
    alpha_c, top1, _ = top1_vs_competitor(h, model)
    families = {
        "token_logit": token_logit(top1, V),
        "margin": margin(bug, insect, V),
        "group_mean": group_mean([bug, insect, top1], V),
        "vocab_mean_contrast": vocab_mean_contrast(top1, V),
        "top1_vs_competitor": alpha_c,
    }
    for name, alpha in families.items():
        dec = decompose(fit.sae, h, alpha, model=model)
        total = dec.bias + dec.contributions.sum(-1) + dec.residual
        assert ((total - dec.exact).abs() / dec.exact.abs().clamp_min(1e-3)).item() < 1e-5, name
        ref = (alpha.double() * clean).sum()  # independent: the clean forward pass
        assert abs(dec.exact.item() - ref.item()) < 1e-3 * max(1.0, abs(ref.item())), name
