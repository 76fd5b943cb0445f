"""The paper's certification protocol: Occam term by lgamma, direct bound, both N* readings, |gap| densities, and the
one-window-per-document sampler (checked from the window contents, not from the sampler's own bookkeeping)."""

import math

import pytest
import torch

from tests.helpers import tiny_model
from tl_query_lens import FFKV
from tl_query_lens.certify.certify import build_certificate
from tl_query_lens.certify.config import CertifyConfig, ProtocolCertifyConfig
from tl_query_lens.certify.losses import ProxyLosses
from tl_query_lens.certify.protocol import ProtocolCertification, abs_gap_densities, certify_protocol, protocol_row
from tl_query_lens.corpus import document_split
from tl_query_lens.documents import one_window_per_document

V, ALPHA, DELTA = 3, 0.5, 0.05
CLEAN = torch.tensor([1.0, 1.5, 1.0, 2.0])
PROXY = torch.tensor([1.5, 1.5, 0.5, 2.0])
RESTRICTED = torch.tensor([1.5, 2.0, 0.5, 2.0])
LEAVES = torch.tensor([False, True, False, False])


def hand_certificate(pool, schedule=(2, 4)):
    losses = ProxyLosses(
        loss_proxy=PROXY, loss_restricted=RESTRICTED, leaves_pool=LEAVES, kl_bits=torch.zeros(4), top1=torch.ones(4)
    )
    return build_certificate(
        CLEAN, losses, pool, d_vocab=V, cfg=CertifyConfig(delta=DELTA, alpha=ALPHA, n_schedule=list(schedule))
    )


def test_occam_term_direct_bound_and_n_star_recomputed_by_hand():
    pool = torch.zeros(1000, dtype=torch.bool)
    pool[:37] = True  # P = 37, m = 1000
    row = protocol_row(hand_certificate(pool), delta=DELTA)
    big_delta = 2.0  # log₂(1 + ½·3/½) = log₂ 4
    log_choose = math.lgamma(1001) - math.lgamma(38) - math.lgamma(964)
    n = 4
    constant = 1.5 + 0.25 + big_delta * 0.25
    h_rest = big_delta * (math.sqrt(math.log(3 / DELTA) / (2 * n)) + math.sqrt(math.log(6 / DELTA) / (2 * n)))
    occam = big_delta * math.sqrt((log_choose + math.log(3 / DELTA)) / (2 * n))
    assert row["log_choose"] == pytest.approx(log_choose, rel=1e-12)
    assert row["bound_occam"] == pytest.approx(constant + occam + h_rest, abs=1e-9)
    plain = big_delta * math.sqrt(math.log(3 / DELTA) / (2 * n))
    assert row["bound"] == pytest.approx(constant + plain + h_rest, abs=1e-9)
    # Direct bound on the clean model: mean(1, 1.5, 1, 2) = 1.375 plus 2·√(ln 20 / 8).
    assert row["bound_direct"] == pytest.approx(1.375 + 2 * math.sqrt(math.log(20) / 8), abs=1e-12)
    assert row["R_hat_clean"] == pytest.approx(1.375)
    # C = 2.25 ≥ log₂ 3: never crosses; both N* are inf (closed form) / None (no schedule point below).
    assert row["N_star_closed_form"] == math.inf and row["N_star_schedule"] is None
    assert row["gap_mean"] == pytest.approx(0.0) and row["abs_gap_mean"] == pytest.approx(0.25)


def test_closed_form_n_star_differs_from_the_schedule_point():
    # Large vocabulary so that C < log₂|V|: N* closed form = (A/(log₂|V| − C))², the schedule reads the first point.
    d_vocab = 49152
    losses = ProxyLosses(
        loss_proxy=torch.full((200,), 5.0),
        loss_restricted=torch.full((200,), 5.0),
        leaves_pool=torch.zeros(200, dtype=torch.bool),
        kl_bits=torch.zeros(200),
        top1=torch.ones(200),
    )
    pool = torch.ones(10, dtype=torch.bool)  # P = m: ln C = 0, Occam = fixed pool
    cert = build_certificate(
        torch.full((200,), 5.0), losses, pool, d_vocab=d_vocab, cfg=CertifyConfig(n_schedule=[25, 96, 200])
    )
    row = protocol_row(cert, delta=0.05)
    big_delta = math.log2(1 + d_vocab)
    a = big_delta * (2 * math.sqrt(math.log(60) / 2) + math.sqrt(math.log(120) / 2))
    expected = (a / (math.log2(d_vocab) - 5.0)) ** 2  # ≈ 42.1
    assert row["N_star_closed_form"] == pytest.approx(expected, rel=1e-9)
    assert 25 < expected < 96 and row["N_star_schedule"] == 96
    assert row["N_star_closed_form_occam"] == pytest.approx(expected, rel=1e-9)


