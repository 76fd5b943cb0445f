"""The long-run benchmark scripts on tiny settings: resumable cells (command, wall time, peak memory), the Table-1
sweep and the large-N certification on a tiny model, and the readout fit-spread table."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tl_query_lens
from tests.helpers import tiny_model
from tests.test_certify_protocol import documents
from tests.test_table1_saes import WordTokenizer
from tl_query_lens.errors import InputError

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


CELL_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import _cells
out, name = Path(sys.argv[-1]), sys.argv[sys.argv.index("--run-cell") + 1]
with open(out / "runs.log", "a") as log:
    log.write(name + "\\n")
if name == "bad" and not (out / "fixed").exists():
    sys.exit(3)
def compute(folder):
    block = bytearray(64 * 2**20)  # 64 MiB touched: the peak RSS must show it
    block[::4096] = b"x" * len(block[::4096])
    return {{"square": int(name[1:]) ** 2 if name != "bad" else -1}}
_cells.record_cell(out, name, {{"cell": name}}, compute)
"""


def test_cells_run_in_their_own_process_record_and_resume(tmp_path):
    cells = load("_cells")
    script = tmp_path / "cell_script.py"
    script.write_text(CELL_SCRIPT.format(bench=str(BENCH)))
    out = tmp_path / "out"  # run_cells creates it
    logs: list[str] = []
    failed = cells.run_cells(script, out, ["c2", "bad", "c3"], [str(out)], log=logs.append)
    assert failed == ["bad"]
    done = cells.load_cells(out)
    assert list(done) == ["c2", "c3"]
    assert done["c3"]["result"] == {"square": 9} and done["c3"]["settings"] == {"cell": "c3"}
    for record in done.values():
        assert record["wall_s"] > 0 and record["peak_rss_mb"] > 64
        # the command names no path of this machine: the script outside the repository as results/<its name>
        assert "--run-cell" in record["command"] and f"results/{script.name}" in record["command"]
        assert str(tmp_path) not in record["command"] and record["command"].startswith("python ")
        assert len(record["loadavg_start"]) == 3 and record["torch_threads"] >= 1
    (out / "fixed").touch()
    assert cells.run_cells(script, out, ["c2", "bad", "c3"], [str(out)], log=logs.append) == []
    # The second run only ran the cell that had failed.
    assert (out / "runs.log").read_text().split() == ["c2", "bad", "c3", "bad"]
    assert json.loads((out / "run.json").read_text())["command"]


RANK_SCRIPT = """
import os, sys
from pathlib import Path
import torch.distributed as dist
sys.path.insert(0, {bench!r})
import _cells
out, name = Path(sys.argv[-1]), sys.argv[sys.argv.index("--run-cell") + 1]
dist.init_process_group("gloo")
rank = dist.get_rank()
def compute(folder):
    block = bytearray((64 + 64 * rank) * 2**20)  # rank 1 touches 128 MiB, rank 0 64 MiB
    block[::4096] = b"x" * len(block[::4096])
    (folder / f"rank{{rank}}").touch()
    return {{"rank": rank}}
_cells.record_cell(out, name, {{}}, compute)
dist.destroy_process_group()
"""


@pytest.mark.distributed
@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_a_cell_under_torchrun_is_recorded_once_with_every_rank_memory(tmp_path, monkeypatch):
    cells = load("_cells")
    script = tmp_path / "rank_script.py"
    script.write_text(RANK_SCRIPT.format(bench=str(BENCH)))
    out = tmp_path / "out"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the script's own options reach it past torchrun's parser (table1_sweep.py forwards --ranks N)
    assert cells.run_cells(script, out, ["c1"], ["--ranks", "2", str(out)], nproc=2, log=lambda _: None) == []
    record = cells.load_cells(out)["c1"]
    assert record["result"] == {"rank": 0}  # rank 0 wrote it
    assert sorted(p.name for p in (out / "cells" / "c1").iterdir()) == ["cell.json", "rank0", "rank1"]
    assert record["ranks"] == 2 and "-m torch.distributed.run --standalone --nproc_per_node=2" in record["command"]
    low, high = record["peak_rss_mb_by_rank"]
    assert high - low > 48 and record["peak_rss_mb"] == high  # each rank's own peak; the record keeps the largest


@pytest.fixture()
def word_model(monkeypatch):
    model = tiny_model("gelu_ln")
    model.tokenizer = WordTokenizer(model.cfg.d_vocab)
    monkeypatch.setattr(model, "to_tokens", lambda text, prepend_bos=None: torch.tensor([[1, 2, 3]]))
    return model


