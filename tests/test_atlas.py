"""Feature atlas on tiny models: contexts, statistics and signatures against independent references, resuming, an
added dictionary, transcoder links, readout tokens, the circuit-tracer cards' schema, bad input, and 2 torchrun ranks = 1 rank."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sae_lens import SAE, StandardSAE, StandardSAEConfig
from sae_lens.saes.sae import SAEMetadata

from tests.helpers import tiny_model, tiny_readout, tiny_tokens
from tl_query_lens import FFKV
from tl_query_lens.atlas import AtlasConfig, build_atlas
from tl_query_lens.atlas.cards import cantor
from tl_query_lens.atlas.collect import HIST_EDGES
from tl_query_lens.errors import InputError

SEQ = 16


def _cfg(out, **kw):
    base = {
        "out": out,
        "dictionary": ("ffkv:1",),
        "n_tokens": 40 * SEQ,
        "seq_len": SEQ,
        "shard_size": 32,
        "band_sample": 8,
    }
    return AtlasConfig(**{**base, **kw})


def _build(model, cfg, **kw):
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=SEQ)
    ops = tiny_tokens(model, n_seqs=2, seq_len=8, seed=1)
    return build_atlas(model, None, cfg, tokens=tokens, operator_tokens=ops, progress=False, **kw), tokens, ops


def _features(out: Path, slug: str) -> dict[int, dict]:
    found = {}
    for path in sorted((out / "shards" / slug).glob("*.json")):
        shard = json.loads(path.read_text())
        for f in shard["features"]:
            found[f["i"]] = (f, shard["strings"])
    return found


def _files(root: Path) -> dict[str, bytes]:
    skip = ("result/", "wandb", "operators/")  # the operator cache: grouped by each rank's sweeps
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith(skip)
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = tiny_model("gelu_ln")
    out = tmp_path_factory.mktemp("atlas")
    cfg = _cfg(out)
    result, tokens, ops = _build(model, cfg)
    return model, cfg, result, tokens, ops


def test_contexts_density_and_histogram_match_a_direct_pass(built):
    model, cfg, result, tokens, _ = built
    sae = FFKV.from_model(model, 1)
    _, cache = model.run_with_cache(tokens, names_filter=[sae.cfg.metadata.hook_name])
    acts = sae.encode(cache[sae.cfg.metadata.hook_name]).detach()[:, cfg.exclude_first_positions :]  # [seq, pos, F]
    per_seq = acts.amax(1)  # [seq, F]
    features = _features(Path(cfg.out), "1-ffkv")
    assert sorted(features) == list(range(64)) and result.n_features == 64
    for i, (f, strings) in features.items():
        fires = int((acts[..., i] > 0).sum())
        assert f["fires"] == fires
        assert f["density"] == pytest.approx(fires / acts[..., i].numel(), rel=1e-3)
        assert sum(f["hist"]["counts"]) == fires
        negative = acts[..., i][acts[..., i] < 0].abs()  # GELU neurons are signed: their negative side, by magnitude
        reference = torch.histogram(negative.clamp(1e-3, 1e3).float(), bins=HIST_EDGES).hist.long().tolist()
        neg = f["hist"].get("neg", {"counts": []})
        assert sum(neg["counts"]) == negative.numel()
        if neg["counts"]:
            first = next(j for j, c in enumerate(reference) if c)
            assert reference[first : first + len(neg["counts"])] == neg["counts"]
        order = torch.sort(per_seq[:, i], descending=True, stable=True)
        expected = [(int(s), float(v)) for v, s in zip(order.values, order.indices) if v > 0][: cfg.n_top]
        assert [c["s"] for c in f["top"]] == [s for s, _ in expected]
        assert [c["v"] for c in f["top"]] == pytest.approx([v for _, v in expected], rel=1e-3, abs=1e-6)
        for c in f["top"]:  # the window shows the corpus tokens, its peak is the max token
            assert [strings[t] for t in c["t"]] == [
                str(t) for t in tokens[c["s"], c["o"] : c["o"] + len(c["t"])].tolist()
            ]
            peak = float(acts[c["s"], c["o"] + c["m"] - cfg.exclude_first_positions, i])  # the max, up to fp16 ties
            assert peak >= float(acts[c["s"], :, i].max()) * (1 - 1e-3)
        band_max = [c["v"] for b in f["bands"] for c in b["ex"]]
        assert all(0 < v <= f["max"] * 1.002 for v in band_max)  # fp16-stored windows
        assert [b["hi"] for b in f["bands"]] == sorted([b["hi"] for b in f["bands"]], reverse=True)


def test_signatures_match_the_per_feature_reference(built):
    from tl_query_lens.query_lens.reference import clean_stream, query_lens_reference, value_direction

    model, cfg, _, _, ops = built
    sae = FFKV.from_model(model, 1)
    features = _features(Path(cfg.out), "1-ffkv")
    stream = clean_stream(model, ops)
    mask = torch.ones(ops.shape)
    for i in (3, 40):
        f, strings = features[i]
        full = query_lens_reference(model, ops, sae, i, "value", method="full")
        assert [int(strings[s]) for s, _ in f["sig"]["QL_VALUE"]["top"]] == full.topk(cfg.k_tokens).indices.tolist()
        key = query_lens_reference(model, ops, sae, i, "key")
        assert [int(strings[s]) for s, _ in f["sig"]["QL_KEY"]["top"]] == key.topk(cfg.k_tokens).indices.tolist()
        v = sae.W_dec[i].detach()
        indirect = value_direction(model, stream, "blocks.1.hook_resid_post", v, mask, "full") - v
        scores = model.ln_final(indirect[None, None])[0, 0] @ model.W_U
        assert [int(strings[s]) for s, _ in f["sig"]["QL_INDIRECT"]["top"]] == scores.topk(
            cfg.k_tokens
        ).indices.tolist()
        ll = model.ln_final(v[None, None])[0, 0] @ model.W_U
        assert [int(strings[s]) for s, _ in f["sig"]["LL_VALUE"]["bottom"]] == (-ll).topk(cfg.k_tokens).indices.tolist()
        shares = [s for _, s in f["shares"]]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert [n for n, _ in f["shares"]] == ["direct", "blocks.2.attn", "blocks.2.mlp"]


def test_rerun_reuses_every_shard_and_redoes_a_missing_one(built, tmp_path):
    model, cfg, _, _, _ = built
    before = _files(Path(cfg.out))
    again, _, _ = _build(model, cfg)
    assert (again.shards_built, again.shards_reused) == (0, 2)
    (Path(cfg.out) / "data" / "1-ffkv" / "32.js").unlink()
    redo, _, _ = _build(model, cfg)
    assert (redo.shards_built, redo.shards_reused) == (1, 1)
    assert _files(Path(cfg.out)) == before


def test_an_added_dictionary_is_built_alone_and_the_index_lists_both(built, tmp_path):
    model, cfg, _, _, _ = built
    out = tmp_path / "atlas"
    shutil.copytree(cfg.out, out)
    more = _cfg(out, dictionary=("ffkv:1", "ffkv:2"))
    result, _, _ = _build(model, more)
    assert (result.shards_built, result.shards_reused) == (2, 2)
    index = (out / "data" / "index.js").read_text()
    assert index.startswith("ATLAS.index(") and '"slug":"2-ffkv"' in index and '"slug":"1-ffkv"' in index


def test_an_added_dictionary_sweeps_no_operator_and_rewrites_no_other_export(tmp_path, monkeypatch):
    """A dictionary added at hooks the atlas already swept reads its operators from the atlas's operator cache (a
    subset of the all-layer sweep), and the exports of the dictionaries already there are not written again."""
    from tl_query_lens.operators import engine

    model = tiny_model("gelu_ln")
    out = tmp_path / "atlas"
    _build(model, _cfg(out, dictionary=("ffkv:1", "ffkv:2")))
    assert list((out / "operators").glob("*.safetensors"))
    kept = sorted((out / "exports" / "circuit-tracer").rglob("*.json"))
    kept += sorted((out / "exports" / "neuronpedia" / "v1").rglob("*.gz"))
    mtimes = {p: p.stat().st_mtime_ns for p in kept}

    def boom(*args, **kwargs):
        raise AssertionError("an operator the atlas holds was swept again")

    monkeypatch.setattr(engine, "_run_sweep", boom)
    result, _, _ = _build(model, _cfg(out, dictionary=("ffkv:1", "ffkv:2", "ffkv:1:topk:4")))
    assert (result.shards_built, result.shards_reused) == (2, 4)
    assert {p: p.stat().st_mtime_ns for p in kept} == mtimes
    (added,) = [d["slug"] for d in result.dictionaries if d["slug"] not in ("1-ffkv", "2-ffkv")]
    cards = [p for p in (out / "exports" / "circuit-tracer" / added.split("-", 1)[1]).glob("*.json")]
    assert len(cards) == 64 and list((out / "exports" / "neuronpedia" / "v1").glob(f"*/{added}/features/*.gz"))
    for slug in ("1-ffkv", "2-ffkv", added):
        source = json.loads((out / "exports" / "neuronpedia" / "v1" / "custom" / slug / "source.jsonl").read_text())
        assert source["id"] == slug


def test_quality_row_matches_the_splice_metrics(tmp_path):
    from tl_query_lens.dictionaries.splice import splice_metrics

    model = tiny_model("gelu_ln")
    torch.manual_seed(1)
    sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=48, metadata=SAEMetadata(hook_name="blocks.1.hook_resid_post")))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    sae.save_model(tmp_path / "sae")
    cfg = _cfg(tmp_path / "atlas", dictionary=(str(tmp_path / "sae"),), signatures=False, exports=False)
    _, tokens, _ = _build(model, cfg)
    from tl_query_lens.atlas import DictionaryQuality

    row = DictionaryQuality.load(tmp_path / "atlas" / "results" / "1-sae")
    ref = splice_metrics(model, SAE.load_from_disk(tmp_path / "sae"), tokens, exclude_first_positions=1)
    assert row.explained_variance == pytest.approx(ref.explained_variance, rel=1e-3)
    assert row.l0 == pytest.approx(ref.mean_l0, rel=1e-4)
    assert row.alive == pytest.approx(ref.alive_rate, rel=1e-4)
    page = (tmp_path / "atlas" / "data" / "index.js").read_text()
    assert "explained variance" in page and "Dictionary quality" in page  # the page reads the result's scalars()


def test_transcoder_neuron_links_are_the_best_cosines(tmp_path):
    from tl_query_lens.saes.transcoder import TopKTrainingTranscoder, TopKTrainingTranscoderConfig

    model = tiny_model("gelu_ln")
    torch.manual_seed(0)
    tc = TopKTrainingTranscoder(TopKTrainingTranscoderConfig(d_in=32, d_out=32, d_sae=40, k=6))
    tc.cfg.metadata.hook_name, tc.cfg.metadata.hook_name_out = "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"
    tc.save_inference_model(tmp_path / "tc")
    loaded = SAE.load_from_disk(tmp_path / "tc")
    cfg = _cfg(tmp_path / "atlas", dictionary=("ffkv:1", str(tmp_path / "tc")), n_links=3, signatures=False)
    _build(model, cfg)
    W_out = model.blocks[1].mlp.W_out.detach()
    cos = torch.nn.functional.normalize(loaded.W_dec.detach(), dim=1) @ torch.nn.functional.normalize(W_out, dim=1).T
    tc_features = _features(tmp_path / "atlas", "1-tc")
    for i in (0, 17, 39):
        f, _ = tc_features[i]
        assert [link[1] for link in f["links"]] == cos[i].topk(3).indices.tolist()
        assert all(link[0] == "1-ffkv" for link in f["links"])
    neurons = _features(tmp_path / "atlas", "1-ffkv")
    for j in (0, 50):
        f, _ = neurons[j]
        assert [link[1] for link in f["links"]] == cos[:, j].topk(3).indices.tolist()


def test_readout_features_list_the_rows_with_the_largest_codes(tmp_path):
    model = tiny_model("gelu_ln")
    sae = tiny_readout(model, d_sae=64)
    sae.save_model(tmp_path / "readout")
    cfg = _cfg(tmp_path / "atlas", dictionary=(str(tmp_path / "readout"),), n_links=4, signatures=False)
    _build(model, cfg)
    slug = next(p.name for p in (tmp_path / "atlas" / "shards").iterdir())
    features = _features(tmp_path / "atlas", slug)
    codes = torch.zeros(sae.cfg.d_sae, model.cfg.d_vocab)
    for t in range(model.cfg.d_vocab):
        for f, v in zip(sae.code_indices[t].tolist(), sae.code_values[t].tolist()):
            codes[f, t] = v
    for i in (0, 9, 63):
        f, strings = features[i]
        want = [t for t in codes[i].topk(4).indices.tolist() if codes[i, t] > 0]
        assert [int(strings[s]) for s, _ in f.get("readout", [])] == want


def test_a_readout_dictionary_with_all_its_features_gets_the_signatures_its_hook_allows(tmp_path):
    """A readout SAE reads ln_final.hook_normalized: no value operator or module shares start there. With every
    feature asked for (the full operators), the build once stopped in the operator precompute; now the key and the
    logit-lens signatures are built and the others are listed as not available, with the engine's reason."""
    model = tiny_model("gelu_ln")
    sae = tiny_readout(model, d_sae=64)
    assert sae.cfg.d_sae >= model.cfg.d_model  # the identity basis: full operators
    sae.save_model(tmp_path / "readout")
    cfg = _cfg(tmp_path / "atlas", dictionary=(str(tmp_path / "readout"),), n_links=4)
    _build(model, cfg)
    slug = next(p.name for p in (tmp_path / "atlas" / "shards").iterdir())
    features = _features(tmp_path / "atlas", slug)
    assert sorted(features) == list(range(64))
    f, _ = features[5]
    assert {"LL_VALUE", "QL_KEY"} <= set(f["sig"]), f.keys()
    assert "Value operators start at a block hook" in f["sig_missing"]["QL_VALUE"]
    assert "QL_VALUE_1st" in f["sig_missing"]


