"""Benchmark: fp32 against bf16 on the embedded model, time and accuracy of three default paths in one run.

Each part runs its fp32 reference and its bf16 variant on the same inputs, one after the other, and reports wall and
CPU time (``time.process_time``: all threads of this process) and their ratios:

(a) the operator engine, ``sweep_dtype=None`` (fp32) against ``sweep_dtype="auto"`` resolved to bf16 (autocast):
    the value directions M v (pushed from ``blocks.<layer>.hook_resid_post``) and key gradients Nᵀk (pulled back from
    ``blocks.<layer>.ln2.hook_normalized``) of FF-KV features of that layer, through the feature basis (``--basis
    identity``: from the full d x d operators, which are compared too); accuracy: their relative Frobenius error and
    the top-k Jaccard of the QL_VALUE (top and bottom) and QL_KEY token lists scored in fp32 from each (k = 25: the
    token sets Table 1 scores);
(b) the atlas (``build_atlas``, the quick preset's one FF-KV layer) with its ``CORPUS_PASS_PRECISION = "auto"``
    resolved to fp32 and to bf16: the corpus pass runs the model under bf16 autocast and encodes in fp32; the
    operator sweeps follow ``EngineConfig.sweep_dtype`` (its default in both runs); accuracy: per feature, the
    Jaccard of its top activating contexts (window ids) and of each signature's top tokens;
(c) a certificate (``certify_many``) of one dictionary at a small N with ``CertifyConfig.autocast`` off and on;
    accuracy: the difference of the fixed-pool bound U and of the Occam bound, in bits (and of R̂, ε̂, η̂, P).

Stated tolerances: operator relative error ≤ 1e-2, Jaccard ≥ 0.95 (mean over features), bound difference ≤ 0.05
bits. ``--json`` writes the record (settings, results, the command relative to the repository, wall and CPU time,
load average at start and end, peak RSS, threads, nice, detected CPU bf16 flags)::

    nice -n 10 python benchmarks/bench_bf16.py --json docs/benchmarks/bf16.json

The bf16 runs set ``TLQL_PRECISION=bfloat16`` and the fp32 runs ``TLQL_PRECISION=float32`` (tl_query_lens/precision.py),
so every ``"auto"`` default inside them takes the precision under test whatever this machine's units.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

TOLERANCES = {"operator_rel_error": 1e-2, "jaccard": 0.95, "bound_bits": 0.05}


@contextlib.contextmanager
def precision_env(value: str) -> Iterator[None]:
    old = os.environ.get("TLQL_PRECISION")
    os.environ["TLQL_PRECISION"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["TLQL_PRECISION"]
        else:
            os.environ["TLQL_PRECISION"] = old


def timed(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}


def ratios(fp32: dict[str, float], bf16: dict[str, float]) -> dict[str, float]:
    """fp32 time / bf16 time (> 1: bf16 is faster)."""
    return {f"{k}_fp32_over_bf16": round(fp32[k] / max(bf16[k], 1e-9), 3) for k in ("wall_s", "cpu_s")}


def jaccard(a: list, b: list) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": round(sum(values) / len(values), 4), "min": round(min(values), 4), "n": len(values)}


def part_operators(model, args) -> dict[str, Any]:
    from tl_query_lens import FFKV, QueryLens, load_corpus
    from tl_query_lens.operators import EngineConfig
    from tl_query_lens.primitives import row_jaccard

    tokens = load_corpus("embedded", model, n_seqs=args.op_seqs, seq_len=args.op_seq_len, split="train", seed=0)
    ffkv = FFKV.from_model(model, args.layer, "topk", k=32)
    features = list(range(args.features))
    runs: dict[str, Any] = {}
    for label, env, dtype in (("fp32", "float32", None), ("bf16", "bfloat16", "auto")):
        engine = EngineConfig(chunk=args.chunk, batch_size=args.op_seqs, progress=False, sweep_dtype=dtype)
        lens = QueryLens(model, tokens, engine=engine, basis=args.basis)
        with precision_env(env):
            # M v of each feature's value and N^T k of its key: the operators' images the scores read
            ops, times = timed(
                lambda lens=lens: {
                    "value (M v)": lens.value_directions(ffkv, features),
                    "key (N^T k)": lens.key_gradients(ffkv, features),
                }
            )
            sigs = {  # scored in fp32 from each precision's directions
                "QL_VALUE": lens.value_signatures(ffkv, features, k=args.k, method="full"),
                "QL_KEY": lens.key_signatures(ffkv, features, k=args.k),
            }
            if args.basis == "identity":  # the full operators behind them (held by the lens: no new sweep)
                ops["value operator M"] = lens.value_operator(f"blocks.{args.layer}.hook_resid_post")
                ops["key operator N"] = lens.key_operator(f"blocks.{args.layer}.ln2.hook_normalized")
        runs[label] = {"times": times, "ops": ops, "sigs": sigs}
        print(f"(a) operators {label}: {times}", flush=True)
    ref, low = runs["fp32"], runs["bf16"]
    errors = {side: float((low["ops"][side] - a).norm() / a.norm()) for side, a in ref["ops"].items()}
    agree = {}
    for name, ends in (("QL_VALUE", ("top", "bottom")), ("QL_KEY", ("top",))):
        for end in ends:
            j = row_jaccard(getattr(ref["sigs"][name], f"{end}_ids"), getattr(low["sigs"][name], f"{end}_ids"))
            agree[f"{name} {end}-{args.k}"] = summary([float(x) for x in j])
    return {
        "tokens": int(tokens.numel()),
        "basis": args.basis,
        "fp32": ref["times"],
        "bf16": low["times"],
        "ratios": ratios(ref["times"], low["times"]),
        "operator_rel_frobenius_error": {k: float(f"{v:.3e}") for k, v in errors.items()},
        "signature_jaccard": agree,
        "holds": all(v <= TOLERANCES["operator_rel_error"] for v in errors.values())
        and all(a["mean"] >= TOLERANCES["jaccard"] for a in agree.values()),
    }


def _shards(out: Path) -> dict[int, dict[str, Any]]:
    """Feature id → its atlas record, with signature tokens as strings (from the shards' JSON copies)."""
    features: dict[int, dict[str, Any]] = {}
    for path in sorted((out / "shards").rglob("*.json")):
        shard = json.loads(path.read_text(encoding="utf-8"))
        strings = shard["strings"]
        for rec in shard["features"]:
            sig = {name: [strings[t] for t, _ in entry["top"]] for name, entry in rec.get("sig", {}).items()}
            features[rec["i"]] = {"top": [ctx["s"] for ctx in rec["top"]], "sig": sig}
    return features


def part_atlas(model, args, scratch: Path) -> dict[str, Any]:
    from tl_query_lens.atlas import AtlasConfig, build_atlas

    runs: dict[str, Any] = {}
    for label, env in (("fp32", "float32"), ("bf16", "bfloat16")):
        cfg = AtlasConfig.preset_quick(
            out=scratch / f"atlas-{label}",
            dictionary=(f"ffkv:{args.atlas_layer}",),
            features=f"0-{args.atlas_features - 1}",
            n_tokens=args.atlas_tokens,
            exports=False,
        )
        with precision_env(env):
            result, times = timed(lambda cfg=cfg: build_atlas(model, None, cfg, progress=False))
        stages = {k: round(v, 2) for k, v in result.seconds.items()}
        runs[label] = {"times": {**times, "stages_s": stages}, "features": _shards(cfg.out)}
        print(f"(b) atlas {label}: {runs[label]['times']}", flush=True)
    ref, low = runs["fp32"]["features"], runs["bf16"]["features"]
    ids = sorted(ref)
    agree = {"top contexts": summary([jaccard(ref[i]["top"], low[i]["top"]) for i in ids])}
    for name in sorted({n for i in ids for n in ref[i]["sig"]}):
        both = [i for i in ids if name in ref[i]["sig"] and name in low[i]["sig"]]
        agree[f"{name} top tokens"] = summary([jaccard(ref[i]["sig"][name], low[i]["sig"][name]) for i in both])
    fp32_t, bf16_t = runs["fp32"]["times"], runs["bf16"]["times"]
    stage_ratios = {
        k: round(fp32_t["stages_s"][k] / max(bf16_t["stages_s"][k], 1e-9), 3)
        for k in ("forward_pass", "operators", "signatures_and_shards")
        if k in fp32_t["stages_s"] and k in bf16_t["stages_s"]
    }
    return {
        "features": len(ids),
        "fp32": fp32_t,
        "bf16": bf16_t,
        "ratios": {**ratios(fp32_t, bf16_t), "stages_wall_fp32_over_bf16": stage_ratios},
        "jaccard": agree,
        "holds": {key: a["mean"] >= TOLERANCES["jaccard"] for key, a in agree.items()},
    }


def part_certificate(model, args) -> dict[str, Any]:
    from tl_query_lens import load_corpus
    from tl_query_lens.certify.certify import CertifyConfig, certify_many
    from tl_query_lens.certify.losses import Splice
    from tl_query_lens.sources import load_dictionary

    sae = load_dictionary(args.cert_dictionary, model)
    cal = load_corpus("embedded", model, n_seqs=args.n_cal, seq_len=32, split="calibration")
    ev = load_corpus("embedded", model, n_seqs=args.n_eval, seq_len=32, split="evaluation")
    certs, times = {}, {}
    for label, autocast in (("fp32", False), ("bf16", True)):
        cfg = CertifyConfig(k=args.cert_k, exclude_first_positions=args.cert_skip, autocast=autocast)
        splices = {"proxy": Splice(sae, rule="topk", k=args.cert_k)}
        out, times[label] = timed(lambda cfg=cfg, s=splices: certify_many(model, s, cal, ev, cfg)["proxy"])
        certs[label] = out
        print(f"(c) certificate {label}: {times[label]} U {out.bound:.4f} Occam {out.bound_occam:.4f}", flush=True)
    keys = ("bound", "bound_occam", "R_hat", "eps_hat", "eta_hat", "P")
    values = {label: {k: float(getattr(c, k)) for k in keys} for label, c in certs.items()}
    diff = {k: round(values["bf16"][k] - values["fp32"][k], 4) for k in keys}
    return {
        "dictionary": args.cert_dictionary,
        "n_cal": args.n_cal,
        "n_eval": args.n_eval,
        "fp32": {**times["fp32"], **values["fp32"]},
        "bf16": {**times["bf16"], **values["bf16"]},
        "ratios": ratios(times["fp32"], times["bf16"]),
        "difference_bf16_minus_fp32": diff,
        "holds": abs(diff["bound"]) <= TOLERANCES["bound_bits"]
        and abs(diff["bound_occam"]) <= TOLERANCES["bound_bits"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="operators,atlas,certificate", help="comma-separated parts to run")
    parser.add_argument("--layer", type=int, default=18, help="(a) layer of the operators and FF-KV features")
    parser.add_argument("--op-seqs", type=int, default=2, help="(a) operator corpus windows")
    parser.add_argument(
        "--basis",
        default="features",
        choices=("features", "identity"),
        help="(a) push the features' own directions (cheap) or build the full d x d operators (d passes per sweep)",
    )
    parser.add_argument("--op-seq-len", type=int, default=32, help="(a) tokens per operator window")
    parser.add_argument("--chunk", type=int, default=64, help="(a) tangents per batched pass")
    parser.add_argument("--features", type=int, default=64, help="(a) FF-KV features whose signatures are compared")
    parser.add_argument("--k", type=int, default=25, help="(a) signature top-k (Table 1 scores 25 tokens)")
    parser.add_argument("--atlas-layer", type=int, default=20, help="(b) FF-KV layer of the atlas")
    parser.add_argument("--atlas-features", type=int, default=256, help="(b) features of the atlas")
    parser.add_argument("--atlas-tokens", type=int, default=8192, help="(b) corpus tokens of the atlas pass")
    parser.add_argument(
        "--cert-dictionary", default="tlql-saes-smollm2-135m:blocks.24.hook_resid_post", help="(c) dictionary spec"
    )
    parser.add_argument("--cert-k", type=int, default=64, help="(c) TopK size of the proxy")
    parser.add_argument("--cert-skip", type=int, default=1, help="(c) exclude_first_positions")
    parser.add_argument("--n-cal", type=int, default=32, help="(c) calibration windows of 32 tokens")
    parser.add_argument("--n-eval", type=int, default=100, help="(c) evaluation windows N of 32 tokens")
    parser.add_argument("--json", default=None, help="write the record to this file")
    args = parser.parse_args(argv)

    from tl_query_lens import load_model
    from tl_query_lens.paths import relative_command
    from tl_query_lens.precision import BF16_CPU_FLAGS, bf16_fast, cpu_flags

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"operators", "atlas", "certificate"}
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; choose from operators, atlas, certificate")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_start, wall0, cpu0 = os.getloadavg(), time.perf_counter(), time.process_time()
    model = load_model("smollm2-135m", device="cpu")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bf16-") as scratch:
        for part in parts:
            if part == "operators":
                results[part] = part_operators(model, args)
            elif part == "atlas":
                results[part] = part_atlas(model, args, Path(scratch))
            else:
                results[part] = part_certificate(model, args)
            print(json.dumps({part: results[part]}, indent=1), flush=True)
    record = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "tolerances": TOLERANCES,
        "results": results,
        "command": relative_command([sys.executable, *sys.argv]),
        "started_utc": started,
        "wall_s": round(time.perf_counter() - wall0, 1),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "torch_threads": torch.get_num_threads(),
        "nice": os.nice(0),
        "cpu_count": os.cpu_count(),
        "cpu_bf16_flags": sorted(cpu_flags() & BF16_CPU_FLAGS),
        "bf16_fast_cpu": bf16_fast("cpu"),
        "torch": torch.__version__,
    }
    print(json.dumps({k: v for k, v in record.items() if k != "results"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


if __name__ == "__main__":
    main()
