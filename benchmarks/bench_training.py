"""fp32 vs bf16 autocast throughput of the suite's two stages, as ratios measured in one run.

Stage 1: one training step of a TopK SAE and a TopK transcoder (d_model 576 → 4,608, k 32) at two batch sizes.
Stage 2 (``--model``): the embedded model's activation pass to layer 24 with 8 hooks cached, fp32 vs autocast vs
bf16 weights, and the relative error of the cached activations against fp32.
Stage 3 (``--quality STEPS``): the quality difference of the resulting dictionaries. The same TopK SAE (layer-12
residual, d 576 → 4,608, k 32, same seed and batches) is trained for STEPS steps of 1,024 real activations from the
suite's activation cache in fp32 and under bf16 autocast; printed: each run's samples/s and their ratio, and the
explained variance of both on 8,192 held-out cached rows (evaluated in fp32).

    python benchmarks/bench_training.py --threads 2 [--model] [--quality 300]
"""

from __future__ import annotations

import argparse
import time

import torch
from sae_lens.saes.sae import TrainStepInput
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

from tl_query_lens.saes.transcoder import FastTopKTrainingSAE, TopKTrainingTranscoder, TopKTrainingTranscoderConfig


def step_rate(kind: str, batch: int, autocast: bool, n: int = 5) -> float:
    common = {"d_in": 576, "d_sae": 4608, "k": 32, "dtype": "float32", "device": "cpu"}
    if kind == "sae":
        sae = FastTopKTrainingSAE(TopKTrainingSAEConfig(**common))
    else:
        sae = TopKTrainingTranscoder(TopKTrainingTranscoderConfig(**common, d_out=576))
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4)
    x = torch.randn(batch, 576 if kind == "sae" else 1152)
    dead = torch.zeros(4608, dtype=torch.bool)
    dead[:100] = True

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = sae.training_forward_pass(
                TrainStepInput(
                    sae_in=x, dead_neuron_mask=dead, coefficients={}, n_training_steps=0, is_logging_step=False
                )
            )
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    start = time.perf_counter()
    for _ in range(n):
        step()
    return batch * n / (time.perf_counter() - start)


def forward_stage() -> None:
    from tl_query_lens.corpus import load_corpus
    from tl_query_lens.models import load_model

    model = load_model("smollm2-135m")
    toks = load_corpus("stdlib", model, n_seqs=8, seq_len=128, split="train")
    layers = (6, 12, 18, 24)
    hooks = [f"blocks.{la}.hook_resid_post" for la in layers] + [f"blocks.{la}.hook_mlp_out" for la in layers]

    def run(m, autocast: bool) -> tuple[float, dict[str, torch.Tensor]]:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            m.run_with_cache(toks, names_filter=hooks, stop_at_layer=25)  # warm-up
            start = time.perf_counter()
            _, cache = m.run_with_cache(toks, names_filter=hooks, stop_at_layer=25)
        return toks.numel() / (time.perf_counter() - start), {h: cache[h].float()[:, 1:] for h in hooks}

    base, ref = run(model, False)
    print(f"forward fp32: {base:.0f} tok/s")
    for name, m, autocast in [
        ("autocast", model, True),
        ("bf16 weights", load_model("smollm2-135m", dtype=torch.bfloat16), False),
    ]:
        rate, out = run(m, autocast)
        err = {h: float((out[h] - ref[h]).norm() / ref[h].norm()) for h in hooks}
        print(
            f"forward {name}: {rate:.0f} tok/s ({rate / base:.2f}x); relative error "
            + ", ".join(f"{h} {e:.4f}" for h, e in err.items())
        )


def quality_stage(steps: int) -> None:
    import numpy as np

    from tl_query_lens.saes.registry import SAES_RELEASES

    caches = sorted(
        (SAES_RELEASES.root() / SAES_RELEASES.release_name("smollm2-135m") / ".train").glob("activations-*")
    )
    if not caches:
        raise SystemExit("No activation cache: run `tlql saes train` first (the benchmark reads its cached rows).")
    rows = np.load(caches[-1] / "blocks.12.hook_resid_post.npy", mmap_mode="r").reshape(-1, 128, 576)[:, 1:]
    rows = torch.from_numpy(np.ascontiguousarray(rows.reshape(-1, 576)).astype(np.float32))
    held_out, train = rows[-8192:], rows[:-8192]
    order = torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(0))
    results = {}
    for autocast in (False, True):
        torch.manual_seed(0)
        sae = FastTopKTrainingSAE(
            TopKTrainingSAEConfig(d_in=576, d_sae=4608, k=32, dtype="float32", device="cpu", decoder_init_norm=0.1)
        )
        with torch.no_grad():
            sae.b_dec.copy_(train[:65536].mean(0))
        opt = torch.optim.Adam(sae.parameters(), lr=5e-4)
        dead = torch.zeros(4608, dtype=torch.bool)
        start = time.perf_counter()
        for i in range(steps):
            x = train[order[(i * 1024) % len(order) :][:1024]]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = sae.training_forward_pass(
                    TrainStepInput(
                        sae_in=x, dead_neuron_mask=dead, coefficients={}, n_training_steps=i, is_logging_step=False
                    )
                )
            out.loss.backward()
            opt.step()
            opt.zero_grad()
        rate = steps * 1024 / (time.perf_counter() - start)
        with torch.no_grad():
            recon = sae.decode(sae.encode(held_out))
            ev = 1 - float((held_out - recon).pow(2).sum() / (held_out - held_out.mean(0)).pow(2).sum())
        results[autocast] = (rate, ev)
        print(f"SAE training {'autocast' if autocast else 'fp32'}: {rate:.0f} samples/s, held-out EV {ev:.4f}")
    (r32, ev32), (r16, ev16) = results[False], results[True]
    print(f"quality after {steps} steps: bf16/fp32 speed {r16 / r32:.2f}x, EV difference {ev16 - ev32:+.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", action="store_true", help="also time the embedded model's activation pass")
    parser.add_argument("--quality", type=int, default=0, metavar="STEPS", help="train fp32 vs bf16 and compare EV")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for batch in (1024, 4096):
        for kind in ("sae", "transcoder"):
            fp32, bf16 = step_rate(kind, batch, False), step_rate(kind, batch, True)
            print(f"{kind} step, batch {batch}: fp32 {fp32:.0f}, autocast {bf16:.0f} samples/s ({bf16 / fp32:.2f}x)")
    if args.model:
        forward_stage()
    if args.quality:
        quality_stage(args.quality)


if __name__ == "__main__":
    main()
