"""Table 1 and the paper-protocol certification on SAELens SAEs (a TopK residual SAE built here), FF-KV beside them.

Covers the shared ``--dictionary`` parsing (FF-KV, saved folders, ``release:sae_id``), the ``"active"`` feature
selection against a hand count of active sequences, and both commands end to end on a tiny random model.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sae_lens import TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import tiny_model, tiny_tokens
from tests.test_certify_protocol import HashTokenizer, documents
from tl_query_lens import FFKV
from tl_query_lens.cli import main
from tl_query_lens.errors import InputError
from tl_query_lens.query_lens.commands import Table1Run
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.max_activating import max_activating_contexts
from tl_query_lens.query_lens.table1 import evaluate_table1
from tl_query_lens.sources import load_sources, parse_sources

LAYER, HOOK = 1, "blocks.1.hook_resid_post"
DEAD = (0, 5, 9)  # features whose encoder bias keeps them out of every top-k


def topk_sae(model, d_sae: int = 48, k: int = 4, seed: int = 7) -> TopKSAE:
    """A random-weight SAELens TopK SAE on ``blocks.1.hook_resid_post`` with three planted dead features."""
    d = model.cfg.d_model
    cfg = TopKSAEConfig(
        d_in=d,
        d_sae=d_sae,
        k=k,
        metadata=SAEMetadata(model_name=model.cfg.model_name, hook_name=HOOK, context_size=model.cfg.n_ctx),
    )
    sae = TopKSAE(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(d, d_sae, generator=gen) / d**0.5)
        sae.b_enc.copy_(torch.randn(d_sae, generator=gen) * 0.1)
        sae.b_enc[list(DEAD)] = -1e3
        W_dec = torch.randn(d_sae, d, generator=gen)
        sae.W_dec.copy_(W_dec / W_dec.norm(dim=1, keepdim=True))
        sae.b_dec.zero_()
    return sae


class ListTokenizer:
    def __init__(self, n):
        self.strings = [f"t{i}" for i in range(n)]

    def decode(self, ids):
        return "".join(self.strings[i] for i in ids)


class WordTokenizer(HashTokenizer):
    """Encodes documents by hashing words (the certification corpus); decodes id i to ``"t{i}"`` (Table 1)."""

    def decode(self, ids):
        return "".join(f"t{int(i)}" for i in ids)

    def batch_decode(self, rows):
        return [self.decode(row) for row in rows]


def active_sequences(model, sae, tokens):
    """Reference: sequences in which each feature is > 0 somewhere (SAELens encode on a plain run_with_cache)."""
    _, cache = model.run_with_cache(tokens, names_filter=HOOK)
    return (sae.encode(cache[HOOK]) > 0).any(dim=1).sum(dim=0)


SMALL = {
    "k": 5,
    "n_contexts": 4,
    "kl_targets": (0.1,),
    "n_generate": 3,
    "n_steps": 2,
    "baselines": (),
}


@torch.no_grad()
def test_active_selection_is_the_features_active_in_n_contexts_sequences():
    model = tiny_model("gelu_ln")
    sae = topk_sae(model)
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    counts = active_sequences(model, sae, tokens)
    eligible = torch.nonzero(counts >= 4).reshape(-1)
    assert 0 < eligible.numel() < sae.cfg.d_sae and not set(DEAD) & set(eligible.tolist())
    tok, prompts = ListTokenizer(model.cfg.d_vocab), [torch.tensor([1, 2, 3])]
    kw = {"tokenizer": tok, "prompt_tokens": prompts, **SMALL, "methods": ("LL_VALUE",)}
    res = evaluate_table1(
        model, {"sae": sae}, tokens[:2], tokens, features_per_layer=int(eligible.numel()), **kw
    )  # asking for every eligible feature returns exactly that set
    assert torch.equal(res.features, eligible)
    assert res.config["feature_selection_by_dictionary"]["sae"] == {
        "rule": "active",
        "eligible": int(eligible.numel()),
        "d_sae": 48,
    }
    with pytest.raises(InputError, match=r"only \d+ of 48 features fire in ≥ n_contexts=4"):
        evaluate_table1(model, {"sae": sae}, tokens[:2], tokens, features_per_layer=int(eligible.numel()) + 1, **kw)
    uniform = evaluate_table1(
        model, {"sae": sae}, tokens[:2], tokens, features_per_layer=47, feature_selection="uniform", **kw
    )
    assert set(DEAD) & set(uniform.features.tolist())  # the uniform rule does draw dead latents


def test_up_key_with_an_sae_fails_before_any_pass(monkeypatch):
    from tl_query_lens.query_lens import table1

    def no_pass(*args, **kwargs):
        raise AssertionError("a corpus pass ran before the up-key check")

    monkeypatch.setattr(table1, "max_activating_contexts", no_pass)
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    with pytest.raises(ValueError, match="up-projection key exists for FF-KV"):
        evaluate_table1(model, {"sae": topk_sae(model)}, tokens[:2], tokens, up_key=True, **SMALL)


@torch.no_grad()
def test_contexts_leave_out_the_first_positions():
    model = tiny_model("gelu_ln")
    sae = topk_sae(model)
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    _, cache = model.run_with_cache(tokens, names_filter=HOOK)
    acts = sae.encode(cache[HOOK])[:, 2:]  # reference: positions 2.. only
    contexts = max_activating_contexts(model, sae, tokens, n_contexts=4, exclude_first_positions=2)
    assert torch.equal(contexts.n_active, (acts > 0).any(dim=1).sum(dim=0))
    best = acts.max(dim=1).values.T.topk(4, dim=1).values  # [d_sae, 4]
    torch.testing.assert_close(contexts.activation, best)
    assert (contexts.pos >= 2).all()
    picked = acts[contexts.seq, contexts.pos - 2, torch.arange(48)[:, None]]
    torch.testing.assert_close(picked, contexts.activation)
    with pytest.raises(ValueError, match="must lie in 0..7"):
        max_activating_contexts(model, sae, tokens, n_contexts=4, exclude_first_positions=8)


@torch.no_grad()
def test_table1_on_ffkv_and_a_topk_sae_side_by_side(tmp_path):
    model = tiny_model("gelu_ln")
    sae = topk_sae(model)
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    dictionaries = {"ffkv L1": FFKV.from_model(model, LAYER, "vanilla"), "sae L1 topk": sae}
    res = evaluate_table1(
        model,
        dictionaries,
        tokens[:2],
        tokens,
        tokenizer=ListTokenizer(model.cfg.d_vocab),
        prompt_tokens=[torch.tensor([1, 2, 3]), torch.tensor([4, 5])],
        features_per_layer=3,
        seed=4,
        **SMALL,
    )
    assert res.dictionaries == ["ffkv L1"] * 3 + ["sae L1 topk"] * 3
    # FF-KV keeps the uniform rule of before: the first draw of the seeded generator.
    old_rule = torch.randperm(model.cfg.d_mlp, generator=torch.Generator().manual_seed(4))[:3].sort().values
    ffkv, topk = res.select(["ffkv L1"]), res.select(["sae L1 topk"])
    assert torch.equal(ffkv.features, old_rule)
    counts = active_sequences(model, sae, tokens)
    assert (counts[topk.features] >= 4).all() and (topk.layers == LAYER).all()
    assert {"QL_KEY", "QL_VALUE", "LL_KEY", "LL_VALUE"} <= set(topk.methods)
    for part in (ffkv, topk):
        assert part.input_scores.shape == (len(part.methods), 3)
        assert ((part.input_scores >= 0) & (part.input_scores <= 1)).all()
        assert ((part.output_scores >= 0) & (part.output_scores <= 1)).all()
        assert torch.isfinite(part.alphas).all()
    assert torch.equal(topk.input_scores, res.input_scores[:, 3:])
    back = SignatureEvaluation.load(res.save(tmp_path / "t1"))
    assert back.dictionaries == res.dictionaries and torch.equal(back.features, res.features)
    columns, rows = res.per_feature_table()
    assert columns[:3] == ["dictionary", "layer", "feature"] and rows[3][0] == "sae L1 topk"
    with pytest.raises(InputError, match="labels present"):
        res.select(["sae L2 other"])


@torch.no_grad()
def table1_inputs(n_dictionaries: int = 2, *, up_key: bool = False):
    """A tiny model, FF-KV L1 and a TopK SAE on L1 (and FF-KV L0 with three), 24 × 8 tokens and small options.

    ``up_key``: a gated model's FF-KV at L0 and L1 instead, scored with the up-projection key (whose operators are
    computed while the signatures are, since no QL_KEY method asks for them beforehand)."""
    model = tiny_model("gated_rms" if up_key else "gelu_ln")
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    dictionaries = {"ffkv L1": FFKV.from_model(model, LAYER, "vanilla"), "sae L1 topk": topk_sae(model)}
    if up_key:
        dictionaries = {f"ffkv L{layer}": FFKV.from_model(model, layer, "vanilla") for layer in (0, 1)}
    elif n_dictionaries == 3:
        dictionaries["ffkv L0"] = FFKV.from_model(model, 0, "vanilla")
    kwargs = dict(
        tokenizer=ListTokenizer(model.cfg.d_vocab),
        prompt_tokens=[torch.tensor([1, 2, 3]), torch.tensor([4, 5])],
        features_per_layer=3,
        seed=4,
        **SMALL,
    )
    if up_key:
        kwargs |= {"up_key": True, "methods": ("LL_KEY", "QL_VALUE")}
    return model, dictionaries, tokens, kwargs


def same_evaluation(res: SignatureEvaluation, reference: SignatureEvaluation, *, exact: bool = True) -> None:
    """Equal features, signatures, scores and steered tokens; the continuous α-search fields (α, KLs) bit for bit when
    ``exact``, else to float32 rounding (another process's kernels may sum in another order)."""
    assert res.dictionaries == reference.dictionaries and res.methods == reference.methods
    for name in ("features", "layers", "input_scores", "output_scores", "signature_ids", "steered_top"):
        assert torch.equal(getattr(res, name), getattr(reference, name)), name
    for name in ("alphas", "search_kl", "achieved_kl"):
        if exact:
            assert torch.equal(getattr(res, name), getattr(reference, name)), name
        else:
            torch.testing.assert_close(getattr(res, name), getattr(reference, name), rtol=1e-5, atol=1e-7, msg=name)


def test_checkpoint_dir_resumes_dictionary_by_dictionary(tmp_path, monkeypatch):
    """A run stopped after its first dictionary resumes from the saved part and ends equal to an uninterrupted run;
    a changed option or an unreadable part is evaluated again."""
    from tl_query_lens.query_lens import table1

    model, dictionaries, tokens, kwargs = table1_inputs()
    reference = evaluate_table1(model, dictionaries, tokens[:2], tokens, **kwargs)
    real, calls = table1.evaluate_signatures, []

    def counted(*args, fail_at=None, **kw):
        calls.append(1)
        if len(calls) == fail_at:
            raise KeyboardInterrupt("stopped")
        return real(*args, **kw)

    def run(fail_at=None, **extra):
        calls.clear()
        monkeypatch.setattr(table1, "evaluate_signatures", lambda *a, **kw: counted(*a, fail_at=fail_at, **kw))
        return evaluate_table1(model, dictionaries, tokens[:2], tokens, checkpoint_dir=str(tmp_path), **kwargs | extra)

    def same(res):
        same_evaluation(res, reference)

    with pytest.raises(KeyboardInterrupt):
        run(fail_at=2)  # stopped while evaluating the second dictionary
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert len(saved) == 1 and saved[0].startswith("ffkv_L1"), saved  # no half-written folder of the second
    resumed = run()
    same(resumed)
    assert len(calls) == 1 and resumed.config["resumed_dictionaries"] == ["ffkv L1"]  # only the second evaluated
    same(run())
    assert len(calls) == 0  # everything loaded
    # a new process rebuilds the model and dictionaries: new objects with the same weights find the same parts
    model, dictionaries, _, _ = table1_inputs()
    same(run())
    assert len(calls) == 0
    (next(p for p in tmp_path.iterdir() if "sae" in p.name) / "tensors.safetensors").unlink()
    same(run())
    assert len(calls) == 1  # the unreadable part was evaluated again
    changed = run(n_steps=3)
    assert len(calls) == 2 and len(list(tmp_path.iterdir())) == 4  # another option: new parts beside the old
    assert torch.equal(changed.features, reference.features)
    dictionaries["sae L1 topk"].cfg.k = 6  # the SAE's config changed (same weights): its part is evaluated again
    run()
    assert len(calls) == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="checkpoint_dir"):
        evaluate_table1(model, dictionaries, tokens[:2], tokens, checkpoint_dir=str(tmp_path / "file"), **kwargs)


