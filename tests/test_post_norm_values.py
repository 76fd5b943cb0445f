"""Value signatures of FF-KV on blocks with a norm after the MLP (Gemma-2 ``ln2_post``): the corpus-mean effect of a
unit change of a feature's activation at ``mlp.hook_post``, against a per-feature JVP of the whole clean forward
written here (float64 copy of the model, TransformerLens hooks, no engine code); blocks without a post norm keep the
fixed-direction path unchanged."""

import pytest
import torch
from torch.func import jvp

from tests.helpers import arch_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens, as_key_value, query_lens_reference
from tl_query_lens.operators import module_operators, value_operators

SKIP = 1
FEATURES = [0, 17]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def float64_copy(model):
    ref = arch_model("gemma2", dtype=torch.float64)
    ref.load_state_dict(model.state_dict())  # the same weights, cast to float64
    return ref


def hook_jvp(model, tokens, source: str, tangent: torch.Tensor, read: str) -> torch.Tensor:
    """``(1/|T|) Σ_{t∈T} d read[t] / dε`` with ``ε · tangent`` added at every position of ``source``."""
    grabbed = {}

    def run(eps: torch.Tensor) -> torch.Tensor:
        def add(x, hook):
            return x + eps * tangent

        def grab(x, hook):
            grabbed["x"] = x

        model.run_with_hooks(tokens, fwd_hooks=[(source, add), (read, grab)])
        return grabbed["x"][:, SKIP:].sum((0, 1))

    zero = torch.zeros((), dtype=torch.float64)
    _, out = jvp(run, (zero,), (torch.ones((), dtype=torch.float64),))
    return out / (tokens.shape[0] * (tokens.shape[1] - SKIP))


def reference_direction(ref, tokens, layer: int, feature: int, method: str) -> torch.Tensor:
    """The raw value direction of one vanilla FF-KV feature (tangent e_f at mlp.hook_post): full = mean final-residual JVP; first_order = the direct term u (mean
    ``hook_mlp_out`` JVP) plus, for each downstream module, the mean JVP of its write for ``u`` added at its input."""
    tangent = torch.zeros(ref.cfg.d_mlp, dtype=torch.float64)
    tangent[feature] = 1.0
    source = f"blocks.{layer}.mlp.hook_post"
    final = f"blocks.{ref.cfg.n_layers - 1}.hook_resid_post"
    if method == "full":
        return hook_jvp(ref, tokens, source, tangent, final)
    direct = hook_jvp(ref, tokens, source, tangent, f"blocks.{layer}.hook_mlp_out")
    total = direct.clone()
    for k in range(layer + 1, ref.cfg.n_layers):
        total += hook_jvp(ref, tokens, f"blocks.{k}.hook_resid_pre", direct, f"blocks.{k}.hook_attn_out")
        total += hook_jvp(ref, tokens, f"blocks.{k}.hook_resid_mid", direct, f"blocks.{k}.hook_mlp_out")
    return total


def test_post_norm_ffkv_values_equal_a_per_feature_jvp():
    """Both bases, vanilla and normalized variants, layer 0 (two blocks downstream) and the last layer (none)."""
    model = arch_model("gemma2")
    ref = float64_copy(model)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    lenses = [QueryLens(model, tokens, skip_positions=SKIP, progress=False, basis=b) for b in ("identity", "features")]
    for layer in (0, 2):
        saes = [FFKV.from_model(model, layer, variant) for variant in ("vanilla", "normalized")]
        assert as_key_value(saes[1], model).value_source == f"blocks.{layer}.mlp.hook_post"
        for method in ("full", "first_order"):
            expected = torch.stack([reference_direction(ref, tokens, layer, f, method) for f in FEATURES])
            for lens in lenses:
                for sae in saes:
                    scale = sae.act_scale.detach()[FEATURES, None]  # a_f = scale · hook_post_f: tangent e_f / scale
                    got = lens.value_directions(sae, FEATURES, method=method)
                    assert rel(got, expected / scale) < 1e-5, (layer, method, lens.basis, sae.cfg.variant)