def overlap_by_sets(ev, ref) -> list[str]:
    """Reference for the sweep's signature tables: per method, the mean Jaccard of the two cells' top-k id sets
    (padding ids < 0 left out) and how many input scores differ, formatted as the report prints them."""
    cells = []
    for m, method in enumerate(ref.methods):
        e = ev.methods.index(method)
        sims = []
        for a, b in zip(ev.signature_ids[e].tolist(), ref.signature_ids[m].tolist(), strict=True):
            sa, sb = {t for t in a if t >= 0}, {t for t in b if t >= 0}
            sims.append(len(sa & sb) / len(sa | sb))
        changed = sum(x != y for x, y in zip(ev.input_scores[e].tolist(), ref.input_scores[m].tolist(), strict=True))
        cells.append(f"{sum(sims) / len(sims):.2f} ({changed})")
    return cells


def test_table1_sweep_cell_and_report_on_a_tiny_model(word_model, tmp_path):
    sweep = load("table1_sweep")
    cells = load("_cells")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(documents(400)) + "\n")
    tiny = sweep.SweepSettings(
        maxact_corpus=str(corpus),
        maxact_seqs=24,
        op_corpus=str(corpus),
        op_seqs=2,
        seq_len=8,
        n_prompts=1,
        n_generate=3,
        dictionary="ffkv",
        layers=(1,),
        features_per_layer=3,
        n_contexts=4,
        k=5,
        kl_targets=(0.1,),
        n_steps=2,
        exclude_first_positions=0,
        extra={"baselines": ()},
    )
    out = tmp_path / "sweep"
    bf16 = sweep.dataclasses.replace(tiny, sweep_dtype="bfloat16", sweep_autocast=True)
    for name, settings in (
        ("base", tiny),
        ("ops-512", sweep.dataclasses.replace(tiny, op_seqs=4)),
        ("base-bf16", bf16),
        ("base-features", sweep.dataclasses.replace(tiny, basis="features")),
        ("ops-4096", sweep.dataclasses.replace(tiny, op_seqs=8, basis="features")),
    ):
        cells.record_cell(out, name, {}, lambda f, s=settings: sweep.compute_cell(s, f, model=word_model))
    record = cells.load_cells(out)["base"]
    assert record["result"]["maxact_tokens"] == 24 * 8 and record["result"]["op_tokens"] == 2 * 8
    from tl_query_lens.query_lens.evaluation import SignatureEvaluation

    saved = SignatureEvaluation.load(out / "cells" / "base" / "evaluation")
    for m, method in enumerate(saved.methods):
        row = next(r for r in record["result"]["rows"] if r["method"] == method)
        assert row["input"] == pytest.approx(100 * saved.input_scores[m].double().mean().item())
        assert row["input_lo"] <= row["input"] <= row["input_hi"]
    text = sweep.report(out)
    assert text.splitlines()[2].startswith("| base | 192 | 1 × 3 | 16 |")
    assert "| ops-512 |" in text and "| 32 |" in text
    svg = (out / "plot_ops.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<circle") == 3 * 2 * len(sweep.METHODS)  # 3 cells × in/out
    assert (out / "plot_maxact.svg").exists()
    # Signatures against base's: ops-512 scores base's features; reference by sets, feature by feature.
    other = SignatureEvaluation.load(out / "cells" / "ops-512" / "evaluation")
    assert other.features.tolist() == saved.features.tolist()
    table = text.split("Signatures against base's")[1]
    row = next(line for line in table.splitlines() if line.startswith("| ops-512 |")).strip("| ").split(" | ")[1:]
    assert row == overlap_by_sets(other, saved)
    # and between successive operator corpora: ops-4096 against ops-512
    successive = text.split("Signatures between successive operator corpora")[1]
    pair = next(line for line in successive.splitlines() if line.startswith("| ops-4096 against ops-512 |"))
    larger = SignatureEvaluation.load(out / "cells" / "ops-4096" / "evaluation")
    assert pair.strip("| ").split(" | ")[1:] == overlap_by_sets(larger, other)
    ll_key = saved.methods.index("LL_KEY")  # the logit lens does not read the operators: a control
    assert row[ll_key] == "1.00 (0)"
    # bf16 operator sweeps: operators swept under autocast, and only the operator-reading methods can differ
    from tl_query_lens.operators import OperatorSet

    files = list((out / "cells" / "base-bf16" / "operators").rglob("*.safetensors"))
    assert files and {OperatorSet.load(f).dtype for f in files} == {"bfloat16-autocast"}
    bf16_row = next(line for line in table.splitlines() if line.startswith("| base-bf16 |")).strip("| ").split(" | ")
    assert bf16_row[1 + ll_key] == "1.00 (0)"
    assert (out / "plot_ops_bf16.svg").exists()
    # the feature basis: base's signatures and scores from the sampled directions only
    features_row = next(line for line in table.splitlines() if line.startswith("| base-features |"))
    assert features_row.strip("| ").split(" | ")[1:] == ["1.00 (0)"] * len(saved.methods)
    assert SignatureEvaluation.load(out / "cells" / "base-features" / "evaluation").config["basis"] == "features"
    # Paired score changes: the mean per-feature difference, against a plain mean of the saved scores' differences.
    change = text.split("Score change on the same features, paired")[1].splitlines()
    for label, ev, ref in (("ops-512", other, saved), ("ops-4096 against ops-512", larger, other)):
        row = next(line for line in change if line.startswith(f"| {label} |")).strip("| ").split(" | ")[1:]
        for m, method in enumerate(ref.methods):
            e = ev.methods.index(method)
            for side, (a, b) in enumerate(
                ((ev.input_scores[e], ref.input_scores[m]), (ev.output_scores[e, 0], ref.output_scores[m, 0]))
            ):
                diffs = [100 * (x - y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
                mean, lo, hi = (float(v) for v in re.findall(r"[-+]\d+\.\d+", row[m].split(" / ")[side]))
                assert mean == pytest.approx(sum(diffs) / len(diffs), abs=0.006)
                assert min(diffs) - 0.006 <= lo <= mean <= hi <= max(diffs) + 0.006
    zero = "+0.00 [+0.00, +0.00] / +0.00 [+0.00, +0.00]"
    features_change = next(line for line in change if line.startswith("| base-features |"))
    assert features_change.strip("| ").split(" | ")[1:] == [zero] * len(saved.methods)
    # A report on another machine: only ops-512 re-measured there, base read from the first report's records.
    other_out = tmp_path / "elsewhere"
    shutil.copytree(out / "cells" / "ops-512", other_out / "cells" / "ops-512")
    records = tmp_path / "table1_sweep.json"
    shutil.copy(out / "table1_sweep.json", records)
    again = sweep.report(other_out, records)
    assert again.splitlines()[:5] == text.splitlines()[:5]  # the same rows, base's from the records
    assert (
        f"Read from results/{records.name} (measured earlier, not under results/elsewhere)" in again
        and again.rstrip().endswith(": base, ops-4096, base-bf16, base-features")
    )
    assert "Signatures against base's" not in again  # base's saved evaluation is not on that machine
    assert json.loads((other_out / "table1_sweep.json").read_text())["base"]["records_file"] == str(records)
    with pytest.raises(SystemExit, match="no such file"):
        sweep.report(other_out, tmp_path / "missing.json")
    # records measured under other options are refused, not mixed in
    assert sweep.report(other_out, records, base=tiny) == again  # the test's records carry no settings
    measured = json.loads(records.read_text())
    measured["base"]["settings"] = json.loads(json.dumps(sweep.asdict(sweep.dataclasses.replace(tiny, k=7))))
    records.write_text(json.dumps(measured))
    with pytest.raises(SystemExit, match=r"cell base was measured with other settings \(k: 7 there, 5 here\)"):
        sweep.report(other_out, records, base=tiny)


def test_sweep_prompts_and_the_broad_check(tmp_path, monkeypatch):
    sweep = load("table1_sweep")
    from tl_query_lens.query_lens.config import NEUTRAL_PROMPTS

    prompts = sweep.sweep_prompts(100)
    assert len(set(prompts)) == 100 and prompts[: len(NEUTRAL_PROMPTS)] == tuple(NEUTRAL_PROMPTS)
    assert sweep.sweep_prompts(20) == prompts[:20]
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    base = sweep.SweepSettings()
    sweep.check_settings([sweep.cell_settings("base", base)])  # the base cell does not need the broad corpus
    with pytest.raises(InputError, match="setup.sh --broad-corpus"):
        sweep.check_settings([sweep.cell_settings("maxact-broad-4k", base)])
    certify = load("certify_large_n")
    with pytest.raises(InputError, match="setup.sh --broad-corpus"):
        certify.main(["--out", str(tmp_path / "c"), "--cells", "ffkv-N5000-cal512"])
    assert not (tmp_path / "c" / "cells").exists()  # refused before any cell ran


def test_certify_large_n_cell_on_a_tiny_model(word_model, tmp_path, monkeypatch):
    certify = load("certify_large_n")
    monkeypatch.setattr(certify, "PREFIXES", (10, 40))  # the report's rows at smaller N (40 > N: none)
    cells = load("_cells")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(documents(400)) + "\n")
    tiny = certify.CertifySettings(
        dictionary="ffkv",
        layers=(1,),
        corpus=str(corpus),
        n_eval=20,
        n_cal=6,
        pool_sizes=(3,),  # the pool-size curve: one more row, the pool of the first 3 calibration windows
        seq_len=8,
        k=4,
        exclude_first_positions=0,
    )
    out = tmp_path / "cert"
    cells.record_cell(out, "ffkv-N5000-cal512", {}, lambda f: certify.compute_cell(tiny, f, model=word_model))
    record = cells.load_cells(out)["ffkv-N5000-cal512"]
    row, curve = record["result"]["rows"]
    assert row["N"] == 20 and record["result"]["n_cal"] == 6 and (row["n_cal"], row["cal_tokens"]) == (6, 48)
    assert record["result"]["labels"] == ["ffkv L1", "ffkv L1 n_cal=3"] and curve["n_cal"] == 3 and curve["N"] == 20
    from tl_query_lens.certify.protocol import ProtocolCertification

    saved = ProtocolCertification.load(out / "cells" / "ffkv-N5000-cal512" / "certification")
    assert saved.rows[0]["bound_occam"] == pytest.approx(row["bound_occam"])
    text = certify.report(out)
    lines = text.splitlines()
    assert len(lines) == 6 and lines[2].startswith("| ffkv-N5000-cal512 | ffkv L1 | 20 | 6 (48) |")
    assert lines[3].startswith("| ffkv-N5000-cal512 | ffkv L1 n_cal=3 | 20 | 3 (24) |")
    assert ("| yes |" in lines[2]) == (row["bound_occam"] < row["baseline_bits"])
    # The N = 10 row: the first 10 windows' losses (mean clean loss checked against the saved per-window losses).
    assert lines[4].startswith("| ffkv-N5000-cal512@N10 | ffkv L1 | 10 | 6 (48) |") and lines[4].endswith("| prefix |")
    first = saved.sweep.certificates["ffkv L1"]
    assert saved.at_n(10).rows[0]["R_hat_clean"] == pytest.approx(first.loss_clean[:10].double().mean().item())
    # Rebuilt elsewhere from the records alone (no certification folder there): the same rows, the prefix row too.
    records = tmp_path / "certify_large_n.json"
    shutil.copy(out / "certify_large_n.json", records)
    again = certify.report(tmp_path / "elsewhere", records).splitlines()
    assert again[:6] == lines and again[-1].endswith(": ffkv-N5000-cal512")


def test_readout_fit_spread_table_is_mean_and_range(tmp_path):
    spread = load("readout_fit_spread")
    cells = load("_cells")
    out = tmp_path / "spread"
    values = {"s0-t1": (0.70, 73), "s0-t2": (0.72, 77), "s1-t1": (0.69, 75)}
    dominant = {
        "s0-t1": torch.tensor([[1, 2], [3, 4]]),
        "s0-t2": torch.tensor([[1, 2], [3, 5]]),
        "s1-t1": torch.tensor([[9, 9], [9, 9]]),
    }
    for name, (cov, passes) in values.items():

        def compute(folder, cov=cov, passes=passes, name=name):
            torch.save({"dominant_a": dominant[name], "dominant_b": dominant[name] + 1}, folder / "dominant.pt")
            return {"coverage": cov, "cross_lens_pass": passes, "row_ev": 0.723}

        cells.record_cell(out, name, {}, compute)
    text = spread.summarise(out, list(values))
    cov_line = next(line for line in text.splitlines() if line.startswith("| coverage"))
    covs = [v[0] for v in values.values()]
    assert cov_line.endswith(f"| {statistics.fmean(covs):.3f} | {min(covs):.3f} – {max(covs):.3f} |")
    assert "| cross-lens agreement (prompts of 80) | 73 | 77 | 75 | 75 | 73 – 77 |" in text
    # Only the same-seed pair is compared: 3 of 4 dominant features agree in each lens.
    assert "s0-t1 vs s0-t2: 6 of 8" in text and "s1-t1" not in text.split("\n\n")[-1]
    assert spread.parse_cell("s12-t2") == (12, 2)
    with pytest.raises(SystemExit, match="s<seed>-t<threads>"):
        spread.parse_cell("seed0")


@pytest.mark.slow
def test_readout_fit_spread_cell_on_the_embedded_model(tmp_path):
    """One 3-step fit of the embedded model scored end to end (about 3 minutes on 2 idle cores)."""
    out = tmp_path / "spread"
    cmd = [sys.executable, str(BENCH / "readout_fit_spread.py"), "--out", str(out), "--cells", "s0-t1", "--steps", "3"]
    subprocess.run(cmd, check=True, cwd=Path(tl_query_lens.__file__).resolve().parents[1])
    record = json.loads((out / "cells" / "s0-t1" / "cell.json").read_text())
    result = record["result"]
    assert result["steps"] == 3 and result["provenance"]["torch_threads"] == 1
    assert 0 <= result["cross_lens_pass"] <= result["cross_lens_n"] == 80
    assert 0 <= result["coverage"] <= 1 and record["peak_rss_mb"] > 100
