"""GPU check: every method on a GPT-2-small-shaped random model, with throughput, peak memory and CPU agreement.

Run it whenever a GPU machine is lent (prepared to finish in under 5 minutes on one modern GPU) and record what it
prints; ``--device cpu --small`` is the CI smoke mode (a tiny config, seconds)::

    python benchmarks/gpu_check.py                       # cuda, GPT-2-small shape, 1024 × 32 = 32k operator tokens
    python benchmarks/gpu_check.py --dtype bfloat16      # the same model in bf16 (operators still accumulate in fp32)
    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --device cpu --small

Steps (each timed): value operator of one mid layer (reverse sweep), key operator of its MLP input (forward sweep),
module operators of the downstream blocks, Query Lens value (full, first-order) and key signatures of 8 FF-KV features
from those operators, the same 8 features' value and key signatures on the feature basis (no full operator), FF-KV
splice metrics, a certificate, a short readout-SAE fit and one decomposition. Agreement: the value and key operators
recomputed on the CPU on a slice of the corpus (fp32 copy of the model) vs the same slice on the device. The model is
random (no hub access on the lent machines): the figures measure speed and numerics, not interpretability.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import resource
import time

import torch


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB: process peak RSS


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(small: bool, dtype: torch.dtype, device: str):
    from sae_lens import HookedSAETransformer
    from transformer_lens import HookedTransformerConfig

    if small:
        shape = {"n_layers": 4, "d_model": 64, "d_head": 16, "n_heads": 4, "d_mlp": 256, "n_ctx": 64, "d_vocab": 503}
    else:  # GPT-2 small
        shape = {
            "n_layers": 12,
            "d_model": 768,
            "d_head": 64,
            "n_heads": 12,
            "d_mlp": 3072,
            "n_ctx": 1024,
            "d_vocab": 50257,
        }
    cfg = HookedTransformerConfig(
        **shape,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        seed=0,
        dtype=dtype,
        device=device,
    )
    model = HookedSAETransformer(cfg)
    model.eval()
    return model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--small", action="store_true", help="tiny config and corpus (CI smoke mode)")
    parser.add_argument("--n-seqs", type=int, default=None, help="operator corpus sequences (default 1024; small 32)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--slice", type=int, default=2, help="sequences recomputed on the CPU for agreement")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("gpu_check")

    from tl_query_lens import FFKV, QueryLens, certify
    from tl_query_lens.dictionaries.splice import splice_metrics
    from tl_query_lens.operators import key_operators, module_operators, value_operators
    from tl_query_lens.readout import decompose, fit_readout, token_logit

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("No CUDA device here: run with --device cpu --small for the smoke mode.")
    dtype = getattr(torch, args.dtype)
    n_seqs = args.n_seqs or (32 if args.small else 1024)
    model = build_model(args.small, dtype, args.device)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.d_vocab, (n_seqs, args.seq_len), generator=gen)
    layer = model.cfg.n_layers // 2
    hook, read = f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.ln2.hook_normalized"
    engine = {"chunk": args.chunk, "batch_size": args.batch_size, "progress": False}
    out: dict = {
        "device": str(device),
        "dtype": args.dtype,
        "small": args.small,
        "tokens": tokens.numel(),
        "d_model": model.cfg.d_model,
        "n_layers": model.cfg.n_layers,
        "layer": layer,
        "steps": {},
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        torch.cuda.reset_peak_memory_stats(device)

    def step(name: str, run, n_tokens: int | None = None):
        sync(device)
        start = time.perf_counter()
        result = run()
        sync(device)
        seconds = time.perf_counter() - start
        figures = {"seconds": round(seconds, 3), "peak_gib": round(peak_memory_gib(device), 3)}
        if n_tokens:
            figures["tokens_per_s"] = round(n_tokens / seconds, 1)
        out["steps"][name] = figures
        log.info("%-28s %s", name, figures)
        return result

    n_tok = tokens.numel()
    value = step("value operator (reverse)", lambda: value_operators(model, tokens, [hook], **engine), n_tok)
    key = step("key operator (forward)", lambda: key_operators(model, tokens, [read], **engine), n_tok)
    step(
        "module operators",
        lambda: module_operators(model, tokens, range(layer + 1, model.cfg.n_layers), **engine),
        n_tok,
    )
    ffkv = FFKV.from_model(model, layer, "topk", k=32)
    features = list(range(8))
    lens = QueryLens(model, tokens, **engine)
    lens.precompute([ffkv], value_methods=("full", "first_order"), key_methods=("full",))  # the hooks of ffkv
    for method in ("full", "first_order"):
        step(f"value signatures ({method})", lambda m=method: lens.value_signatures(ffkv, features, method=m))
    step("key signatures (full)", lambda: lens.key_signatures(ffkv, features))
    fresh = QueryLens(model, tokens, basis="features", **engine)
    pushed = step("value sigs, feature basis", lambda: fresh.value_signatures(ffkv, features, method="full"), n_tok)
    step("key sigs, feature basis", lambda: fresh.key_signatures(ffkv, features), n_tok)
    held = lens.value_signatures(ffkv, features, method="full")
    out["feature_basis_rel_diff"] = float(
        (pushed.directions - held.directions).abs().max() / held.directions.abs().max()
    )
    eval_tokens = tokens[: min(n_seqs, 256)]
    step(
        "FF-KV splice metrics",
        lambda: splice_metrics(model, ffkv, eval_tokens, batch_size=args.batch_size),
        eval_tokens.numel(),
    )
    cal, ev = tokens[:4], tokens[4 : 4 + min(n_seqs - 4, 256)]
    cert = step(
        "certificate",
        lambda: certify(
            model, FFKV.from_model(model, layer), cal, ev, k=32, n_schedule=[len(ev)], batch_size=args.batch_size
        ),
        ev.numel(),
    )
    out["certificate_bound_bits"] = round(cert.bound, 4)
    fit = step(
        "readout fit (50 steps)",
        lambda: fit_readout(
            model,
            tokens[:8],
            width=4 * model.cfg.d_model,
            k=16,
            steps=50,
            batch_rows=512,
            batch_pairs=128,
            progress=False,
            log_every=50,
        ),
    )
    h = torch.randn(model.cfg.d_model, generator=gen).to(device, dtype)
    step("readout decomposition", lambda: decompose(fit.sae, h, token_logit(0, model.cfg.d_vocab), model=model))

    # Agreement with the CPU on a slice: an fp32 CPU copy of the same weights, same tokens.
    part = tokens[: args.slice]
    cpu_model = copy.deepcopy(model).to("cpu").float()
    cpu_model.cfg.dtype = torch.float32
    agreement = {}
    for name, run in (
        ("value", lambda m: value_operators(m, part, [hook], **engine)[hook]),
        ("key", lambda m: key_operators(m, part, [read], **engine)[read]),
    ):
        ours, ref = run(model).cpu(), run(cpu_model)
        agreement[name] = float((ours - ref).abs().max() / ref.abs().max())
    out["agreement_rel_max"] = agreement
    out["operator_device"] = str(value[hook].device)
    log.info("agreement with the CPU (max |Δ| / max |ref|, %d sequences): %s", args.slice, agreement)
    log.info(
        "peak memory: %.3f GiB (%s)",
        peak_memory_gib(device),
        "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS",
    )
    del key
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
