"""certify() against an independent recomputation: plain forward passes with splice hooks written here, from the
model's own weights / hook activations, and the formulas of docs/design.md §7 written out again."""

import math

import pytest
import torch
from sae_lens import StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

import tl_query_lens as tq
from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV
from tl_query_lens.certify.sweep import shuffle_permutation
from tl_query_lens.errors import InputError

ALPHA, DELTA = 0.5, 0.05


def ref_loss(logits, tokens, first=0):
    """ℓ = mean_t −log₂(½ p(x_{t+1}) + ½/|V|) over t = first..T−2, written directly with softmax probabilities."""
    p = logits[:, first:-1].double().softmax(-1).gather(-1, tokens[:, first + 1 :, None])[..., 0]
    return -torch.log2((1 - ALPHA) * p + ALPHA / logits.shape[-1]).mean(-1)


def topk_abs(a, k):
    idx = a.abs().topk(k, dim=-1).indices
    return torch.zeros_like(a).scatter(-1, idx, a.gather(-1, idx))


def ref_bound(clean, proxy, restricted, leaves, P, m, V):
    n = len(clean)
    big_delta = math.log2(1 + (1 - ALPHA) * V / ALPHA)
    c = restricted.mean() + (clean - proxy).abs().mean() + big_delta * leaves.double().mean()
    h2 = big_delta * math.sqrt(math.log(3 / DELTA) / (2 * n))
    h3 = big_delta * math.sqrt(math.log(6 / DELTA) / (2 * n))
    log_choose = math.lgamma(m + 1) - math.lgamma(P + 1) - math.lgamma(m - P + 1)
    occam = big_delta * math.sqrt((log_choose + math.log(3 / DELTA)) / (2 * n))
    return float(c + 2 * h2 + h3), float(c + occam + h2 + h3)


class FFKVReference:
    """TopK-k FF-KV proxy from TL's own MLP activations (mlp.hook_post) and W_out, not from the FFKV class."""

    def __init__(self, model, layer, k, perm=None):
        self.model, self.layer, self.k, self.perm = model, layer, k, perm
        self.post = f"blocks.{layer}.mlp.hook_post"

    def codes(self, post):
        c = topk_abs(post, self.k)
        return c if self.perm is None else c[..., self.perm]

    def pool(self, cal):
        _, cache = self.model.run_with_cache(cal, names_filter=[self.post])
        return (self.codes(cache[self.post]) != 0).flatten(0, 1).any(0)

    def run(self, tokens, pool=None):
        store, mlp = {}, self.model.blocks[self.layer].mlp

        def grab(act, hook):
            store["c"] = self.codes(act)

        def write(act, hook):
            c = store["c"] if pool is None else store["c"] * pool
            return c @ mlp.W_out + mlp.b_out

        logits = self.model.run_with_hooks(
            tokens, fwd_hooks=[(self.post, grab), (f"blocks.{self.layer}.hook_mlp_out", write)]
        )
        return logits, store["c"]


def reference_certificate(model, ref, cal, ev):
    clean_logits = model(ev)
    pool = ref.pool(cal)
    proxy_logits, codes = ref.run(ev)
    restricted_logits, _ = ref.run(ev, pool)
    clean, proxy, restricted = (ref_loss(x, ev) for x in (clean_logits, proxy_logits, restricted_logits))
    leaves = ((codes != 0) & ~pool).flatten(1).any(-1)
    p, q = clean_logits.double().softmax(-1), proxy_logits.double().softmax(-1)
    kl = (p * (p.log() - q.log())).sum(-1).mean() / math.log(2)
    top1 = (clean_logits.argmax(-1) == proxy_logits.argmax(-1)).double().mean()
    return {
        "clean": clean,
        "proxy": proxy,
        "restricted": restricted,
        "leaves": leaves,
        "pool": pool,
        "kl": kl,
        "top1": top1,
    }


