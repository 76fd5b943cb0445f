"""The architecture matrix: every method against its independent reference on tiny random GPT-2, Pythia, Gemma-2,
Llama and Qwen configs (tests/helpers.ARCHITECTURES): Query Lens operators (value full / first-order / key) vs the
per-feature reference, module operators in both sweep directions, the exact FF-KV splice, the readout identity and
the certificate's ε̂ vs a splice written here."""

import pytest
import torch

import tl_query_lens as tq
from tests.helpers import ARCHITECTURES, arch_model, tiny_tokens
from tests.test_certify import ref_loss, topk_abs
from tests.test_hook_z import hook_z_sae
from tests.test_query_lens import CASES, rel_err, standard_sae
from tl_query_lens import FFKV, QueryLens, query_lens_reference
from tl_query_lens.errors import InputError
from tl_query_lens.operators import module_operators
from tl_query_lens.readout import decompose, fit_readout, margin, token_logit

ARCHS = list(ARCHITECTURES)
FEATURES = [0, 5]


@pytest.mark.parametrize("arch", ARCHS)
def test_query_lens_matches_per_feature_reference(arch):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    lens = QueryLens(model, tokens, skip_positions=1, progress=False)
    dictionaries = {
        "ffkv": FFKV.from_model(model, 0),
        "sae_post": standard_sae(model, "blocks.1.hook_resid_post"),
        "sae_pre": standard_sae(model, "blocks.1.hook_resid_pre"),
        "sae_attn_out": standard_sae(model, "blocks.1.hook_attn_out"),  # parallel blocks: enters at resid_post
        "hook_z": hook_z_sae(model, per_head=False),  # through W_O (Gemma-2: pushed from hook_z through ln1_post)
    }
    for name, dictionary in dictionaries.items():
        for side, method in CASES:  # Gemma-2 FF-KV values: pushed from mlp.hook_post through ln2_post
            call = lens.value_signatures if side == "value" else lens.key_signatures
            sig = call(dictionary, FEATURES, k=5, method=method)
            for i, feature in enumerate(FEATURES):
                ref = query_lens_reference(model, tokens, dictionary, feature, side, method=method, skip_positions=1)
                assert rel_err(sig.scores(i), ref) < 1e-4, (name, side, method, feature)


@pytest.mark.parametrize("arch", ARCHS)
def test_module_operators_reverse_equals_forward(arch):
    """Parallel blocks (Pythia) take two reverse sweeps and one forward sweep; both give the same J̄_A, J̄_M."""
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    reverse = module_operators(model, tokens, direction="reverse", chunk=16, progress=False)
    forward = module_operators(model, tokens, direction="forward", chunk=16, progress=False)
    assert reverse.hooks == forward.hooks == [f"blocks.{k}.{m}" for k in range(3) for m in ("attn", "mlp")]
    for name in reverse:
        assert rel_err(reverse[name], forward[name]) < 1e-5, name


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_vanilla_ffkv_splice_is_exact(arch):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    clean = model(tokens)
    for layer in range(model.cfg.n_layers):
        spliced = model.run_with_saes(tokens, saes=[FFKV.from_model(model, layer)], use_error_term=False)
        assert (spliced - clean).abs().max() < 1e-4, layer


@torch.no_grad()
def test_ffkv_splice_is_exact_without_norms_in_parallel_blocks():
    """No norm before the MLP: FF-KV reads the residual the MLP reads — resid_pre in parallel blocks."""
    model = arch_model("pythia", normalization_type=None)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    clean = model(tokens)
    for layer in range(model.cfg.n_layers):
        sae = FFKV.from_model(model, layer)
        assert sae.cfg.metadata.hook_name == f"blocks.{layer}.hook_resid_pre"
        spliced = model.run_with_saes(tokens, saes=[sae], use_error_term=False)
        assert (spliced - clean).abs().max() < 1e-4, layer