def test_abs_gap_densities_integrate_to_one_and_fold_signs():
    gaps = [torch.tensor([-1.0, 1.0, 0.5, -0.5]), torch.tensor([2.0, 0.1])]
    edges, density = abs_gap_densities(gaps, bins=4)
    assert edges[0] == 0 and edges[-1] == pytest.approx(2.0)
    width = float(edges[1] - edges[0])
    torch.testing.assert_close(density.sum(-1) * width, torch.ones(2, dtype=torch.float64))
    # |gaps| of the first: 1, 1, .5, .5 → bins [0,.5), [.5,1), [1,1.5), [1.5,2]: 0, 2, 2, 0 → density 0, 1, 1, 0.
    torch.testing.assert_close(density[0], torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64))


class WordTokenizer:
    """Each word is one token; ids are assigned in order of first appearance (so ids map back to words)."""

    eos_token_id = 0
    name_or_path = "words"

    def __init__(self):
        self.vocab = {"<eos>": 0}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def __len__(self):
        return len(self.vocab)


def documents(n=300):
    # Document j has its own words "d{j}w{i}", so every token names the document it came from.
    return [" ".join(f"d{j}w{i}" for i in range(8 + j % 13)) for j in range(n)]


def test_sampler_never_returns_two_windows_of_one_document():
    docs, tok = documents(), WordTokenizer()
    windows = one_window_per_document(docs, tok, seq_len=6, split="evaluation", seed=3)
    inverse = {i: w for w, i in tok.vocab.items()}
    source_docs = []
    for row in windows.tokens.tolist():
        words = [inverse[i] for i in row]
        owners = {w.split("w")[0] for w in words}
        assert len(owners) == 1  # a window never crosses a document boundary
        idx = [int(w.split("w")[1]) for w in words]
        assert idx == list(range(idx[0], idx[0] + 6))  # contiguous tokens of that document
        source_docs.append(owners.pop())
    assert len(source_docs) == len(set(source_docs))  # never two windows of one document
    in_split = [d for d in docs if document_split(d) == "evaluation"]
    assert windows.n_documents == len(in_split)
    assert windows.n_eligible == sum(len(d.split()) >= 6 for d in in_split) == windows.tokens.shape[0]
    with pytest.raises(ValueError, match=rf"at most {windows.n_eligible} windows"):
        one_window_per_document(docs, tok, n_seqs=windows.n_eligible + 1, seq_len=6, split="evaluation")
    fewer = one_window_per_document(docs, tok, n_seqs=10, seq_len=6, split="evaluation", seed=3)
    assert fewer.tokens.shape == (10, 6) and len(set(fewer.document.tolist())) == 10


class HashTokenizer(WordTokenizer):
    """Words hashed into a small vocabulary (for a tiny model)."""

    padding_side = "right"  # TransformerLens reads it on every forward once a model has a tokenizer

    def __init__(self, d_vocab):
        super().__init__()
        self.d_vocab = d_vocab

    def encode(self, text, add_special_tokens=False):
        return [1 + sum(map(ord, w)) * 7 % (self.d_vocab - 1) for w in text.split()]

    def __len__(self):
        return self.d_vocab


@torch.no_grad()
def test_certify_protocol_paper_end_to_end_on_a_tiny_model(tmp_path):
    model = tiny_model("gelu_ln")
    model.tokenizer = HashTokenizer(model.cfg.d_vocab)
    docs = documents(400)
    sae = {"ffkv L1": FFKV.from_model(model, 1, "vanilla")}
    res = certify_protocol(model, sae, docs, protocol="paper", n_cal=6, seq_len=8, k=4, shuffle=True, bins=8)
    row = res.rows[0]
    n_eval_docs = sum(len(d.split()) >= 8 for d in docs if document_split(d) == "evaluation")
    assert res.one_window_per_document and row["N"] == n_eval_docs == res.n_eligible
    assert res.headline == "bound_occam" and res.headline_bounds()["ffkv L1"] == row["bound_occam"]
    assert row["bound_occam"] >= row["bound"]  # ln C(m, P) ≥ 0
    assert "shuffled_abs_gap_mean" in row and res.abs_gap_density_shuffled.shape == (1, 8)
    fixed = certify_protocol(model, sae, docs, protocol="fixed-pool", n_cal=6, n_eval=30, seq_len=8, k=4)
    assert fixed.headline == "bound" and not fixed.one_window_per_document and fixed.rows[0]["N"] == 30
    back = ProtocolCertification.load(res.save(tmp_path / "paper"))
    assert back.rows == res.rows and torch.equal(back.abs_gap_density, res.abs_gap_density)
    with pytest.raises(ValueError, match="protocol must be one of"):
        ProtocolCertifyConfig(protocol="authors")