@pytest.mark.parametrize("arch,layer,k", [("gelu_ln", 1, 4), ("gated_rms", 2, 7)])
@torch.no_grad()
def test_ffkv_topk_certificate_matches_independent_recomputation(arch, layer, k):
    model = tiny_model(arch)
    cal, ev = tiny_tokens(model, 6, 10, seed=1), tiny_tokens(model, 40, 10, seed=2)
    ref = reference_certificate(model, FFKVReference(model, layer, k), cal, ev)
    assert ref["leaves"].any() and not ref["leaves"].all()  # the example exercises η̂ and the restricted proxy
    cert = tq.certify(model, FFKV.from_model(model, layer, "vanilla"), cal, ev, k=k, batch_size=7, n_schedule=[20])
    torch.testing.assert_close(cert.loss_clean.double(), ref["clean"], atol=1e-5, rtol=0)
    torch.testing.assert_close(cert.loss_proxy.double(), ref["proxy"], atol=1e-4, rtol=0)
    torch.testing.assert_close(cert.loss_restricted.double(), ref["restricted"], atol=1e-4, rtol=0)
    assert torch.equal(cert.leaves_pool, ref["leaves"]) and torch.equal(cert.pool, ref["pool"])
    P, m, V = int(ref["pool"].sum()), model.cfg.d_mlp, model.cfg.d_vocab
    assert (cert.P, cert.m, cert.N) == (P, m, 40)
    assert cert.R_hat == pytest.approx(ref["restricted"].mean().item(), abs=1e-5)
    assert cert.eps_hat == pytest.approx((ref["clean"] - ref["proxy"]).abs().mean().item(), abs=1e-4)
    assert cert.eta_hat == pytest.approx(ref["leaves"].double().mean().item())
    u, u_occam = ref_bound(ref["clean"], ref["proxy"], ref["restricted"], ref["leaves"], P, m, V)
    assert cert.bound == pytest.approx(u, abs=1e-4) and cert.bound_occam == pytest.approx(u_occam, abs=1e-4)
    assert cert.kl_bits == pytest.approx(ref["kl"].item(), abs=1e-4)
    assert cert.top1_agreement == pytest.approx(ref["top1"].item(), abs=1e-6)
    assert cert.baseline_bits == pytest.approx(math.log2(V))
    assert cert.nontrivial == (u < math.log2(V))
    # Curve at the N = 20 prefix, from the reference losses.
    u20, _ = ref_bound(*(ref[x][:20] for x in ("clean", "proxy", "restricted", "leaves")), P, m, V)
    assert cert.curve_N == [20, 40] and cert.curve_bound[0] == pytest.approx(u20, abs=1e-4)


@torch.no_grad()
def test_shuffled_proxy_matches_reference_and_keeps_P():
    model = tiny_model("gated_rms")
    cal, ev = tiny_tokens(model, 6, 10, seed=1), tiny_tokens(model, 24, 10, seed=2)
    perm = shuffle_permutation(model.cfg.d_mlp, seed=3)
    ref = reference_certificate(model, FFKVReference(model, 1, 5, perm), cal, ev)
    abl = tq.shuffle_ablation(model, FFKV.from_model(model, 1, "vanilla"), cal, ev, seed=3, k=5)
    torch.testing.assert_close(abl.shuffled.loss_proxy.double(), ref["proxy"], atol=1e-4, rtol=0)
    torch.testing.assert_close(abl.shuffled.loss_restricted.double(), ref["restricted"], atol=1e-4, rtol=0)
    assert abl.shuffled.P == abl.real.P == int(ref["pool"].sum())
    torch.testing.assert_close(abl.real.loss_clean, abl.shuffled.loss_clean)
    assert abl.mean_gap_shift_bits == pytest.approx(
        (ref["proxy"] - ref["clean"]).mean().item() - abl.real.gap.double().mean().item(), abs=1e-4
    )


def _sae(kind, model, hook, d_sae=48):
    torch.manual_seed(1)
    meta = SAEMetadata(hook_name=hook, model_name="tiny")
    d = model.cfg.d_model
    if kind == "standard":
        sae = StandardSAE(StandardSAEConfig(d_in=d, d_sae=d_sae, metadata=meta, apply_b_dec_to_input=True))
    else:
        sae = TopKSAE(TopKSAEConfig(d_in=d, d_sae=d_sae, k=6, metadata=meta))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae


