"""Transition-operator engine: reverse = forward sweeps, finite differences, merge/cache/resume, bad input, torchrun."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.operators import OperatorSet, engine, key_operators, module_operators, value_operators

VALUE_HOOKS = ["hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_mid", "blocks.2.hook_resid_pre"]
KEY_HOOKS = ["blocks.0.ln2.hook_normalized", "blocks.1.hook_resid_mid", "blocks.2.mlp.hook_post"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("kind", ["value", "key", "module"])
def test_reverse_and_forward_sweeps_agree(style, kind):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    if kind == "value":
        run = lambda d: value_operators(model, tokens, VALUE_HOOKS, direction=d, chunk=20, progress=False)
    elif kind == "key":
        run = lambda d: key_operators(model, tokens, KEY_HOOKS, direction=d, chunk=24, progress=False)
    else:
        run = lambda d: module_operators(model, tokens, direction=d, chunk=16, skip_positions=2, progress=False)
    reverse, forward = run("reverse"), run("forward")
    assert reverse.hooks == forward.hooks and reverse.count == forward.count
    for name in reverse:
        assert rel_err(reverse[name], forward[name]) < 1e-5, name


def test_value_operator_matches_finite_difference(style):
    """M v predicts the change of the mean final residual when v is added at every position (small step)."""
    model = tiny_model(style).double()
    model.cfg.dtype = torch.float64
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    hook, final = "blocks.0.hook_resid_post", engine.final_hook(model)
    M = value_operators(model, tokens, [hook], skip_positions=1, progress=False)[hook].double()
    v = torch.randn(model.cfg.d_model, dtype=torch.float64)
    eps = 1e-6

    def mean_final(scale: float) -> torch.Tensor:
        out = {}
        with model.hooks(
            fwd_hooks=[(hook, lambda x, hook: x + scale * v), (final, lambda x, hook: out.__setitem__("x", x))]
        ):
            model(tokens, stop_at_layer=model.cfg.n_layers)
        return out["x"][:, 1:].mean((0, 1))

    finite = (mean_final(eps) - mean_final(-eps)) / (2 * eps)
    assert rel_err(M @ v, finite) < 1e-5


def test_module_operators_are_isolated_jacobians(style):
    """J̄_M^k from the engine equals a direct JVP of block k's MLP write at its clean input."""
    model = tiny_model(style)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=8)
    ops = module_operators(model, tokens, layers=[1], progress=False)
    assert ops.hooks == ["blocks.1.attn", "blocks.1.mlp"]
    _, cache = model.run_with_cache(tokens)
    block = model.blocks[1]
    v = torch.randn(model.cfg.d_model)
    _, tangent = torch.func.jvp(
        lambda x: block.mlp(block.ln2(x)),
        (cache["blocks.1.hook_resid_mid"],),
        (v.expand_as(cache["blocks.1.hook_resid_mid"]),),
    )
    assert rel_err(ops["blocks.1.mlp"] @ v, tangent.mean((0, 1))) < 1e-5


def test_merge_of_shards_equals_whole_corpus():
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=4)
    whole = value_operators(model, tokens, VALUE_HOOKS[1:], progress=False)
    first = value_operators(model, tokens[:1], VALUE_HOOKS[1:], progress=False)
    rest = value_operators(model, tokens[1:], VALUE_HOOKS[1:], progress=False)
    merged = first.merge(rest)
    assert merged.count == whole.count == tokens.numel()
    for name in whole:
        assert rel_err(merged[name], whole[name]) < 1e-5
    with pytest.raises(ValueError, match="Cannot merge"):
        merged.merge(key_operators(model, tokens, KEY_HOOKS, progress=False))


