"""Regression tests for bugs users reported (docs/reliability.md); each fails on the code before the fix."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens
from tl_query_lens.corpus import load_corpus
from tl_query_lens.query_lens.max_activating import max_activating_contexts


def test_max_activating_contexts_follow_an_in_place_edit_of_the_encoder():
    """Was: a process-wide cache keyed by the decoder's data_ptr returned the contexts of the unedited encoder."""
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, n_seqs=10, seq_len=8)
    sae = FFKV.from_model(model, 1)
    before = max_activating_contexts(model, sae, tokens, n_contexts=3)
    with torch.no_grad():
        sae.W_enc.mul_(-1.0)  # the feature now fires where it was most negative
    after = max_activating_contexts(model, sae, tokens, n_contexts=3)
    fresh = max_activating_contexts(model, copy.deepcopy(sae), tokens, n_contexts=3)
    assert torch.equal(after.seq, fresh.seq) and torch.equal(after.activation, fresh.activation)
    assert not torch.equal(after.activation, before.activation)


class _Tokenizer:
    eos_token_id = 0
    name_or_path = "same-name"

    def __init__(self, shift: int) -> None:
        self.shift = shift

    def __len__(self) -> int:
        return 100

    def encode(self, text, add_special_tokens=False):
        return [1 + (len(w) * 7 + self.shift) % 99 for w in text.split()]


def test_token_streams_are_not_shared_between_tokenizers_with_the_same_name():
    """Was: token streams cached under (hash(docs), name_or_path, len(tokenizer)): another tokenizer of the same
    name and size got the first one's ids."""
    docs = [f"doc {i} " + " ".join("word" * (j % 4 + 1) for j in range(40)) for i in range(60)]
    a = load_corpus(docs, _Tokenizer(0), n_seqs=4, seq_len=8, split="train")
    b = load_corpus(docs, _Tokenizer(5), n_seqs=4, seq_len=8, split="train")
    assert not torch.equal(a, b)
    assert torch.equal(b, load_corpus(docs, _Tokenizer(5), n_seqs=4, seq_len=8, split="train"))


def test_shuffle_ablation_takes_the_certify_options():
    """Was: shuffle_ablation repeated certify's option list without n_schedule (TypeError)."""
    import tl_query_lens as tq

    model = tiny_model("gelu_ln")
    cal, ev = tiny_tokens(model, 4, 8, seed=1), tiny_tokens(model, 24, 8, seed=2)
    abl = tq.shuffle_ablation(model, FFKV.from_model(model, 1, "vanilla"), cal, ev, seed=3, k=5, n_schedule=[20])
    assert abl.real.curve_N == abl.shuffled.curve_N == [20, 24]
    with pytest.raises(TypeError, match="valid options"):
        tq.shuffle_ablation(model, FFKV.from_model(model, 1, "vanilla"), cal, ev, n_shedule=[20])


def test_first_order_norm_weight_lives_on_the_directions_device():
    """Was: a final norm without a weight (LayerNormPre) gave torch.ones on the CPU, which broke first-order value
    signatures of a CUDA model; the meta device stands in for the accelerator here."""
    model = tiny_model("gelu_ln", normalization_type="LNPre")
    lens = QueryLens(model, tiny_tokens(model), progress=False)
    inv_scale, weight, centre = lens._norm_parts(torch.zeros(2, model.cfg.d_model, device="meta"))
    assert weight.device.type == "meta" and inv_scale.device.type == "meta" and centre


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_first_order_value_signatures_on_cuda():
    model = tiny_model("gelu_ln", normalization_type="LNPre").to("cuda")
    lens = QueryLens(model, tiny_tokens(model).cuda(), progress=False)
    sig = lens.value_signatures(FFKV.from_model(model, 0), [1, 2], k=3, method="first_order")
    assert torch.allclose(sig.module_shares.sum(1), torch.ones(2), atol=1e-4)