@pytest.mark.parametrize("kind,rule", [("standard", "topk"), ("standard", "native"), ("topk", "native")])
@torch.no_grad()
def test_saelens_sae_proxy_matches_reference(kind, rule):
    model = tiny_model("gated_rms")
    hook = "blocks.1.hook_resid_pre"
    sae = _sae(kind, model, hook)
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 24, 10, seed=2)

    def codes(x):  # from the weights: pre = (x − b_dec)W_enc + b_enc; ReLU(pre), or ReLU of the 6 largest pre
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        if kind == "standard":
            c = pre.relu()
        else:
            idx = pre.topk(6, dim=-1).indices
            c = torch.zeros_like(pre).scatter(-1, idx, pre.gather(-1, idx).relu())
        return topk_abs(c, 5) if rule == "topk" else c

    def splice(act, hook):
        return codes(act) @ sae.W_dec + sae.b_dec

    proxy = ref_loss(model.run_with_hooks(ev, fwd_hooks=[(hook, splice)]), ev)
    clean = ref_loss(model(ev), ev)
    cert = tq.certify(model, sae, cal, ev, k=5, rule=rule)
    torch.testing.assert_close(cert.loss_clean.double(), clean, atol=1e-5, rtol=0)
    torch.testing.assert_close(cert.loss_proxy.double(), proxy, atol=1e-4, rtol=0)
    assert cert.eps_hat == pytest.approx((clean - proxy).abs().mean().item(), abs=1e-4)
    assert cert.m == 48 and 0 < cert.P <= 48


@torch.no_grad()
def test_vanilla_ffkv_at_full_width_is_the_clean_model(style):
    model = tiny_model(style)
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 20, 10, seed=2)
    cert = tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, k=model.cfg.d_mlp)
    assert cert.eps_hat < 1e-4 and cert.kl_bits < 1e-5 and cert.top1_agreement == 1.0


def test_sweep_shares_one_pass_and_agrees_with_single_certify():
    model = tiny_model("gelu_ln")
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 20, 10, seed=2)
    saes = {layer: FFKV.from_model(model, layer, "vanilla") for layer in (0, 2)}
    sweep = tq.certify_layers(model, saes, cal, ev, k=6, shuffle=True, seed=0)
    single = tq.certify(model, saes[2], cal, ev, k=6)
    assert sweep.certificates[2].bound == pytest.approx(single.bound, abs=1e-6)
    assert set(sweep.shuffled) == {0, 2} and len(sweep.rows()) == 4


# ---- positions kept clean (exclude_first_positions) ------------------------------------------------------------


class PrefixCleanReference:
    """A StandardSAE proxy at ``blocks.1.hook_resid_post`` from the SAE's weights, written into the model by a
    TransformerLens hook at positions ≥ ``first`` only (the earlier positions keep the clean activation)."""

    hook = "blocks.1.hook_resid_post"

    def __init__(self, model, sae, k, first, perm=None):
        self.model, self.sae, self.k, self.first, self.perm = model, sae, k, first, perm

    def codes(self, x):
        c = topk_abs(((x - self.sae.b_dec) @ self.sae.W_enc + self.sae.b_enc).relu(), self.k)
        return c if self.perm is None else c[..., self.perm]

    def pool(self, cal):
        _, cache = self.model.run_with_cache(cal, names_filter=[self.hook])
        return (self.codes(cache[self.hook])[:, self.first :] != 0).flatten(0, 1).any(0)

    def run(self, tokens, pool=None):
        store = {}

        def splice(act, hook):
            c = self.codes(act)
            store["support"] = (c != 0)[:, self.first :]
            c = c if pool is None else c * pool
            out = act.clone()
            for t in range(self.first, act.shape[1]):
                out[:, t] = c[:, t] @ self.sae.W_dec + self.sae.b_dec
            return out

        return self.model.run_with_hooks(tokens, fwd_hooks=[(self.hook, splice)]), store["support"]

    def certificate(self, cal, ev):
        first = self.first
        clean_logits = self.model(ev)
        pool = self.pool(cal)
        proxy_logits, support = self.run(ev)
        restricted_logits, _ = self.run(ev, pool)
        clean, proxy, restricted = (ref_loss(x, ev, first) for x in (clean_logits, proxy_logits, restricted_logits))
        p = clean_logits[:, first:].double().softmax(-1)
        q = proxy_logits[:, first:].double().softmax(-1)
        return {
            "clean": clean,
            "proxy": proxy,
            "restricted": restricted,
            "leaves": (support & ~pool).flatten(1).any(-1),
            "pool": pool,
            "kl": ((p * (p.log() - q.log())).sum(-1).mean() / math.log(2)).item(),
            "top1": (clean_logits[:, first:].argmax(-1) == proxy_logits[:, first:].argmax(-1)).double().mean().item(),
        }