def test_save_load_and_cache_reuse(tmp_path, monkeypatch):
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)
    ops = value_operators(model, tokens, VALUE_HOOKS, cache_dir=tmp_path, progress=False)
    files = list(tmp_path.glob("value-*.safetensors"))
    assert len(files) == 1
    loaded = OperatorSet.load(files[0])
    assert loaded.metadata() == ops.metadata() and loaded.complete
    for name in ops:
        assert torch.equal(loaded.sums[name], ops.sums[name])

    def boom(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(engine, "_run_sweep", boom)
    again = value_operators(model, tokens, list(reversed(VALUE_HOOKS)), cache_dir=tmp_path, progress=False)
    assert torch.equal(again.sums[VALUE_HOOKS[0]], ops.sums[VALUE_HOOKS[0]])
    with pytest.raises(AssertionError, match="reused"):  # another corpus does not hit the cache
        value_operators(model, tokens[:2], VALUE_HOOKS, cache_dir=tmp_path, progress=False)


def test_a_subset_of_hooks_is_read_from_a_larger_cached_sweep(tmp_path, monkeypatch):
    """An added dictionary asks for one hook that an earlier all-layer sweep holds: no new sweep, the same sums;
    another method (forward direction), corpus or weights still computes."""
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)
    ops = value_operators(model, tokens, VALUE_HOOKS, cache_dir=tmp_path, progress=False)
    module = module_operators(model, tokens, cache_dir=tmp_path, progress=False)
    real, calls = engine._run_sweep, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_run_sweep", counted)
    one = value_operators(model, tokens, VALUE_HOOKS[1:], cache_dir=tmp_path, progress=False)
    later = module_operators(model, tokens, layers=[1], cache_dir=tmp_path, progress=False)
    assert calls == []
    assert one.hooks == VALUE_HOOKS[1:] and torch.equal(one.sums[VALUE_HOOKS[1]], ops.sums[VALUE_HOOKS[1]])
    assert one.count == ops.count and torch.equal(later.sums["blocks.1.mlp"], module.sums["blocks.1.mlp"])
    value_operators(model, tokens, VALUE_HOOKS[1:], cache_dir=tmp_path, direction="forward", progress=False)
    assert len(calls) > 0
    calls.clear()
    value_operators(model, tokens[:2], VALUE_HOOKS[1:], cache_dir=tmp_path, progress=False)
    assert len(calls) > 0
    calls.clear()
    with torch.no_grad():
        model.blocks[1].mlp.W_out.add_(0.01)
    value_operators(model, tokens, VALUE_HOOKS[1:], cache_dir=tmp_path, progress=False)
    assert len(calls) > 0


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=4)
    fresh = key_operators(model, tokens, KEY_HOOKS, batch_size=2, progress=False)
    real, calls = engine._run_sweep, []

    def dies_on_second_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_run_sweep", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        key_operators(model, tokens, KEY_HOOKS, batch_size=2, cache_dir=tmp_path, progress=False)
    (partial,) = tmp_path.glob("key-*.safetensors")
    assert OperatorSet.load(partial).batches_done == 1
    calls.clear()
    monkeypatch.setattr(engine, "_run_sweep", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    resumed = key_operators(model, tokens, KEY_HOOKS, batch_size=2, cache_dir=tmp_path, progress=False)
    assert len(calls) == 1  # only the second minibatch was swept
    assert resumed.complete and resumed.count == fresh.count
    for name in fresh:
        assert rel_err(resumed[name], fresh[name]) < 1e-6
    # another minibatch split does not resume a partial state: the whole corpus is swept again
    (done,) = tmp_path.glob("key-*.safetensors")
    done.unlink()
    monkeypatch.setattr(engine, "_run_sweep", dies_on_second_batch)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        key_operators(model, tokens, KEY_HOOKS, batch_size=2, cache_dir=tmp_path, progress=False)
    calls.clear()
    monkeypatch.setattr(engine, "_run_sweep", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    again = key_operators(model, tokens, KEY_HOOKS, batch_size=1, cache_dir=tmp_path, progress=False)
    assert len(calls) == 4 and again.count == fresh.count


def test_bad_input_is_rejected():
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)
    with pytest.raises(ValueError, match="another tokenizer"):
        value_operators(model, tokens + model.cfg.d_vocab, VALUE_HOOKS, progress=False)
    with pytest.raises(KeyError, match="Unknown hook"):
        key_operators(model, tokens, ["blocks.1.hook_resid_psot"], progress=False)
    with pytest.raises(ValueError, match="start at a block hook"):
        value_operators(model, tokens, ["ln_final.hook_normalized"], progress=False)
    with pytest.raises(ValueError, match="skip_positions"):
        value_operators(model, tokens, VALUE_HOOKS, skip_positions=tokens.shape[1], progress=False)
    with pytest.raises(ValueError, match="out of range"):
        module_operators(model, tokens, layers=[3], progress=False)
    with pytest.raises(TypeError, match="integer tensor"):
        value_operators(model, tokens.float(), VALUE_HOOKS, progress=False)


def test_non_finite_operators_raise():
    model = tiny_model("gelu_ln")
    tokens = tiny_tokens(model)
    with torch.no_grad():
        model.blocks[2].mlp.W_out[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        value_operators(model, tokens, ["blocks.0.hook_resid_post"], progress=False)
    ops = OperatorSet(
        kind="key",
        sums={"h": torch.full((2, 2), float("inf"))},
        count=3,
        model_name="m",
        anchor_hook="hook_embed",
        corpus_fingerprint="x",
        dtype="float32",
    )
    with pytest.raises(ValueError, match="non-finite"):
        ops["h"]
    with pytest.raises(KeyError, match="holds"):
        ops["other"]


def two_ranks(out: Path, *mode: str, check: bool = True) -> int:
    """Run tests/distributed_operators.py under torchrun with two ranks; its exit status."""
    script = Path(__file__).with_name("distributed_operators.py")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    command = [torchrun, "--nproc_per_node", "2", "--master_port", "29517", str(script), str(out), *mode]
    return subprocess.run(command, check=check, env=env, timeout=120, capture_output=True).returncode


needs_torchrun = pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="torchrun not installed",
)


@pytest.mark.distributed
@needs_torchrun
def test_two_rank_torchrun_equals_one_rank(tmp_path):
    two_ranks(tmp_path)
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=5)
    single = {
        "value": value_operators(model, tokens, VALUE_HOOKS, progress=False),
        "key": key_operators(model, tokens, KEY_HOOKS, progress=False),
    }
    for kind, ops in single.items():
        for rank in (0, 1):
            shard = OperatorSet.load(tmp_path / f"{kind}-rank{rank}.safetensors")
            assert shard.count == ops.count == tokens.numel()
            assert shard.corpus_fingerprint == ops.corpus_fingerprint
            for name in ops:
                assert rel_err(shard[name], ops[name]) < 1e-5, (kind, rank, name)


@pytest.mark.distributed
@needs_torchrun
def test_two_ranks_stopped_midway_resume_each_from_its_own_progress(tmp_path):
    """Both ranks are killed after their first minibatch; the rerun sweeps only what is left on each rank (rank 0:
    2 of 3 sequences, rank 1: 1 of 2) and returns the single-process operators; the per-rank files are then gone."""
    assert two_ranks(tmp_path, "stop", check=False) != 0
    progress = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(progress) == 2 and {p.split(".")[1] for p in progress} == {"rank0of2", "rank1of2"}, progress
    two_ranks(tmp_path, "resume")
    assert [json.loads((tmp_path / f"swept-rank{r}.json").read_text()) for r in (0, 1)] == [2, 1]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [progress[0].replace(".rank0of2", "")]
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=5)
    single = value_operators(model, tokens, VALUE_HOOKS, progress=False)
    for rank in (0, 1):
        resumed = OperatorSet.load(tmp_path / f"resumed-rank{rank}.safetensors")
        assert resumed.count == single.count == tokens.numel()
        for name in single:
            assert rel_err(resumed[name], single[name]) < 1e-5, (rank, name)
