"""Table-1 protocol: input score, clamping, KL-matched α search, steering scores, baselines (docs/design.md §5)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, as_key_value
from tl_query_lens.query_lens.evaluation import (
    SignatureEvaluation,
    evaluate_signatures,
    kl_matched_alphas,
)
from tl_query_lens.query_lens.max_activating import (
    input_scores,
    max_activating_contexts,
    normalise_token,
    output_scores,
)
from tl_query_lens.query_lens.steering import clamp_hooks


class ListTokenizer:
    """Decodes id i to ``strings[i]`` (GPT-2 style 'Ġ' markers allowed)."""

    def __init__(self, strings):
        self.strings = strings

    def decode(self, ids):
        return "".join(self.strings[i] for i in ids)


def logit_lens_top(model, view, features, k=5):
    """A plain logit-lens stand-in for a signature method: top-k of W_U · v_i."""
    return (view.values[features] @ model.W_U).topk(k, dim=-1).indices


def test_normalise_token():
    assert normalise_token("ĠCat") == "cat"
    assert normalise_token("  Dog\n") == "dog"
    assert normalise_token("▁Paris") == "paris"


def test_input_score_hand_built():
    tok = ListTokenizer(["ĠCat", " cat", "dog", "Dog", "bird", "x"])
    top_tokens = torch.tensor([[0, 1, 2, 4], [5, 5, 5, 3]])
    signatures = torch.tensor([[1, 5], [2, 4]])  # {"cat", "x"} and {"dog", "bird"}
    scores = input_scores(tok, top_tokens, signatures)
    # feature 0: "cat","cat" hit, "dog","bird" miss → 2/4; feature 1: "x"×3 miss, "Dog"→"dog" hits → 1/4
    assert scores.tolist() == [0.5, 0.25]


def test_output_score_by_id():
    assert output_scores(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[4, 9, 1]])).tolist() == [0.5]


def test_max_activating_contexts_match_brute_force(style):
    model = tiny_model(style)
    tokens = tiny_tokens(model, n_seqs=10, seq_len=8)
    sae = FFKV.from_model(model, 1)
    res = max_activating_contexts(model, sae, tokens, n_contexts=3, batch_size=3)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.mlp.hook_post")
    acts = cache["blocks.1.mlp.hook_post"]  # FF-KV vanilla activations are the MLP's hidden activations
    per_seq, where = acts.max(dim=1)  # [n_seqs, d_mlp]
    for f in (0, 7, 33):
        ref_act, ref_seq = per_seq[:, f].topk(3)
        assert res.seq[f].tolist() == ref_seq.tolist()
        torch.testing.assert_close(res.activation[f], ref_act, atol=1e-5, rtol=1e-5)
        assert res.token[f].tolist() == tokens[ref_seq, where[ref_seq, f]].tolist()


def test_clamp_adds_alpha_minus_activation_times_value(style):
    model = tiny_model(style)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    sae = FFKV.from_model(model, 0)
    view = as_key_value(sae, model)
    feats, alphas = torch.tensor([3, 11]), torch.tensor([2.5, -1.0])
    _, clean = model.run_with_cache(tokens, names_filter=["blocks.0.hook_mlp_out", "blocks.0.mlp.hook_post"])
    out = {}
    hooks = clamp_hooks(view, feats, alphas) + [("blocks.0.hook_mlp_out", lambda a, hook: out.setdefault("y", a))]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    a = clean["blocks.0.mlp.hook_post"][torch.arange(2), :, feats]  # [batch, pos]
    W_out = model.blocks[0].mlp.W_out.detach()
    expected = clean["blocks.0.hook_mlp_out"] + (alphas[:, None] - a)[..., None] * W_out[feats][:, None, :]
    torch.testing.assert_close(out["y"], expected, atol=1e-5, rtol=1e-4)


def _kl_fresh(model, view, feature, alpha, seq):
    """KL(clean ‖ clamped) from two full forward passes (no cached residual), averaged over positions."""
    clean = model(seq[None]).log_softmax(-1)
    hooks = clamp_hooks(view, torch.tensor([feature]), torch.tensor([alpha]))
    steered = model.run_with_hooks(seq[None], fwd_hooks=hooks).log_softmax(-1)
    return (clean.exp() * (clean - steered)).sum(-1).mean().item()


@torch.no_grad()
def test_binary_search_hits_kl_target(style):
    model = tiny_model(style)
    sae = FFKV.from_model(model, 1)
    view = as_key_value(sae, model)
    seqs = list(tiny_tokens(model, n_seqs=2, seq_len=10, seed=3))
    feats = torch.tensor([0, 5, 9])
    targets = (0.05, 0.2)
    alphas, kls = kl_matched_alphas(model, sae, feats, seqs, targets, n_steps=10)
    for t, target in enumerate(targets):
        for j, f in enumerate(feats.tolist()):
            fresh = sum(_kl_fresh(model, view, f, alphas[t, j].item(), s) for s in seqs) / len(seqs)
            assert fresh == pytest.approx(kls[t, j].item(), rel=1e-3, abs=1e-6)
            assert abs(fresh / target - 1) < 0.05, (t, f, fresh)
    assert (alphas[1] >= alphas[0]).all()


@torch.no_grad()
def test_evaluate_signatures_end_to_end(tmp_path):
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8)
    sae = FFKV.from_model(model, 1)
    view = as_key_value(sae, model)
    feats = torch.tensor([2, 4, 6, 8])
    tok = ListTokenizer([f"t{i}" for i in range(model.cfg.d_vocab)])
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    ll = logit_lens_top(model, view, feats, k=5)
    res = evaluate_signatures(
        model,
        sae,
        tokens,
        {"LL_VALUE": ll},
        feats,
        tokenizer=tok,
        prompt_tokens=prompts,
        n_contexts=20,
        kl_targets=(0.1,),
        n_generate=4,
        n_steps=6,
        n_steered=5,
    )
    assert res.methods == ["LL_VALUE", "ZO", "TC"]
    assert res.input_scores.shape == (3, 4) and res.output_scores.shape == (3, 1, 4)
    assert ((res.input_scores >= 0) & (res.input_scores <= 1)).all()
    # a signature equal to S itself scores 1; the input score of the top tokens themselves is 1
    contexts = max_activating_contexts(model, sae, tokens, n_contexts=20)
    assert input_scores(tok, contexts.token[feats], contexts.token[feats]).eq(1).all()
    assert output_scores(res.steered_top[0], res.steered_top[0]).eq(1).all()
    assert (res.search_kl - 0.1).abs().max() < 0.02
    rows = res.summary(n_boot=200)
    assert rows[0]["input_lo"] <= rows[0]["input"] <= rows[0]["input_hi"]
    res.save(tmp_path / "ev")
    back = SignatureEvaluation.load(tmp_path / "ev")
    torch.testing.assert_close(back.output_scores, res.output_scores)
    joined = SignatureEvaluation.concat([res, back])
    assert joined.features.numel() == 8


def test_bad_inputs_are_rejected():
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8)
    sae = FFKV.from_model(model, 0)
    tok = ListTokenizer([f"t{i}" for i in range(model.cfg.d_vocab)])
    feats = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="n_features=2"):
        evaluate_signatures(model, sae, tokens, {"A": torch.zeros(3, 5, dtype=torch.long)}, feats, tokenizer=tok)
    with pytest.raises(ValueError, match="outside"):
        evaluate_signatures(model, sae, tokens, {"A": torch.full((2, 5), 999)}, feats, tokenizer=tok)
    with pytest.raises(IndexError, match="out of range"):
        evaluate_signatures(model, sae, tokens, {"A": torch.zeros(1, 5, dtype=torch.long)}, [10_000], tokenizer=tok)
    with pytest.raises(ValueError, match="kl_targets"):
        evaluate_signatures(model, sae, tokens, {}, feats, tokenizer=tok, kl_targets=(0.0,))
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate_signatures(model, sae, tokens, {}, feats)
    with pytest.raises(ValueError, match="n_contexts"):
        max_activating_contexts(model, sae, tokens[:5], n_contexts=20)


@torch.no_grad()
def test_query_lens_signatures_plug_in():
    """Signatures from the engine (any method) are scored as they are: [n_features, k] top ids."""
    from tl_query_lens.query_lens import QueryLens

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8)
    sae = FFKV.from_model(model, 0)
    feats = torch.tensor([1, 5])
    lens = QueryLens(model, tokens[:2], progress=False)
    methods = {
        "QL_VALUE": lens.value_signatures(sae, feats, k=4, method="full").top_ids,
        "LL_KEY": lens.key_signatures(sae, feats, k=4, method="logit_lens").top_ids,
    }
    tok = ListTokenizer([f"t{i}" for i in range(model.cfg.d_vocab)])
    res = evaluate_signatures(
        model,
        sae,
        tokens,
        methods,
        feats,
        tokenizer=tok,
        prompt_tokens=[torch.tensor([3, 4])],
        kl_targets=(0.1,),
        n_generate=3,
        n_steps=4,
        n_steered=4,
        baselines=(),
    )
    assert res.methods == ["QL_VALUE", "LL_KEY"] and res.output_scores.shape == (2, 1, 2)


def test_cli_query_lens_evaluate_delegates(monkeypatch):
    """`tlql query-lens --evaluate` calls the Table-1 function with its layers, features, k and corpus options and
    the protocol's defaults otherwise (no argv rebuilt)."""
    from tl_query_lens.cli import main
    from tl_query_lens.query_lens import table1

    model = tiny_model("gelu_ln")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus",
        lambda src, tok, n_seqs, seq_len, split, seed=0: tiny_tokens(
            model, n_seqs, seq_len, seed=0 if split == "train" else 1
        ),
    )
    seen = {}

    class Stop(Exception):
        pass

    def fake(model, dictionaries, op_tokens, ev_tokens, *, cfg):
        seen.update(layers=list(dictionaries), op=tuple(op_tokens.shape), ev=tuple(ev_tokens.shape), cfg=cfg)
        raise Stop

    monkeypatch.setattr(table1, "evaluate_table1", fake)
    with pytest.raises(Stop):
        main(
            [
                "query-lens",
                "--evaluate",
                "--layers",
                "1,2",
                "--features",
                "0-4",
                "--k",
                "10",
                "--n-seqs",
                "2",
                "--seq-len",
                "8",
                "--no-wandb",
            ]
        )
    cfg = seen["cfg"]
    assert seen["layers"] == ["ffkv L1", "ffkv L2"] and seen["op"] == (2, 8) and seen["ev"] == (512, 32)
    assert (cfg.features, cfg.k, cfg.kl_targets, cfg.n_contexts, cfg.n_generate) == (
        (0, 1, 2, 3, 4),
        10,
        (0.25, 0.5),
        20,
        20,
    )