@pytest.mark.parametrize("first", [1, 2])
@torch.no_grad()
def test_kept_clean_prefix_matches_a_hand_spliced_reference(first):
    from tl_query_lens.certify.protocol import protocol_row

    model = tiny_model("gated_rms")
    sae = _sae("standard", model, PrefixCleanReference.hook)
    cal, ev = tiny_tokens(model, 8, 10, seed=1), tiny_tokens(model, 24, 10, seed=2)
    perm = shuffle_permutation(48, seed=3)
    ref = PrefixCleanReference(model, sae, 5, first).certificate(cal, ev)
    shuffled = PrefixCleanReference(model, sae, 5, first, perm).certificate(cal, ev)
    everywhere = PrefixCleanReference(model, sae, 5, 0).certificate(cal, ev)
    assert ref["leaves"].any() and not ref["leaves"].all()  # the example exercises η̂ and the restricted proxy
    assert abs(ref["proxy"].mean() - everywhere["proxy"].mean()) > 1e-3  # the prefix changes the numbers

    sweep = tq.certify_layers(
        model, {1: sae}, cal, ev, k=5, shuffle=True, seed=3, n_schedule=[20], exclude_first_positions=first
    )
    cert = sweep.certificates[1]
    torch.testing.assert_close(cert.loss_clean.double(), ref["clean"], atol=1e-5, rtol=0)
    torch.testing.assert_close(cert.loss_proxy.double(), ref["proxy"], atol=1e-4, rtol=0)
    torch.testing.assert_close(cert.loss_restricted.double(), ref["restricted"], atol=1e-4, rtol=0)
    assert torch.equal(cert.leaves_pool, ref["leaves"]) and torch.equal(cert.pool, ref["pool"])
    P, m, V = int(ref["pool"].sum()), 48, model.cfg.d_vocab
    assert (cert.P, cert.m, cert.N) == (P, m, 24)  # N counts windows, not scored positions
    assert cert.R_hat == pytest.approx(ref["restricted"].mean().item(), abs=1e-5)
    assert cert.eps_hat == pytest.approx((ref["clean"] - ref["proxy"]).abs().mean().item(), abs=1e-4)
    assert cert.eta_hat == pytest.approx(ref["leaves"].double().mean().item())
    u, u_occam = ref_bound(ref["clean"], ref["proxy"], ref["restricted"], ref["leaves"], P, m, V)
    assert cert.bound == pytest.approx(u, abs=1e-4) and cert.bound_occam == pytest.approx(u_occam, abs=1e-4)
    assert cert.kl_bits == pytest.approx(ref["kl"], abs=1e-4)
    assert cert.top1_agreement == pytest.approx(ref["top1"], abs=1e-6)
    direct = ref["clean"].mean().item() + cert.Delta * math.sqrt(math.log(1 / DELTA) / (2 * 24))
    assert protocol_row(cert, delta=DELTA)["bound_direct"] == pytest.approx(direct, abs=1e-5)
    assert cert.config["exclude_first_positions"] == first and cert.config["predictions_per_window"] == 9 - first
    # The shuffle ablation shares the pass and keeps the same positions clean.
    twin = sweep.shuffled[1]
    torch.testing.assert_close(twin.loss_proxy.double(), shuffled["proxy"], atol=1e-4, rtol=0)
    torch.testing.assert_close(twin.loss_restricted.double(), shuffled["restricted"], atol=1e-4, rtol=0)
    assert twin.P == P and torch.equal(twin.leaves_pool, shuffled["leaves"])


