"""The pool-size curve (``pool_sizes``): every pool from one calibration pass and one evaluation pass, checked against
separate certifications on the first n calibration windows and against pools computed here from the weights."""

import pytest
import torch

import tl_query_lens as tq
from tests.helpers import tiny_model, tiny_tokens
from tests.test_certify import _sae, topk_abs
from tl_query_lens.certify import losses
from tl_query_lens.certify.config import ProtocolCertifyConfig
from tl_query_lens.certify.protocol import certify_protocol
from tl_query_lens.certify.sweep import certify_layers
from tl_query_lens.errors import InputError

HOOK = "blocks.1.hook_resid_post"
FIELDS = ("loss_clean", "loss_proxy", "loss_restricted", "leaves_pool", "kl_per_seq", "top1_per_seq", "pool")


def _setup():
    model = tiny_model("gelu_ln")
    sae = _sae("standard", model, HOOK, d_sae=256)  # wide, k = 2 below: the pool keeps growing with n
    cal, ev = tiny_tokens(model, 26, 10, seed=1), tiny_tokens(model, 30, 10, seed=2)
    return model, sae, cal, ev


def reference_pool(model, sae, cal, k, first=1):
    """Union of the TopK-k supports of ``sae.encode`` over ``cal`` at positions ≥ first, one window at a time."""
    _, cache = model.run_with_cache(cal, names_filter=[HOOK])
    pool = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
    for window in cache[HOOK][:, first:]:
        pool |= (topk_abs(sae.encode(window), k) != 0).any(0)
    return pool


@torch.no_grad()
def test_pool_curve_equals_separate_runs_on_the_first_n_windows():
    """n = 2 and 6 end inside a batch of 4 (the first-firing index is per window, not per batch)."""
    model, sae, cal, ev = _setup()
    options = {"k": 2, "batch_size": 4, "exclude_first_positions": 1}
    sweep = certify_layers(model, {"sae": sae}, cal, ev, pool_sizes=(6, 2, 16), **options)
    assert list(sweep.certificates) == ["sae", "sae n_cal=2", "sae n_cal=6", "sae n_cal=16"]
    sizes = [cert.P for cert in sweep.certificates.values()]
    assert sizes[1] < sizes[2] < sizes[3] < sizes[0] < 256  # the pools differ: the test can tell them apart
    for n, label in ((26, "sae"), (2, "sae n_cal=2"), (6, "sae n_cal=6"), (16, "sae n_cal=16")):
        cert = sweep.certificates[label]
        separate = tq.certify(model, sae, cal[:n], ev, **options)
        assert torch.equal(cert.pool, reference_pool(model, sae, cal[:n], k=2)), label
        for name in FIELDS:
            assert torch.equal(getattr(cert, name), getattr(separate, name)), (label, name)
        for name in ("R_hat", "eta_hat", "eps_hat", "bound", "bound_occam", "P"):
            assert getattr(cert, name) == getattr(separate, name), (label, name)
        assert cert.config["n_cal"] == n
    assert sweep.certificates["sae n_cal=2"].eta_hat > sweep.certificates["sae"].eta_hat


@torch.no_grad()
def test_pool_curve_runs_each_proxy_once_per_batch(monkeypatch):
    """The pools share one proxy run per batch; only the restricted runs (rows that leave a pool) are per pool."""
    model, sae, cal, ev = _setup()
    real, runs = losses.run_from_residual, []

    def counted(*args, rows=None, **kw):
        runs.append(rows is None)
        return real(*args, rows=rows, **kw)

    monkeypatch.setattr(losses, "run_from_residual", counted)
    certify_layers(model, {"sae": sae}, cal, ev, k=2, batch_size=4, pool_sizes=(2, 6))
    assert sum(runs) == 8  # 30 windows in batches of 4: one unrestricted proxy run per batch
    assert len(runs) - sum(runs) <= 3 * 8


@torch.no_grad()
def test_protocol_rows_name_the_pool_size_and_sizes_must_be_below_n_cal():
    model, sae, cal, ev = _setup()
    cfg = ProtocolCertifyConfig(protocol="tlql", k=2, batch_size=4, pool_sizes=(4,))
    result = certify_protocol(model, {"sae": sae}, tokens=(cal, ev), cfg=cfg)
    assert result.labels == ["sae", "sae n_cal=4"]
    assert [(r["n_cal"], r["cal_tokens"]) for r in result.rows] == [(26, 260), (4, 40)]
    assert result.at_n(20).rows[1]["n_cal"] == 4
    with pytest.raises(InputError, match="pool_sizes"):
        certify_protocol(
            model, {"sae": sae}, tokens=(cal, ev), cfg=ProtocolCertifyConfig(protocol="tlql", pool_sizes=(26,))
        )


@torch.no_grad()
def test_calibration_pass_resumes_where_it_stopped(tmp_path, monkeypatch):
    """A calibration pass stopped after two saved batches resumes from its file and ends with the same indices; a
    pass over fewer windows of the same order reads them from the file, one over more resumes after them, one over
    other windows starts again."""
    model, sae, cal, _ = _setup()
    splices = {"sae": losses.Splice(sae, k=2)}
    longer, other = torch.cat([cal, tiny_tokens(model, 5, 10, seed=7)]), tiny_tokens(model, 26, 10, seed=9)
    want = {n: losses.first_firing(model, splices, t, batch_size=4)["sae"] for n, t in (("cal", cal), ("7", cal[:7]))}
    want |= {
        n: losses.first_firing(model, splices, t, batch_size=4)["sae"]
        for n, t in (("longer", longer), ("other", other))
    }
    assert (want["cal"] < 26).sum() < 256 and (want["cal"] == 26).any()  # some features never fire
    assert not torch.equal(want["7"], want["cal"])
    monkeypatch.setattr(losses, "CHECKPOINT_SECONDS", 0.0)
    real, calls = model.run_with_cache, []

    def stopping(*args, stop_at=None, **kw):
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt("stopped")
        return real(*args, **kw)

    path = tmp_path / "pool.safetensors"

    def run(tokens, stop_at=None):
        calls.clear()
        monkeypatch.setattr(model, "run_with_cache", lambda *a, **kw: stopping(*a, stop_at=stop_at, **kw))
        return losses.first_firing(model, splices, tokens, batch_size=4, checkpoint=path)["sae"]

    with pytest.raises(KeyboardInterrupt):
        run(cal, stop_at=3)
    assert torch.equal(run(cal), want["cal"]) and len(calls) == 5  # batches 3..7 of 7 (26 windows in 4s)
    assert torch.equal(run(cal[:7]), want["7"]) and len(calls) == 0  # read from the file
    assert torch.equal(run(longer), want["longer"]) and len(calls) == 2  # windows 26..30 only
    assert torch.equal(run(other), want["other"]) and len(calls) == 7  # other windows: from the start
