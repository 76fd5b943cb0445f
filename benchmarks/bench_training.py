"""fp32 vs bf16 autocast throughput of the suite's two stages, as ratios measured in one run.

Stage 1: one training step of a TopK SAE and a TopK transcoder (d_model 576 → 4,608, k 32) at two batch sizes.
Stage 2 (``--model``): the embedded model's activation pass to layer 24 with 8 hooks cached, fp32 vs autocast vs
bf16 weights, and the relative error of the cached activations against fp32.

    python benchmarks/bench_training.py --threads 2 [--model]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", action="store_true", help="also time the embedded model's activation pass")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for batch in (1024, 4096):
        for kind in ("sae", "transcoder"):
            fp32, bf16 = step_rate(kind, batch, False), step_rate(kind, batch, True)
            print(f"{kind} step, batch {batch}: fp32 {fp32:.0f}, autocast {bf16:.0f} samples/s ({bf16 / fp32:.2f}x)")
    if args.model:
        forward_stage()


if __name__ == "__main__":
    main()