def test_feature_basis_gives_the_full_operators_evaluation_from_feature_directions_only(tmp_path, monkeypatch):
    """basis="features" pushes (pulls) only the sampled features' directions through the engine, never a full
    operator, and scores as the full operators do (reference: basis="identity"); a part saved under one basis is
    reused by the other, since the signatures it depends on are the same."""
    from tl_query_lens.query_lens import lens as lens_module
    from tl_query_lens.query_lens import table1

    model, dictionaries, tokens, kwargs = table1_inputs(3)
    reference = evaluate_table1(model, dictionaries, tokens[:2], tokens, checkpoint_dir=str(tmp_path), **kwargs)
    widths = []
    for name in ("value_operators", "key_operators", "module_operators"):
        real = getattr(lens_module, name)

        def recorded(*args, real=real, basis=None, **kw):
            widths.append(None if basis is None else len(basis))
            return real(*args, basis=basis, **kw)

        monkeypatch.setattr(lens_module, name, recorded)
    evaluated, real_evaluate = [], table1.evaluate_signatures
    monkeypatch.setattr(table1, "evaluate_signatures", lambda *a, **kw: evaluated.append(1) or real_evaluate(*a, **kw))
    fresh = evaluate_table1(model, dictionaries, tokens[:2], tokens, basis="features", **kwargs)
    same_evaluation(fresh, reference, exact=False)
    assert widths and None not in widths and max(widths) <= 3, widths  # 3 features per dictionary
    assert fresh.config["basis"] == "features" and len(evaluated) == 3
    evaluated.clear()
    resumed = evaluate_table1(
        model, dictionaries, tokens[:2], tokens, basis="features", checkpoint_dir=str(tmp_path), **kwargs
    )
    assert not evaluated and resumed.config["resumed_dictionaries"] == list(dictionaries)
    with pytest.raises(ValueError, match="basis must be one of"):
        evaluate_table1(model, dictionaries, tokens[:2], tokens, basis="full", **kwargs)


