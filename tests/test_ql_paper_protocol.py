"""Query Lens Table 1 under the authors' protocol: normalisation, integer α bisection, one shared S, up-projection key."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, as_key_value
from tl_query_lens.query_lens.config import EvaluationConfig
from tl_query_lens.query_lens.evaluation import evaluate_signatures
from tl_query_lens.query_lens.paper_protocol import (
    input_scores_paper,
    integer_alphas,
    normalise_token_paper,
    up_projection_key_view,
)
from tl_query_lens.query_lens.protocols.paper import steering_rise
from tl_query_lens.query_lens.steering import prompt_batches, rank_percentiles


class ListTokenizer:
    def __init__(self, strings):
        self.strings = strings

    def decode(self, ids):
        return "".join(self.strings[i] for i in ids)


def test_paper_normalisation_replaces_markers_only():
    assert normalise_token_paper("\u0120Paris") == " Paris"
    assert normalise_token_paper("\u2581the") == " the"
    assert normalise_token_paper("\u010a") == "\n"
    assert normalise_token_paper(" The ") == " The "  # no strip, no lower-casing
    tok = ListTokenizer(["\u0120Paris", " Paris", "Paris", " paris", "x"])
    # top tokens 0, 2, 3, 4 against T = {1}: only id 0 (Ġ → space) equals " Paris" → 1/4.
    score = input_scores_paper(tok, torch.tensor([[0, 2, 3, 4]]), torch.tensor([[1]]))
    assert score.tolist() == [0.25]


@torch.no_grad()
def kl_reference(model, layer, feature, alpha, prompt):
    """KL(clean ‖ steered), mean over positions, with the activation set to α at mlp.hook_post (independent hook)."""
    clean = model(prompt[None]).log_softmax(-1)

    def clamp(act, hook):
        act = act.clone()
        act[..., feature] = alpha
        return act

    steered = model.run_with_hooks(prompt[None], fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", clamp)]).log_softmax(-1)
    return (clean.exp() * (clean - steered)).sum(-1).mean().item()


@torch.no_grad()
def test_integer_alpha_is_the_smallest_integer_reaching_the_target():
    model = tiny_model("gated_rms")
    view = as_key_value(FFKV.from_model(model, 1), model)
    # two prompts of equal length share one batched pass (prompt_batches); the reference runs each prompt alone
    prompts = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11])]
    feats = torch.tensor([0, 7, 13])
    targets = (0.3, 1.0)
    alphas, kls = integer_alphas(model, view, feats, prompts, targets, high=200)
    interior = 0
    for t, target in enumerate(targets):
        for j, f in enumerate(feats.tolist()):
            a = int(alphas[t, j])
            assert 1 <= a <= 200
            kl = sum(kl_reference(model, 1, f, float(a), p) for p in prompts) / len(prompts)
            assert kl == pytest.approx(kls[t, j].item(), rel=1e-3, abs=1e-6)
            if a < 200:
                assert kl >= target
            if a > 1:
                below = sum(kl_reference(model, 1, f, float(a - 1), p) for p in prompts) / len(prompts)
                assert below < target
                interior += a < 200
    assert interior > 0  # the bisection was exercised, not only the end points


def test_prompt_batches_group_equal_lengths_in_order_and_cap_rows():
    prompts = [torch.zeros(n, dtype=torch.long) for n in (1, 3, 2, 2, 3, 2, 2, 6)]
    assert prompt_batches(prompts, rows_per_prompt=13, max_rows=39) == [[0], [1, 4], [2, 3, 5], [6], [7]]
    assert prompt_batches(prompts[:2], rows_per_prompt=13) == [[0], [1]]  # distinct lengths: one prompt per pass
    assert prompt_batches(prompts, rows_per_prompt=500, max_rows=128) == [[j] for j in range(8)]  # at least one


def test_rank_percentiles_count_smaller_entries():
    x = torch.randn(3, 5, 97, generator=torch.Generator().manual_seed(0))
    smaller = (x[..., None, :] < x[..., :, None]).sum(-1)  # entries below each one: its rank from 0
    torch.testing.assert_close(rank_percentiles(x), smaller.float() / 96)


@torch.no_grad()
def test_steering_rise_batches_prompts_exactly():
    """Equal-length prompts continue in one batch; at near-zero temperature (greedy, no draw) the rise and KL equal
    the mean of one-prompt runs."""
    model = tiny_model("gated_rms")
    view = as_key_value(FFKV.from_model(model, 1), model)
    feats, alphas = torch.tensor([0, 7, 13]), torch.tensor([3.0, 5.0, 8.0])
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7, 8]), torch.tensor([9, 10, 11])]
    rise, kl = steering_rise(model, view, feats, alphas, prompts, n_generate=4, temperature=1e-6)
    alone = [steering_rise(model, view, feats, alphas, [p], n_generate=4, temperature=1e-6) for p in prompts]
    torch.testing.assert_close(rise, torch.stack([r for r, _ in alone]).mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(kl, torch.stack([k for _, k in alone]).mean(0), atol=1e-5, rtol=1e-4)
    assert rise.abs().sum() > 0 and (kl > 0).all()


@torch.no_grad()
def test_paper_protocol_end_to_end_shares_one_s_and_uses_tc_at_10():
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8)
    sae = FFKV.from_model(model, 1)
    view = as_key_value(sae, model)
    feats = torch.tensor([2, 4, 6])
    tok = ListTokenizer([f"t{i}" for i in range(model.cfg.d_vocab)])
    ll = (view.values[feats] @ model.W_U).topk(5, dim=-1).indices
    res = evaluate_signatures(
        model,
        sae,
        tokens,
        {"LL_VALUE": ll},
        feats,
        tokenizer=tok,
        prompt_tokens=[torch.tensor([1, 2, 3]), torch.tensor([4, 5])],
        n_contexts=20,
        kl_targets=(0.1, 0.3),
        n_generate=4,
        protocol="paper",
    )
    assert res.config["protocol"] == "paper" and res.config["tc_values"] == (10.0,)
    assert torch.equal(res.steered_top[0], res.steered_top[1])  # one S over both targets
    assert res.steered_top.shape[-1] == 5  # |S| = |T|
    assert torch.equal(res.output_scores[:, 0], res.output_scores[:, 1])
    assert (res.alphas == res.alphas.round()).all() and (res.alphas >= 1).all() and (res.alphas <= 1000).all()
    with pytest.raises(ValueError, match="protocol must be"):
        EvaluationConfig(protocol="authors")


def test_up_projection_key_view():
    model = tiny_model("gated_rms")
    view = as_key_value(FFKV.from_model(model, 2), model)
    up = up_projection_key_view(view, model)
    assert up.read_hook == "blocks.2.hook_resid_mid"
    torch.testing.assert_close(up.keys, model.blocks[2].mlp.W_in.detach().float().T)
    as_key_value(up, model)  # hooks and widths validate
    from tl_query_lens.query_lens import QueryLens

    lens = QueryLens(model, tiny_tokens(model, 2, 8))
    sig = lens.key_signatures(up, [0, 3], k=4, method="full")  # key operator read at hook_resid_mid
    gate = lens.key_signatures(view, [0, 3], k=4, method="full")
    assert sig.top_ids.shape == (2, 4) and not torch.equal(sig.top_ids, gate.top_ids)
    gelu = tiny_model("gelu_ln")
    with pytest.raises(ValueError, match="gated"):
        up_projection_key_view(as_key_value(FFKV.from_model(gelu, 0), gelu), gelu)