def test_post_norm_first_order_terms_and_logit_lens():
    model = arch_model("gemma2")
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    lens = QueryLens(model, tokens, skip_positions=SKIP, progress=False)
    layer, sae = 0, FFKV.from_model(model, 0)
    sig = lens.value_signatures(sae, FEATURES, k=5, method="first_order")
    assert sig.module_names == ["direct"] + [f"blocks.{k}.{m}" for k in (1, 2) for m in ("attn", "mlp")]
    torch.testing.assert_close(sig.module_shares.sum(1), torch.ones(len(FEATURES)))
    # The normalized variant's activation is ‖W_out[f]‖ times the MLP's: its direction is the vanilla one / ‖W_out[f]‖.
    normalized = FFKV.from_model(model, layer, "normalized")
    norms = model.blocks[layer].mlp.W_out.detach()[FEATURES].norm(dim=1, keepdim=True)
    for method in ("full", "first_order"):
        vanilla_dir = lens.value_directions(sae, FEATURES, method=method)
        assert rel(lens.value_directions(normalized, FEATURES, method=method) * norms, vanilla_dir) < 1e-5
    # LL_VALUE: W_U·LN_f(W_out[f] ⊙ w_post), the post norm's weight applied, its per-token factor dropped.
    ll = lens.value_signatures(sae, FEATURES, k=5, method="logit_lens")
    block = model.blocks[layer]
    x = block.mlp.W_out.detach()[FEATURES] * block.ln2_post.w.detach()
    x = x / (x.pow(2).mean(-1, keepdim=True) + model.ln_final.eps).sqrt() * model.ln_final.w.detach()
    for i in range(len(FEATURES)):
        assert rel(ll.scores(i), x[i] @ model.W_U.detach()) < 1e-5


def test_blocks_without_post_norm_keep_fixed_values():
    """Regression guard: without a post norm (Llama: gated, RMS, like Gemma-2 otherwise) the value is the fixed
    direction W_out[f] at resid_post, pushed exactly as before."""
    model = arch_model("llama")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    sae = FFKV.from_model(model, 0)
    view = as_key_value(sae, model)
    assert view.fixed_values and view.value_source is None
    ids = torch.tensor(FEATURES)
    v = sae.W_dec.detach()[FEATURES]
    assert torch.equal(view.static_values(ids), v)
    lens = QueryLens(model, tokens, skip_positions=SKIP, progress=False, basis="identity")
    hook = "blocks.0.hook_resid_post"
    M = value_operators(model, tokens, [hook], skip_positions=SKIP, progress=False)[hook]
    torch.testing.assert_close(lens.value_directions(sae, FEATURES, method="full"), v @ M.T, rtol=0, atol=0)
    J = module_operators(model, tokens, [1, 2], skip_positions=SKIP, progress=False)
    first = v + sum(v @ J[f"blocks.{k}.{m}"].T for k in (1, 2) for m in ("attn", "mlp"))
    torch.testing.assert_close(lens.value_directions(sae, FEATURES, method="first_order"), first)
    assert hook in lens._value and not any(
        isinstance(key, tuple) for key in lens._value
    )  # no source-hook operator was built


def test_engine_destination_and_its_checks():
    model = arch_model("gemma2")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    source, write = "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out"
    full = value_operators(model, tokens, [source], destination=write, progress=False)[source]
    forward = value_operators(model, tokens, [source], destination=write, direction="forward", progress=False)[source]
    assert full.shape == (model.cfg.d_model, model.cfg.d_mlp) and rel(forward, full) < 1e-5
    E = torch.eye(model.cfg.d_mlp)[[2, 7]]
    pushed = value_operators(model, tokens, [source], destination=write, basis=E, progress=False)[source]
    assert rel(pushed, full[:, [2, 7]]) < 1e-5
    with pytest.raises(ValueError, match="downstream of destination"):
        value_operators(model, tokens, ["blocks.2.hook_resid_pre"], destination=write, progress=False)