@torch.no_grad()
def test_no_excluded_position_is_the_full_splice_of_saelens():
    """N = 0 is today's certificate: the proxy is SAELens' own ``run_with_saes`` splice at every position (a code
    path independent of the certify hooks), scored over all T − 1 predictions."""
    model = tiny_model("gated_rms")
    sae = _sae("topk", model, "blocks.1.hook_resid_post")
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 24, 10, seed=2)
    proxy = ref_loss(model.run_with_saes(ev, saes=[sae], use_error_term=False), ev)
    clean = ref_loss(model(ev), ev)
    cert = tq.certify(model, sae, cal, ev, rule="native", exclude_first_positions=0)
    torch.testing.assert_close(cert.loss_clean.double(), clean, atol=1e-5, rtol=0)
    torch.testing.assert_close(cert.loss_proxy.double(), proxy, atol=1e-5, rtol=0)
    assert cert.eps_hat == pytest.approx((clean - proxy).abs().mean().item(), abs=1e-5)
    assert cert.config["exclude_first_positions"] == 0 and cert.config["predictions_per_window"] == 9


# ---- bad input -------------------------------------------------------------------------------------------------


def test_overlapping_splits_are_refused():
    model = tiny_model("gelu_ln")
    ev = tiny_tokens(model, 30, 10, seed=2)
    cal = torch.cat([tiny_tokens(model, 4, 10, seed=1), ev[:3]])
    with pytest.raises(ValueError, match=r"3 of 30 evaluation sequences also occur in the calibration"):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, k=4)


def test_too_few_sequences_names_the_minimum():
    model = tiny_model("gelu_ln")  # |V| = 61: Δ = log₂ 62, A = 5.9542·4.40876 = 26.25; (A/log₂61)² = 19.6 → 20
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 19, 10, seed=2)
    with pytest.raises(ValueError, match=r"N=19 .* The minimum is N = 20"):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, k=4)
    tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, tiny_tokens(model, 20, 10, seed=2), k=4)


def test_sae_on_a_missing_hook_is_refused():
    model = tiny_model("gelu_ln")
    sae = _sae("standard", model, "blocks.7.hook_resid_pre")
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 20, 10, seed=2)
    with pytest.raises(KeyError, match="Unknown hook 'blocks.7.hook_resid_pre'"):
        tq.certify(model, sae, cal, ev)


def test_bad_options_are_refused():
    model = tiny_model("gelu_ln")
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 20, 10, seed=2)
    with pytest.raises(ValueError, match="delta must be in"):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, delta=1.5)
    with pytest.raises(ValueError, match="rule must be"):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, rule="bottomk")


@pytest.mark.parametrize("first", [9, 10, 12])
def test_excluding_every_scored_position_is_refused_with_the_fix(first):
    from tl_query_lens.certify.config import ProtocolCertifyConfig

    model = tiny_model("gelu_ln")
    cal, ev = tiny_tokens(model, 4, 10, seed=1), tiny_tokens(model, 20, 10, seed=2)
    fix = rf"exclude_first_positions={first} leaves no position of the 10-token windows to score .* longer windows"
    with pytest.raises(ValueError, match=fix):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, exclude_first_positions=first)
    with pytest.raises(ValueError, match=fix):
        ProtocolCertifyConfig(seq_len=10, exclude_first_positions=first)
    with pytest.raises(ValueError, match="exclude_first_positions must be ≥ 0"):
        tq.certify(model, FFKV.from_model(model, 0, "vanilla"), cal, ev, exclude_first_positions=-1)


@pytest.mark.slow
@torch.no_grad()
def test_embedded_model_full_width_ffkv_proxy_is_exact_and_topk_is_not(embedded_model):
    from tl_query_lens import load_corpus

    model = embedded_model
    cal = load_corpus("embedded", model, n_seqs=4, seq_len=32, split="calibration")
    ev = load_corpus("embedded", model, n_seqs=24, seq_len=32, split="evaluation")
    sae = FFKV.from_model(model, 28, "vanilla")
    full = tq.certify(model, sae, cal, ev, k=model.cfg.d_mlp)
    assert full.eps_hat < 1e-3 and full.top1_agreement > 0.999
    assert full.baseline_bits == pytest.approx(math.log2(49152)) and full.Delta == pytest.approx(15.5849919, abs=1e-6)
    topk = tq.certify(model, sae, cal, ev, k=64)
    assert topk.eps_hat > full.eps_hat and topk.P <= model.cfg.d_mlp