def test_circuit_tracer_cards_have_the_frontend_schema(built):
    _, cfg, _, _, _ = built
    name = f"{cantor(1, 5)}.json"  # circuit-tracer's feature number of layer 1, feature 5
    card = json.loads((Path(cfg.out) / "exports" / "circuit-tracer" / "ffkv" / name).read_text())
    # circuit-tracer's feature-card model: index, examples_quantiles[{quantile_name, examples[{tokens,
    # tokens_acts_list, train_token_ind, is_repeated_datapoint}]}], top/bottom_logits, act_min/max, quantile_values,
    # histogram, activation_frequency.
    types = {
        "index": int,
        "examples_quantiles": list,
        "top_logits": list,
        "bottom_logits": list,
        "act_min": float,
        "act_max": float,
        "quantile_values": list,
        "histogram": list,
        "activation_frequency": float,
    }
    for key, kind in types.items():
        assert isinstance(card[key], kind), key
    for quantile in card["examples_quantiles"]:
        assert isinstance(quantile["quantile_name"], str)
        for ex in quantile["examples"]:
            assert len(ex["tokens"]) == len(ex["tokens_acts_list"]) and 0 <= ex["train_token_ind"] < len(ex["tokens"])
            assert ex["is_repeated_datapoint"] is False


def test_bad_input_fails_before_the_corpus_pass(tmp_path, monkeypatch):
    from tl_query_lens.atlas import build

    model = tiny_model("gelu_ln")
    monkeypatch.setattr(build, "_forward_pass", lambda *a, **k: pytest.fail("the corpus pass ran"))
    with pytest.raises(InputError, match="neither 'ffkv' nor an existing folder"):
        _build(model, _cfg(tmp_path / "a", dictionary=("no-such-dictionary",)))
    sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=8, metadata=SAEMetadata(hook_name="blocks.7.hook_resid_post")))
    sae.save_model(tmp_path / "deep")
    with pytest.raises(InputError, match="blocks.7.hook_resid_post"):
        _build(model, _cfg(tmp_path / "b", dictionary=(str(tmp_path / "deep"),)))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "manifest.json").write_text(json.dumps({"model": {"name": "gpt2", "n_layers": 12}}))
    (tmp_path / "c" / ".tlql.lock").write_text("")  # an atlas folder tlql wrote holds its marker
    with pytest.raises(InputError, match="another model"):
        _build(model, _cfg(tmp_path / "c"))
    monkeypatch.setattr(build, "free_bytes", lambda out: 1000)
    with pytest.raises(InputError, match="MB are free"):
        _build(model, _cfg(tmp_path / "d"))