def hook_z_reference(ref, tokens, layer: int, tangent: torch.Tensor, method: str) -> torch.Tensor:
    """The raw value direction of a head-space tangent at ``attn.hook_z`` (float64, hooks only): full = mean
    final-residual JVP; first_order = the direct term u (mean ``hook_attn_out`` JVP) plus the mean JVP of every
    downstream module's write for ``u`` added at its input (block l's MLP reads ``resid_mid``)."""
    tangent = tangent.double().reshape(ref.cfg.n_heads, ref.cfg.d_head)
    source = f"blocks.{layer}.attn.hook_z"
    if method == "full":
        return hook_jvp(ref, tokens, source, tangent, f"blocks.{ref.cfg.n_layers - 1}.hook_resid_post")
    direct = hook_jvp(ref, tokens, source, tangent, f"blocks.{layer}.hook_attn_out")
    total = direct + hook_jvp(ref, tokens, f"blocks.{layer}.hook_resid_mid", direct, f"blocks.{layer}.hook_mlp_out")
    for k in range(layer + 1, ref.cfg.n_layers):
        total += hook_jvp(ref, tokens, f"blocks.{k}.hook_resid_pre", direct, f"blocks.{k}.hook_attn_out")
        total += hook_jvp(ref, tokens, f"blocks.{k}.hook_resid_mid", direct, f"blocks.{k}.hook_mlp_out")
    return total


@pytest.mark.parametrize("per_head, d_head", [(False, None), (True, None), (False, 12)])
def test_hook_z_values_of_post_norm_blocks_equal_a_per_feature_jvp(per_head, d_head):
    """hook_z SAEs of Gemma-2 blocks (attention output through ln1_post): the decoder row in head space, added at
    hook_z, pushed through W_O, ln1_post and everything downstream — both bases, full and first-order, against the
    float64 hook JVP; the per-feature reference and LL_VALUE (v ⊙ w_ln1_post) likewise. ``d_head=12``: the head
    space (n_heads·d_head = 48) is wider than the residual (32), so a mix-up of the two widths cannot pass."""
    from tests.test_hook_z import HEAD, LAYER, hook_z_sae

    extra = {} if d_head is None else {"d_head": d_head}
    model = arch_model("gemma2", **extra)
    ref = arch_model("gemma2", dtype=torch.float64, **extra)
    ref.load_state_dict(model.state_dict())
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    sae = hook_z_sae(model, per_head=per_head)
    view = as_key_value(sae, model)
    assert not view.fixed_values and view.value_source == f"blocks.{LAYER}.attn.hook_z"
    rows = sae.W_dec.detach()[FEATURES]  # head space: one head's rows sit in that head's slot of hook_z
    if per_head:
        rows = (
            torch.zeros(len(FEATURES), model.cfg.n_heads, model.cfg.d_head)
            .index_copy_(1, torch.tensor([HEAD]), rows[:, None])
            .flatten(1)
        )
    lenses = [QueryLens(model, tokens, skip_positions=SKIP, progress=False, basis=b) for b in ("identity", "features")]
    for method in ("full", "first_order"):
        expected = torch.stack([hook_z_reference(ref, tokens, LAYER, r, method) for r in rows])
        for lens in lenses:
            assert rel(lens.value_directions(sae, FEATURES, method=method), expected) < 1e-5, (method, lens.basis)
        for i, f in enumerate(FEATURES):
            scores = query_lens_reference(model, tokens, sae, f, method=method, skip_positions=SKIP)
            got = lenses[0].value_signatures(sae, [f], k=3, method=method)
            assert torch.equal(got.top_ids[0], scores.topk(3).indices), (method, f)
    ll = lenses[0].value_signatures(sae, FEATURES, k=5, method="logit_lens")
    x = view.values[FEATURES] * model.blocks[LAYER].ln1_post.w.detach()
    x = x / (x.pow(2).mean(-1, keepdim=True) + model.ln_final.eps).sqrt() * model.ln_final.w.detach()
    for i in range(len(FEATURES)):
        assert rel(ll.scores(i), x[i] @ model.W_U.detach()) < 1e-5
    assert lenses[0].key_signatures(sae, FEATURES, k=3).top_ids.shape == (len(FEATURES), 3)


