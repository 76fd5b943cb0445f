"""Time one certificate (one FF-KV TopK-64 layer) at N evaluation sequences and show where the time goes.

Reference in the same process: the clean pass over the N evaluation sequences (a plain batched forward pass that
also keeps the logits' log-probabilities); every part is printed in seconds and as a multiple of it. ``--reference``
adds a separate bare ``model(tokens)`` pass (one more full forward; skip it on a crowded machine).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/bench_certify.py --layer 12 --n-eval 1000 --n-cal 1000
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layer", type=int, default=12)
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--n-cal", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--reference", action="store_true", help="also time a bare model(tokens) pass")
    args = parser.parse_args()

    from tl_query_lens import FFKV, load_corpus, load_model
    from tl_query_lens.certify.certify import certify_many
    from tl_query_lens.certify.config import CertifyConfig
    from tl_query_lens.certify.losses import PassTimes, Splice

    model = load_model("smollm2-135m", device="cpu")
    cal = load_corpus("embedded", model, n_seqs=args.n_cal, seq_len=args.seq_len, split="calibration")
    ev = load_corpus("embedded", model, n_seqs=args.n_eval, seq_len=args.seq_len, split="evaluation")
    splice = Splice(FFKV.from_model(model, args.layer, "vanilla"), rule="topk", k=args.k)

    bare = None
    if args.reference:
        with torch.no_grad():
            t0 = time.perf_counter()
            for start in range(0, ev.shape[0], args.batch_size):
                model(ev[start : start + args.batch_size])
            bare = time.perf_counter() - t0

    times = PassTimes()
    t0 = time.perf_counter()
    cert = certify_many(
        model, {"proxy": splice}, cal, ev, CertifyConfig(k=args.k, batch_size=args.batch_size), times=times
    )["proxy"]
    total = time.perf_counter() - t0

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, layer {args.layer}, "
        f"N = {args.n_eval} x {args.seq_len} tokens, calibration {args.n_cal} x {args.seq_len}, TopK-{args.k}"
    )
    reference = times.clean
    print(
        f"reference: the clean pass over the evaluation split: {reference:.1f} s"
        + (f" (a bare model(tokens) pass: {bare:.1f} s)" if bare is not None else "")
    )
    parts = [
        ("calibration pool (truncated pass + encode)", times.pool),
        ("clean pass (logits, losses, cached residual)", times.clean),
        ("proxy pass S∘M (from layer, incl. encode)", times.proxy),
        ("restricted proxy h_G (sequences leaving G*)", times.restricted),
        ("  of which encode + TopK (all passes)", splice.encode_seconds),
        ("total certify", total),
    ]
    for name, seconds in parts:
        print(f"  {name:<46} {seconds:8.1f} s   {seconds / reference:5.2f} x reference")
    print(
        f"certificate: U = {cert.bound:.3f} bits (log2|V| = {cert.baseline_bits:.3f}), R_hat {cert.R_hat:.3f}, "
        f"eps_hat {cert.eps_hat:.3f}, eta_hat {cert.eta_hat:.3f}, P {cert.P}/{cert.m}"
    )


if __name__ == "__main__":
    main()
