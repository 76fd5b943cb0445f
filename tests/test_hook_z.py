"""hook_z (attention-output) SAEs and SAELens' input options in the key–value view, against SAELens' own
encode / decode / splice, and Query Lens signatures of a hook_z SAE vs the same SAE mapped through W_O by hand."""

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import ARCHITECTURES, arch_model, tiny_tokens
from tests.test_query_lens import rel_err
from tl_query_lens import QueryLens, as_key_value, query_lens_reference

LAYER, HEAD = 1, 2
HOOK_Z = f"blocks.{LAYER}.attn.hook_z"


def random_sae(d_in: int, hook: str, seed: int = 3, **cfg) -> StandardSAE:
    torch.manual_seed(seed)
    sae = StandardSAE(
        StandardSAEConfig(d_in=d_in, d_sae=24, metadata=SAEMetadata(hook_name=hook, **cfg.pop("metadata", {})), **cfg)
    )
    with torch.no_grad():
        for param in sae.parameters():
            param.normal_(0, 0.3)
    return sae


def hook_z_sae(model, per_head: bool) -> StandardSAE:
    if per_head:  # one head: d_in = d_head, SAELens' hook_head_index
        return random_sae(model.cfg.d_head, HOOK_Z, metadata={"hook_head_index": HEAD}, apply_b_dec_to_input=True)
    return random_sae(
        model.cfg.n_heads * model.cfg.d_head, HOOK_Z, reshape_activations="hook_z", apply_b_dec_to_input=True
    )


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("per_head", [False, True])
@torch.no_grad()
def test_hook_z_view_matches_saelens(arch, per_head):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    sae = hook_z_sae(model, per_head)
    view = as_key_value(sae, model)
    entry = "hook_resid_post" if model.cfg.parallel_attn_mlp else "hook_resid_mid"  # parallel: no resid_mid
    assert view.write_hook == f"blocks.{LAYER}.hook_attn_out" and view.value_hook == f"blocks.{LAYER}.{entry}"
    _, cache = model.run_with_cache(tokens, names_filter=[HOOK_Z, view.write_hook])
    z = cache[HOOK_Z]  # [batch, pos, head, d_head]
    acts = sae.encode(z[:, :, HEAD] if per_head else z)  # SAELens' own encode (hook_z reshaping on)
    assert torch.allclose(view.encode(z), acts, atol=1e-5)
    # Keys at the concatenated hook_z width reproduce the pre-activations.
    assert torch.allclose((z.flatten(-2) @ view.keys.T + view.b_enc).relu(), acts, atol=1e-5)
    # Values: SAELens' decode in head space, then W_O and b_O by hand, equals Σ a_i v_i + b_dec.
    z_hat = sae.decode(acts)
    W_O, b_O = model.blocks[LAYER].attn.W_O, model.blocks[LAYER].attn.b_O
    by_hand = z_hat @ W_O[HEAD] + b_O if per_head else torch.einsum("bphd,hdm->bpm", z_hat, W_O) + b_O
    assert torch.allclose(acts @ view.values + view.b_dec, by_hand, atol=1e-5)
    post_norm = model.cfg.use_normalization_before_and_after  # Gemma-2: hook_attn_out is ln1_post of that
    if not per_head and not post_norm:  # SAELens' own splice writes exactly that to hook_attn_out
        store = {}
        with model.saes(saes=[sae]):
            model.run_with_hooks(tokens, fwd_hooks=[(view.write_hook, lambda x, hook: store.setdefault("x", x))])
        assert torch.allclose(store["x"], acts @ view.values + view.b_dec, atol=1e-4)


@pytest.mark.parametrize("norm", ["layer_norm", "constant_norm_rescale"])
@torch.no_grad()
def test_normalize_activations_fold(norm):
    """encode(x) = ReLU(s(x)·⟨k, x⟩ + b_enc) with s(x) > 0 from SAELens' formula, written here."""
    model = arch_model("gpt2")
    hook = "blocks.1.hook_resid_pre"
    sae = random_sae(model.cfg.d_model, hook, normalize_activations=norm, apply_b_dec_to_input=True)
    view = as_key_value(sae, model)
    assert view.activation.endswith(norm)
    x = torch.randn(5, 7, model.cfg.d_model) + 0.5
    if norm == "layer_norm":
        scale = 1 / (x.std(-1, keepdim=True) + 1e-5)
    else:
        scale = model.cfg.d_model**0.5 / x.norm(dim=-1, keepdim=True)
    assert torch.allclose((scale * (x @ view.keys.T) + view.b_enc).relu(), sae.encode(x), atol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "pythia"])