def test_precompute_covers_post_norm_sources(monkeypatch):
    """precompute builds the source-hook operators a post-norm FF-KV needs; later signatures run no sweep."""
    from tl_query_lens.operators import engine

    model = arch_model("gemma2")
    lens = QueryLens(model, tiny_tokens(model, n_seqs=2, seq_len=6), progress=False, basis="identity")
    sae = FFKV.from_model(model, 0)
    lens.precompute([sae], value_methods=("full", "first_order"))
    assert set(lens._value) == {"blocks.0.mlp.hook_post", ("blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out")}

    def boom(*args, **kwargs):
        raise AssertionError("the engine ran again")

    monkeypatch.setattr(engine, "_run_sweep", boom)
    for method in ("full", "first_order", "logit_lens"):
        lens.value_signatures(sae, [1, 2], k=3, method=method)


@torch.no_grad()
@pytest.mark.parametrize("dictionary", ["ffkv", "hook_z", "hook_z_head"])
def test_clamping_on_post_norm_blocks_edits_before_the_norm(dictionary):
    """Steering clamps a feature before the norm: FF-KV sets hook_post_f := α / act_scale_f (the normalized variant's
    activation is act_scale · hook_post); a hook_z SAE adds (α − a_f)·W_dec[f] to z, a_f from SAELens' encode — both
    written here as independent hooks and compared on the logits."""
    from tests.test_hook_z import HOOK_Z, hook_z_sae
    from tl_query_lens.query_lens.steering import clamp_hooks

    model = arch_model("gemma2")
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    feats, alphas = torch.tensor([3, 11]), torch.tensor([2.5, -1.0])
    if dictionary == "ffkv":
        sae = FFKV.from_model(model, 1, "normalized")
        scale = sae.act_scale.detach()

        def by_hand(act, hook):
            act = act.clone()
            act[torch.arange(2), :, feats] = (alphas / scale[feats])[:, None]
            return act

        hook = "blocks.1.mlp.hook_post"
    elif dictionary == "hook_z":
        sae = hook_z_sae(model, per_head=False)

        def by_hand(z, hook):
            a = sae.encode(z)[torch.arange(2), :, feats]  # [batch, pos]
            row = sae.W_dec.detach()[feats].reshape(2, 1, model.cfg.n_heads, model.cfg.d_head)
            return z + (alphas[:, None] - a)[..., None, None] * row

        hook = HOOK_Z
    else:  # one head (hook_head_index): only that head's z moves
        sae = hook_z_sae(model, per_head=True)
        head = sae.cfg.metadata.hook_head_index

        def by_hand(z, hook):
            a = sae.encode(z[:, :, head])[torch.arange(2), :, feats]  # [batch, pos]
            z = z.clone()
            z[:, :, head] += (alphas[:, None] - a)[..., None] * sae.W_dec.detach()[feats][:, None, :]
            return z

        hook = HOOK_Z
    expected = model.run_with_hooks(tokens, fwd_hooks=[(hook, by_hand)])
    got = model.run_with_hooks(tokens, fwd_hooks=clamp_hooks(as_key_value(sae, model), feats, alphas))
    assert not torch.allclose(expected, model(tokens), atol=1e-3)  # the clamp changes the logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_channels_refuse_post_norm_values():
    from tl_query_lens.query_lens.channels import subspace_channels

    model = arch_model("gemma2")
    from tl_query_lens.errors import InputError

    with pytest.raises(InputError, match="per-token norm"):
        subspace_channels(model, {0: FFKV.from_model(model, 0)}, tiny_tokens(model, 2, 6), epochs=2)