@torch.no_grad()
def test_at_n_equals_a_fresh_certification_of_the_first_n_windows(tmp_path):
    """One run at N gives the certificate at any smaller n: checked against certifying the first n windows anew."""
    model = tiny_model("gated_rms")
    gen = torch.Generator().manual_seed(0)
    cal = torch.randint(0, model.cfg.d_vocab, (6, 8), generator=gen)
    ev = torch.randint(0, model.cfg.d_vocab, (80, 8), generator=gen)
    sae = {"ffkv L1": FFKV.from_model(model, 1, "vanilla")}
    kw: dict = {"protocol": "fixed-pool", "k": 4, "shuffle": True, "exclude_first_positions": 1}
    whole = certify_protocol(model, sae, tokens=(cal, ev), **kw)
    whole = ProtocolCertification.load(whole.save(tmp_path / "whole"))  # the per-window losses survive saving
    fresh = certify_protocol(model, sae, tokens=(cal, ev[:32]), **kw)  # 32: the same batches as the whole run
    prefix = whole.at_n(32)
    assert prefix.rows[0]["N"] == 32 and whole.rows[0]["N"] == 80
    for key, value in fresh.rows[0].items():
        expected = value if value is None or isinstance(value, bool) else pytest.approx(value, rel=1e-6, abs=1e-9)
        assert prefix.rows[0][key] == expected, key
    assert whole.at_n(80).rows[0]["bound_occam"] == pytest.approx(whole.rows[0]["bound_occam"], rel=1e-9)
    with pytest.raises(ValueError, match="1 <= n <= 80"):
        whole.at_n(81)


def test_estimate_follows_the_first_batch_and_counts_the_passes_run(monkeypatch, caplog):
    """certify_protocol logs its estimate right after its first batch (timed: no extra batch), and the forward batches
    it scales by equal the passes run: the model's forward calls (calibration and clean passes; a forward call of its
    own, counted by wrapping ``model.forward``) plus the proxy passes from the residual (a restricted re-run of a few
    rows aside)."""
    import re

    from tests.helpers import count_forwards
    from tl_query_lens.certify import losses

    model = tiny_model("gelu_ln")
    forwards = count_forwards(model, monkeypatch)
    proxies = []
    real = losses.run_from_residual

    def proxy(*args, **kwargs):
        if "rows" not in kwargs:
            proxies.append(any("estimated wall time" in r.getMessage() for r in caplog.records))
        return real(*args, **kwargs)

    monkeypatch.setattr(losses, "run_from_residual", proxy)
    gen = torch.Generator().manual_seed(0)
    cal = torch.randint(0, model.cfg.d_vocab, (5, 8), generator=gen)
    ev = torch.randint(0, model.cfg.d_vocab, (20, 8), generator=gen)
    saes = {"a": FFKV.from_model(model, 0, "topk", k=5), "b": FFKV.from_model(model, 2, "topk", k=5)}
    with caplog.at_level("INFO"):
        certify_protocol(model, saes, tokens=(cal, ev), protocol="tlql", k=5, batch_size=3, shuffle=True)
    line = next(r.getMessage() for r in caplog.records if "estimated wall time" in r.getMessage())
    # one-token probes of the hooks' sizes, then ceil(5/3) calibration + ceil(20/3) clean batches, and nothing more
    assert forwards == [1] * 4 + [24, 16] + [24] * 6 + [16]
    assert len(proxies) == 7 * 4 and all(proxies)  # 2 real + 2 shuffled proxies per batch, after the estimate
    assert int(re.search(r"\((\d+) forward batches", line).group(1)) == len(forwards) - 4 + len(proxies)
    assert "--n-eval" in line