def test_bound_readout_rows_are_a_declared_buffer():
    """Was: bind() monkey-patched ``sae._bound_rows``, a plain attribute that ``.to()`` left behind."""
    from tl_query_lens.readout import bind, decompose, fit_readout, token_logit

    model = tiny_model("gated_rms")
    fit = fit_readout(
        model, tiny_tokens(model, 4, 8), width=64, k=4, steps=5, batch_rows=32, batch_pairs=8, progress=False
    )
    sae = bind(model, fit.sae)
    assert "bound_rows" in dict(sae.named_buffers()) and "bound_rows" not in sae.state_dict()
    sae.to(torch.float64)
    assert sae.bound_rows.dtype == torch.float64
    h = torch.randn(model.cfg.d_model)
    dec = decompose(sae, h, token_logit(3, model.cfg.d_vocab))
    torch.testing.assert_close(dec.bias + dec.contributions.sum(-1) + dec.residual, dec.exact)


def test_decompose_model_takes_only_a_model():
    """Was: ``decompose(model=)`` took a model, its LM-head rows or nothing; rows now go to ``decompose_rows``."""
    from tl_query_lens.errors import InputTypeError
    from tl_query_lens.readout import decompose, decompose_rows, fit_readout, token_logit
    from tl_query_lens.readout.sae import unembedding_rows

    model = tiny_model("gated_rms")
    fit = fit_readout(
        model, tiny_tokens(model, 4, 8), width=64, k=4, steps=5, batch_rows=32, batch_pairs=8, progress=False
    )
    h, alpha = torch.randn(model.cfg.d_model), token_logit(3, model.cfg.d_vocab)
    rows = unembedding_rows(model)
    with pytest.raises(InputTypeError, match=r"decompose_rows\(sae, h, alpha, rows\)"):
        decompose(fit.sae, h, alpha, model=rows)
    by_model, by_rows = decompose(fit.sae, h, alpha, model=model), decompose_rows(fit.sae, h, alpha, rows)
    for name in ("exact", "bias", "contributions", "residual"):
        torch.testing.assert_close(getattr(by_rows, name), getattr(by_model, name), rtol=0, atol=0)
    with pytest.raises(ValueError, match="do not match the readout SAE"):
        decompose_rows(fit.sae, h, alpha, rows[:-1])


def test_readout_functions_take_the_model_first():
    """Was: ``bind``, ``readout_diagnostics_paper`` and ``cross_lens_prompts`` took the SAE first, the other readout
    methods the model; every one now takes (model, sae, ...) and a swapped call names the fix."""
    from tl_query_lens.errors import InputTypeError
    from tl_query_lens.readout import bind, collect_states, decompose, fit_readout, token_logit
    from tl_query_lens.readout.cross_lens import cross_lens_check
    from tl_query_lens.readout.cross_lens_paper import cross_lens_prompts
    from tl_query_lens.readout.diagnostics_paper import readout_diagnostics_paper
    from tl_query_lens.readout.evaluate import evaluate_readout

    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model, 4, 8)
    sae = fit_readout(model, tokens, width=64, k=4, steps=5, batch_rows=32, batch_pairs=8, progress=False).sae
    states = collect_states(model, tokens[:2])
    eye = {k: torch.eye(model.cfg.d_model) for k in range(model.cfg.n_layers)}
    swapped = [
        lambda: bind(sae, model),
        lambda: evaluate_readout(sae, model, states),
        lambda: readout_diagnostics_paper(sae, model, states),
        lambda: cross_lens_prompts(sae, model, eye, eye, [], layers=[0]),
        lambda: cross_lens_check(sae, model, states.states, eye[0], eye[0]),
    ]
    for call in swapped:
        with pytest.raises(InputTypeError, match="takes the model first"):
            call()
    h = torch.randn(model.cfg.d_model)
    sae.bound_rows = None
    dec = decompose(bind(model, sae), h, token_logit(2, model.cfg.d_vocab))
    torch.testing.assert_close(dec.bias + dec.contributions.sum(-1) + dec.residual, dec.exact)