def test_a_full_disk_keeps_the_finished_shards_and_a_rerun_resumes(tmp_path, monkeypatch):
    from tl_query_lens.atlas import build

    model = tiny_model("gelu_ln")
    cfg = _cfg(tmp_path / "atlas")
    real = build.write_shard
    calls = []

    def fill_up(out, slug, start, *args):
        calls.append(start)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, slug, start, *args)

    monkeypatch.setattr(build, "write_shard", fill_up)
    with pytest.raises(InputError, match="disk holding .* is full.*kept"):
        _build(model, cfg)
    assert (tmp_path / "atlas" / "data" / "1-ffkv" / "0.js").is_file()
    monkeypatch.setattr(build, "write_shard", real)
    result, _, _ = _build(model, cfg)
    assert (result.shards_built, result.shards_reused) == (1, 1)


def test_cli_refuses_an_unknown_dictionary_and_shows_help(tmp_path, capsys):
    from tl_query_lens.cli import main

    assert main(["atlas", "--dictionary", "nonsense", "--out", str(tmp_path / "x"), "--no-wandb"]) == 2
    assert "nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["atlas", "--help"])
    assert "--quick" in capsys.readouterr().out


def test_cli_builds_the_api_site_in_out_and_presents_the_result_beside_it(tmp_path, monkeypatch, capsys):
    """``tlql atlas`` writes the files the API writes for the same config and windows (the site in --out), and the
    runner's files (result, table, report, config) in <out>/result, not among the site's."""
    from tl_query_lens.atlas import AtlasResult, build
    from tl_query_lens.cli import main

    model = tiny_model("gelu_ln")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        build,
        "load_corpus",
        lambda src, tok, *, n_seqs, seq_len, split, seed: tiny_tokens(model, n_seqs, seq_len, seed),
    )
    sizes = {"n_tokens": 40 * SEQ, "seq_len": SEQ, "shard_size": 32, "band_sample": 8, "operator_seqs": 2}
    out = tmp_path / "cli"
    argv = ["atlas", "--dictionary", "ffkv:1", *(f"--{k.replace('_', '-')}={v}" for k, v in sizes.items())]
    assert main([*argv, "--operator-seq-len", "8", "--no-exports", "--no-wandb", "--out", str(out)]) == 0
    cfg = _cfg(tmp_path / "api", exports=False, operator_seqs=2, operator_seq_len=8)
    tokens, ops = tiny_tokens(model, cfg.n_seqs, SEQ), tiny_tokens(model, 2, 8)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=ops, progress=False)
    cli, api = _files(out), _files(tmp_path / "api")
    assert len(api) > 10 and cli.keys() == api.keys() and [k for k in cli if cli[k] != api[k]] == []
    assert AtlasResult.load(out / "result").n_features == 64
    for name in ("atlas_dictionaries.csv", "atlas.json", "config.json", "report.html"):
        assert (out / "result" / name).is_file() and not (out / name).exists()
    assert f"Atlas of 64 features (1 dictionaries) in {out}: open {out / 'index.html'}" in capsys.readouterr().out