@pytest.mark.distributed
@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_two_torchrun_ranks_split_the_dictionaries_and_return_one_process_result(tmp_path):
    """Rank 0 evaluates the first and third dictionary, rank 1 the second; both return the single-process result,
    and a rerun on the shared checkpoint folder loads all three parts."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    script = str(Path(__file__).with_name("distributed_table1.py"))
    command = [torchrun, "--nproc_per_node", "2", "--master_port", "29519", script]
    subprocess.run([*command, str(tmp_path)], check=True, env=env, timeout=300, capture_output=True)
    model, dictionaries, tokens, kwargs = table1_inputs(3)
    reference = evaluate_table1(model, dictionaries, tokens[:2], tokens, **kwargs)
    assert reference.dictionaries[0] == "ffkv L1" and reference.dictionaries[-1] == "ffkv L0"
    shares = {0: ["ffkv L1", "ffkv L0"], 1: ["sae L1 topk"]}
    for rank, share in shares.items():
        same_evaluation(SignatureEvaluation.load(tmp_path / f"rank{rank}"), reference, exact=False)
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["evaluated"] == share  # no dictionary evaluated twice
        assert record["resumed"] == list(dictionaries)  # the rerun loaded every rank's parts, listed in order
    assert len(list((tmp_path / "parts").iterdir())) == 3
    # The up-projection key's operators are computed with the signatures: every rank makes the same engine calls.
    model, dictionaries, tokens, kwargs = table1_inputs(up_key=True)
    reference = evaluate_table1(model, dictionaries, tokens[:2], tokens, **kwargs)
    assert "QL_KEY_UP" in reference.methods
    subprocess.run([*command, str(tmp_path / "up"), "up_key"], check=True, env=env, timeout=300, capture_output=True)
    for rank in (0, 1):
        same_evaluation(SignatureEvaluation.load(tmp_path / "up" / f"rank{rank}"), reference, exact=False)
    # In the feature basis every operator is computed with the signatures, on every rank in one order.
    model, dictionaries, tokens, kwargs = table1_inputs(3)
    reference = evaluate_table1(model, dictionaries, tokens[:2], tokens, **kwargs)  # full operators
    subprocess.run([*command, str(tmp_path / "fb"), "features"], check=True, env=env, timeout=300, capture_output=True)
    for rank in (0, 1):
        same_evaluation(SignatureEvaluation.load(tmp_path / "fb" / f"rank{rank}"), reference, exact=False)


def test_dictionary_items_folder_release_and_errors(tmp_path, monkeypatch):
    model = tiny_model("gelu_ln")
    sae = topk_sae(model)
    folder = tmp_path / "suite" / "blocks.1.hook_resid_post"
    sae.save_model(folder)
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    release = f"tlql-saes-{model.cfg.model_name}"
    sae.save_model(tmp_path / "cache" / "saes" / release / "blocks.1.hook_resid_post")
    sources = parse_sources(["ffkv", f"{folder},{release}:blocks.1.hook_resid_post"])
    assert [s.kind for s in sources] == ["ffkv", "folder", "pretrained"]
    assert [s.group for s in sources] == ["ffkv", "suite", release]
    loaded = load_sources(sources[:1] + sources[2:], model, [0, 2])
    assert [d.label for d in loaded] == ["ffkv L0", "ffkv L2", "sae L1 blocks.1.hook_resid_post"]
    assert torch.equal(loaded[2].sae.W_enc, sae.W_enc)
    with pytest.raises(InputError, match="more than once"):
        load_sources(sources[1:], model, [0])
    with pytest.raises(InputError, match="is not a SAELens release known here"):
        parse_sources("no-such-release:blocks.1.hook_resid_post")
    with pytest.raises(InputError, match="neither 'ffkv' nor an existing folder"):
        parse_sources("ffkv,/no/such/sae")
    with pytest.raises(InputError, match="could not be loaded"):
        load_sources(parse_sources(f"{release}:blocks.2.hook_resid_post"), model, [0])


@pytest.fixture()
def tiny_cli(monkeypatch, tmp_path):
    """The tiny model (a word tokenizer, prompts as fixed ids) behind ``tlql``; a document corpus on disk."""
    model = tiny_model("gelu_ln")
    model.tokenizer = WordTokenizer(model.cfg.d_vocab)
    monkeypatch.setattr(model, "to_tokens", lambda text, prepend_bos=None: torch.tensor([[1, 2, 3]]))
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(documents(400)) + "\n")
    folder = tmp_path / "suite" / HOOK
    topk_sae(model).save_model(folder)
    return model, corpus, folder


def test_cli_ql_evaluate_scores_ffkv_and_an_sae_folder_side_by_side(tiny_cli, tmp_path, monkeypatch):
    model, _, folder = tiny_cli
    monkeypatch.setattr(
        "tl_query_lens.corpus.load_corpus",
        lambda src, tok, n_seqs, seq_len, split, seed=0: tiny_tokens(model, n_seqs, seq_len, seed=1),
    )
    out = tmp_path / "ql"
    argv = ["ql-evaluate", "--dictionary", "ffkv", "--dictionary", str(folder), "--layers", "1"]
    argv += ["--features-per-layer", "3", "--k", "5", "--n-contexts", "4", "--n-seqs", "24", "--seq-len", "8"]
    argv += ["--op-seqs", "2", "--op-seq-len", "8", "--kl-targets", "0.1", "--n-generate", "3", "--n-steps", "2"]
    argv += [
        "--n-prompts",
        "1",
        "--protocol",
        "paper",
        "--exclude-first-positions",
        "1",
        "--no-wandb",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rows = list(csv.DictReader((out / "ql_evaluate_table1.csv").read_text().splitlines()))
    assert {r["dictionary"] for r in rows} == {"ffkv", "suite"}
    assert {r["n_features"] for r in rows} == {"3"}
    per_feature = list(csv.DictReader((out / "ql_evaluate_per_feature.csv").read_text().splitlines()))
    assert [r["dictionary"] for r in per_feature] == ["ffkv L1"] * 3 + [f"sae L1 {HOOK}"] * 3
    saved = SignatureEvaluation.load(out / "all")
    assert set(Table1Run.load(out).summaries) == {"ffkv", "suite"}  # the run's result, its evaluation in all/
    assert saved.config["feature_selection_by_dictionary"][f"sae L1 {HOOK}"]["rule"] == "active"
    assert saved.config["exclude_first_positions"] == 1
    # each dictionary's part was kept under <out>/parts; a rerun loads both and writes the same table
    parts = sorted((out / "parts").iterdir())
    assert len(parts) == 2 and [SignatureEvaluation.load(p).features.numel() for p in parts] == [3, 3]
    first = (out / "ql_evaluate_table1.csv").read_text()
    monkeypatch.setattr("tl_query_lens.query_lens.table1.evaluate_signatures", lambda *a, **k: 1 / 0)
    assert main(argv) == 0 and (out / "ql_evaluate_table1.csv").read_text() == first


def test_cli_certify_paper_protocol_on_a_topk_sae(tiny_cli, tmp_path):
    _, corpus, folder = tiny_cli
    out = tmp_path / "cert"
    argv = ["certify", "--protocol", "paper", "--dictionary", f"ffkv,{folder}", "--layers", "1", "--shuffle"]
    argv += ["--n-cal", "6", "--seq-len", "8", "--k", "4", "--bins", "8", "--corpus", str(corpus)]
    assert main([*argv, "--no-wandb", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "certify_certificates_paper_protocol.csv").read_text().splitlines()))
    assert [r["label"] for r in rows] == ["ffkv L1", f"sae L1 {HOOK}"]
    for r in rows:
        assert float(r["bound_occam"]) >= float(r["bound"]) and int(r["m"]) > 0
        assert "shuffled_abs_gap_mean" in r
    assert int(rows[1]["m"]) == 48


@torch.no_grad()
def test_autocast_runs_the_protocol_passes_in_bf16_and_keeps_float32_results():
    """``autocast=True``: the max-activating search runs its matrix products in bf16 (its activations differ from
    the fp32 search by bf16 rounding, not by more), and every float of the result stays float32."""
    model = tiny_model("gated_rms")
    sae = topk_sae(model)
    tokens = tiny_tokens(model, n_seqs=24, seq_len=8, seed=1)
    fp32 = max_activating_contexts(model, sae, tokens, n_contexts=4)
    from tl_query_lens.precision import model_passes

    with model_passes(model, True):
        bf16 = max_activating_contexts(model, sae, tokens, n_contexts=4)
    with model_passes(model, False):
        again = max_activating_contexts(model, sae, tokens, n_contexts=4)
    assert torch.equal(again.activation, fp32.activation)  # off: the fp32 search, bit for bit
    top = fp32.activation[:, 0].abs().max()
    gap = (bf16.activation[:, 0] - fp32.activation[:, 0]).abs().max()
    assert 0 < gap < 0.05 * top  # bf16 products: changed, within a few bf16 ulps of the largest activation
    res = evaluate_table1(
        model,
        {"sae L1 topk": sae},
        tokens[:2],
        tokens,
        tokenizer=ListTokenizer(model.cfg.d_vocab),
        prompt_tokens=[torch.tensor([1, 2, 3])],
        features_per_layer=3,
        autocast=True,
        **SMALL,
    )
    assert res.config["autocast"] is True
    for name in ("input_scores", "output_scores", "alphas", "search_kl", "achieved_kl"):
        assert getattr(res, name).dtype == torch.float32, name