@pytest.mark.parametrize("per_head", [False, True])
def test_query_lens_of_hook_z_equals_sae_mapped_through_W_O_by_hand(arch, per_head):
    model = arch_model(arch)
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    sae = hook_z_sae(model, per_head)
    W_O = model.blocks[LAYER].attn.W_O.detach()
    with torch.no_grad():
        mapped = random_sae(model.cfg.d_model, f"blocks.{LAYER}.hook_attn_out", seed=9)
        values = (
            sae.W_dec @ W_O[HEAD]
            if per_head
            else torch.einsum("fhd,hdm->fm", sae.W_dec.reshape(24, model.cfg.n_heads, -1), W_O)
        )
        mapped.W_dec.copy_(values)
    lens = QueryLens(model, tokens, skip_positions=1, progress=False)
    features = [0, 7, 19]
    for method in ("full", "first_order"):
        ours = lens.value_signatures(sae, features, k=6, method=method)
        hand = lens.value_signatures(mapped, features, k=6, method=method)
        for i in range(len(features)):
            assert rel_err(ours.scores(i), hand.scores(i)) < 1e-5, method
        assert torch.equal(ours.top_ids, hand.top_ids)
    # Keys stay at hook_z: the key operator runs through the attention; the per-feature reference reads hook_z too.
    keys = lens.key_signatures(sae, features, k=6)
    for i, feature in enumerate(features):
        ref = query_lens_reference(model, tokens, sae, feature, "key", skip_positions=1)
        assert rel_err(keys.scores(i), ref) < 1e-4


def test_attention_writes_of_parallel_blocks_enter_at_resid_post():
    """Pythia-style blocks: both modules read the block input, so an attention-output dictionary's value enters at
    resid_post — block l's MLP is not downstream of it. Checked against a float64 hook JVP (v added at hook_attn_out,
    the clean forward otherwise) for full, and the first-order module list by name."""
    from tests.test_post_norm_values import SKIP, hook_jvp, rel

    model = arch_model("pythia")
    ref = arch_model("pythia", dtype=torch.float64)
    ref.load_state_dict(model.state_dict())
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    write = f"blocks.{LAYER}.hook_attn_out"
    sae = random_sae(model.cfg.d_model, write, seed=5)
    assert as_key_value(sae, model).value_hook == f"blocks.{LAYER}.hook_resid_post"
    lens = QueryLens(model, tokens, skip_positions=SKIP, progress=False)
    features = [1, 4]
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    expected = torch.stack([hook_jvp(ref, tokens, write, sae.W_dec.detach()[f].double(), final) for f in features])
    assert rel(lens.value_directions(sae, features, method="full"), expected) < 1e-5
    sig = lens.value_signatures(sae, features, k=3, method="first_order")
    later = [f"blocks.{k}.{m}" for k in range(LAYER + 1, model.cfg.n_layers) for m in ("attn", "mlp")]
    assert sig.module_names == ["direct", *later]


@pytest.mark.parametrize("first", [0, 1])
@torch.no_grad()
def test_splice_metrics_of_a_hook_z_sae_in_its_own_space(first):
    """splice_metrics measures a hook_z SAE on the concatenated hook_z, as SAELens splices it: EV and CE by hand
    (SAELens' encode / decode, a TransformerLens hook writing the reconstruction, first positions kept clean)."""
    import torch.nn.functional as F

    from tl_query_lens.dictionaries.splice import splice_metrics
    from tl_query_lens.errors import InputError

    model = arch_model("gpt2")
    tokens = tiny_tokens(model, n_seqs=3, seq_len=8)
    sae = hook_z_sae(model, per_head=False)
    got = splice_metrics(model, sae, tokens, batch_size=2, exclude_first_positions=first)
    _, cache = model.run_with_cache(tokens, names_filter=[HOOK_Z])
    z = cache[HOOK_Z].flatten(2)[:, first:]
    z_hat = sae.decode(sae.encode(cache[HOOK_Z][:, first:])).flatten(2)
    ev = 1 - (z - z_hat).pow(2).sum() / (z - z.reshape(-1, z.shape[-1]).mean(0)).pow(2).sum()
    assert got.explained_variance == pytest.approx(ev.item(), rel=1e-4)

    def write(act, hook):
        act = act.clone()
        act[:, first:] = z_hat.reshape(act[:, first:].shape)
        return act

    logits = model.run_with_hooks(tokens, fwd_hooks=[(HOOK_Z, write)])
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()
    assert got.ce_spliced == pytest.approx(ce, rel=1e-4)
    with pytest.raises(InputError, match="one-head SAEs"):
        splice_metrics(model, hook_z_sae(model, per_head=True), tokens)