def test_cli_quick_preset_takes_every_option_given_even_a_default():
    """Reference: the quick preset built with the given values as keywords. Before the one runner, an option given
    with its default value under --quick was taken as not given."""
    from tl_query_lens.cli import build_parser, subcommands
    from tl_query_lens.cli.runner import config_of
    from tl_query_lens.commands import COMMANDS

    command = next(c for c in COMMANDS if c.name == "atlas")
    parser = subcommands(build_parser(command="atlas"))["atlas"]
    argv = ["--quick", "--n-tokens", "102400", "--out", "elsewhere"]
    cfg = config_of(command, parser.parse_args(argv))
    assert cfg.atlas == AtlasConfig.preset_quick(n_tokens=102_400, out="elsewhere")
    assert cfg.run.out == "elsewhere" and cfg.run.features == "0-255"


@pytest.mark.distributed
@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_two_torchrun_ranks_write_the_same_files_as_one(tmp_path):
    script = Path(__file__).with_name("distributed_atlas.py")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    for ranks, folder in ((2, "two"), (1, "one")):
        subprocess.run(
            [torchrun, "--nproc_per_node", str(ranks), "--master_port", "29531", str(script), str(tmp_path / folder)],
            check=True,
            env=env,
            timeout=300,
            capture_output=True,
        )
    one, two = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert len(one) > 10 and one.keys() == two.keys()
    assert [k for k in one if one[k] != two[k]] == []


