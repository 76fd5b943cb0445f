"""Train the TopK SAE certified in docs/certification.md: `python docs/scripts/train_certify_sae.py 24 32768`."""

import logging
import sys
import time

import torch

from tl_query_lens import load_model
from tl_query_lens.certify.train_sae import SAETrainSpec, train_sae

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
torch.set_num_threads(1)
model = load_model("smollm2-135m", device="cpu")
for layer in [int(x) for x in sys.argv[1].split(",")]:
    t = time.time()
    spec = SAETrainSpec(layer=layer, d_sae=2304, k=32, training_tokens=int(sys.argv[2]), batch_size_tokens=256, lr=1e-3)
    path = train_sae(model, spec)
    print(f"layer {layer}: {spec} -> {path} in {time.time() - t:.0f} s", flush=True)