@torch.no_grad()
def test_checkpoint_dir_resumes_the_proxy_pass_where_it_stopped(tmp_path, monkeypatch):
    """A pass stopped after two batches resumes from its saved windows and ends equal to an uninterrupted run (also
    with another batch size); a changed option starts a file of its own; a file as the folder is refused up front."""
    from tl_query_lens.certify import losses

    model = tiny_model("gelu_ln")
    sae = _sae("topk", model, "blocks.1.hook_resid_post")
    cal, ev = tiny_tokens(model, 6, 10, seed=1), tiny_tokens(model, 34, 10, seed=2)  # 34 = 8 batches of 4 + 2
    reference = tq.certify(model, sae, cal, ev, k=4, batch_size=4)
    monkeypatch.setattr(losses, "CHECKPOINT_SECONDS", 0.0)  # save after every batch
    real, calls = losses.clean_run, []

    def counted(*args, stop_at=None, **kw):
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt("stopped")
        return real(*args, **kw)

    def run(folder=tmp_path, stop_at=None, **extra):
        calls.clear()
        monkeypatch.setattr(losses, "clean_run", lambda *a, **kw: counted(*a, stop_at=stop_at, **kw))
        options = {"k": 4, "batch_size": 4, "checkpoint_dir": str(folder)} | extra
        return tq.certify(model, sae, cal, ev, **options)

    def same(cert, exact=True):
        for name in ("loss_clean", "loss_proxy", "loss_restricted", "leaves_pool", "kl_per_seq", "top1_per_seq"):
            a, b = getattr(cert, name), getattr(reference, name)
            assert torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), atol=1e-5), name
        assert cert.eta_hat == reference.eta_hat and cert.bound == pytest.approx(reference.bound, abs=1e-6)

    with pytest.raises(KeyboardInterrupt):
        run(stop_at=3)  # stopped in the third of nine batches
    (saved,) = tmp_path.glob("proxy-pass-*")  # beside it the calibration pass's file (test_certify_pool_curve.py)
    assert int(losses.read_tensors(saved)[1]["windows"]) == 8
    resumed = run()
    same(resumed)
    assert len(calls) == 7 and resumed.config["resumed_windows"] == 8  # batches 3..9 only (the last of 2 windows)
    assert run().config["resumed_windows"] == 34 and len(calls) == 0  # the whole pass was loaded
    model, sae = tiny_model("gelu_ln"), _sae("topk", model, "blocks.1.hook_resid_post")  # rebuilt: same key
    assert run().config["resumed_windows"] == 34 and len(calls) == 0
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", stop_at=3)
    same(run(tmp_path / "b", batch_size=3), exact=False)  # resumed after window 8 with batches of 3: 9 passes
    assert len(calls) == 9
    other = run(alpha=0.6)
    assert len(calls) == 9 and len(list(tmp_path.glob("proxy-pass-*"))) == 2
    assert other.bound != reference.bound
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="checkpoint_dir"):
        run(tmp_path / "file")
    assert len(calls) == 0  # refused before any pass


def test_dictionary_fingerprint_reads_weights_and_config_not_provenance():
    from tl_query_lens.models import dictionary_fingerprint

    model = tiny_model("gelu_ln")
    a, b = _sae("topk", model, "blocks.1.hook_resid_post"), _sae("topk", model, "blocks.1.hook_resid_post")
    assert dictionary_fingerprint(a) == dictionary_fingerprint(b)  # same seed, weights and config
    b.cfg.metadata.model_name = "another name"  # provenance only
    assert dictionary_fingerprint(a) == dictionary_fingerprint(b)
    b.cfg.k = 5
    assert dictionary_fingerprint(a) != dictionary_fingerprint(b)
    b.cfg.k = a.cfg.k
    with torch.no_grad():
        b.W_dec[3, 2] += 0.01
    assert dictionary_fingerprint(a) != dictionary_fingerprint(b)