@pytest.mark.parametrize("arch", ARCHS)
def test_readout_identity(arch, tmp_path):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=4, seq_len=8)
    fit = fit_readout(
        model,
        tokens,
        width=96,
        k=8,
        steps=20,
        batch_rows=32,
        batch_pairs=16,
        log_every=20,
        progress=False,
    )
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    logits, cache = model.run_with_cache(tokens, names_filter=[final])
    h = model.ln_final(cache[final]).reshape(-1, model.cfg.d_model).detach()
    # Reference: the model's own unembedding; Gemma-2 soft-caps the logits after it, so check that link too.
    pre_cap = model.unembed(h[:, None])[:, 0].detach()
    cap = model.cfg.output_logits_soft_cap
    expected = cap * torch.tanh(pre_cap / cap) if cap > 0 else pre_cap
    assert (expected - logits.reshape(pre_cap.shape)).abs().max() < 1e-4
    for j in (0, 9):
        for alpha in (token_logit(3, model.cfg.d_vocab), margin(2, 7, model.cfg.d_vocab)):
            dec = decompose(fit.sae, h[j], alpha, model=model)
            total = dec.bias + dec.contributions.sum(-1) + dec.residual
            assert ((total - dec.exact).abs() / dec.exact.abs().clamp_min(1e-3)).max() < 1e-5
            ref = (alpha.double() * (pre_cap[j] - model.b_U).double()).sum()
            assert torch.allclose(dec.exact, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_certificate_eps_hat_matches_an_independent_splice(arch):
    """TopK-4 FF-KV proxy at layer 1: MLP activations from TL's mlp.hook_post, rewritten with W_out, b_out (and the
    block's post-MLP norm for Gemma-2) — not through the FFKV class."""
    model = arch_model(arch)
    layer, k = 1, 4
    cal, ev = tiny_tokens(model, 4, 8, seed=1), tiny_tokens(model, 24, 8, seed=2)
    block, store = model.blocks[layer], {}

    def grab(act, hook):
        store["codes"] = topk_abs(act, k)

    def write(act, hook):
        out = store["codes"] @ block.mlp.W_out + block.mlp.b_out
        return block.ln2_post(out) if model.cfg.use_normalization_before_and_after else out

    proxy_logits = model.run_with_hooks(
        ev, fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", grab), (f"blocks.{layer}.hook_mlp_out", write)]
    )
    clean, proxy = ref_loss(model(ev), ev), ref_loss(proxy_logits, ev)
    cert = tq.certify(model, FFKV.from_model(model, layer), cal, ev, k=k, n_schedule=[24])
    torch.testing.assert_close(cert.loss_proxy.double(), proxy, atol=1e-4, rtol=0)
    assert cert.eps_hat == pytest.approx((clean - proxy).abs().mean().item(), abs=1e-4)
    assert cert.eps_hat > 1e-3  # the proxy is not the clean model: the comparison has something to compare


def test_norm_after_only_blocks_are_refused_where_not_modelled():
    """OLMo-2/3 blocks (TransformerLens applies ln1 / ln2 after each module, none before): FF-KV and the hook_z
    mapping would read the module internals wrongly, so they refuse; residual-hook SAEs still work."""
    from tests.test_hook_z import hook_z_sae

    model = arch_model("llama", original_architecture="Olmo2ForCausalLM")
    with pytest.raises(NotImplementedError, match="Olmo2ForCausalLM") as err:
        FFKV.from_model(model, 0)
    assert isinstance(err.value, InputError)  # the CLI prints it and exits 2, no traceback
    with pytest.raises(NotImplementedError, match="hook_z"):
        tq.as_key_value(hook_z_sae(model, per_head=False), model)
    from tests.test_post_norm_values import hook_jvp, rel

    ref = arch_model("llama", original_architecture="Olmo2ForCausalLM", dtype=torch.float64)
    ref.load_state_dict(model.state_dict())
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    lens = QueryLens(model, tokens, skip_positions=1, progress=False)
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    for hook in ("blocks.0.hook_resid_post", "blocks.1.hook_attn_out"):  # the engine is hook-based: still exact
        sae = standard_sae(model, hook)
        write = "blocks.1.hook_resid_mid" if hook.endswith("attn_out") else hook
        expected = torch.stack([hook_jvp(ref, tokens, write, sae.W_dec.detach()[f].double(), final) for f in FEATURES])
        assert rel(lens.value_directions(sae, FEATURES), expected) < 1e-5, hook