def test_default_lists_the_shipped_suite_under_the_models_own_name(tmp_path, monkeypatch):
    """The embedded model calls itself 'SmolLM2-135M-Instruct'; its releases are named 'tlql-saes-smollm2-135m'. The
    'default' atlas once looked them up under the model's own name, found none and built the FF-KV neurons only.
    An empty user cache: dictionaries a user trained there are listed too, and are not what this test is about."""
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path))
    from tl_query_lens.atlas.dictionaries import expand_specs
    from tl_query_lens.paths import shipped_root

    shipped = sorted(p.parent.name for p in (shipped_root() / "tlql-saes-smollm2-135m").glob("*/cfg.json"))
    assert len(shipped) == 9  # four residual SAEs and four transcoders (layers 6/12/18/24), the layer-28 SAE
    for name in ("SmolLM2-135M-Instruct", "smollm2-135m"):
        sources = expand_specs(("default",), name, [0, 1])
        listed = [(s.location, s.sae_id) for s in sources if s.kind == "pretrained"]
        assert [sid for loc, sid in listed if loc == "tlql-saes-smollm2-135m"] == shipped
        assert ("tlql-readout-smollm2-135m", "small") in listed
        assert sum(s.kind == "ffkv" for s in sources) == 2


def test_estimate_follows_the_first_batch_of_the_corpus_pass_and_counts_its_batches(tmp_path, monkeypatch, caplog):
    """The one-line estimate is logged right after the corpus pass's first batch (timed: no extra batch), and the
    batches it scales by equal the batches the pass encodes (counted by wrapping the dictionary encoder; one
    dictionary, so one call per batch) and the model's forward calls (every one, counted by a hook)."""
    import re

    from tests.helpers import count_forwards
    from tl_query_lens.atlas import build

    estimated_at: list[bool] = []  # per encoded batch: was the estimate already logged?
    real = build.encode

    def counting(d, acts):
        estimated_at.append(any("estimated wall time" in r.getMessage() for r in caplog.records))
        return real(d, acts)

    monkeypatch.setattr(build, "encode", counting)
    model = tiny_model("gelu_ln")
    forwards = count_forwards(model, monkeypatch)
    with caplog.at_level("INFO"):
        _build(model, _cfg(tmp_path / "atlas", n_tokens=13 * SEQ, batch_size=4, signatures=False))
    line = next(r.getMessage() for r in caplog.records if "estimated wall time" in r.getMessage())
    assert estimated_at == [False, True, True, True]  # logged after the first batch, as the second starts
    # a one-token probe of the hooks' sizes (validate_view), then 13 sequences of 16 in batches of 4, and nothing else
    # (no extra timing batch)
    assert forwards == [1, 4 * SEQ, 4 * SEQ, 4 * SEQ, SEQ]
    assert int(re.search(r"\((\d+) forward batches", line).group(1)) == len(estimated_at) and "--n-tokens" in line
