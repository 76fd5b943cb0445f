"""Worked example: one ambiguous token, two contexts, different readout features (docs/readout.md).

Like the paper's "bug" example: in a software context the margin ' bug' − ' insect' is decomposed, in an insect
context ' bug' − ' error'; the state is the logit lens of the last layer at the final prompt position.
Run: OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/readout_demo_embedded.py
"""

from __future__ import annotations

import json

import torch
from sae_lens import SAE

from tl_query_lens import load_model
from tl_query_lens.readout import decompose, margin
from tl_query_lens.readout.states import logit_lens

CASES = [
    ("software", "The programmer reproduced the crash and filed a", " bug", " insect"),
    (
        "insect",
        "In the garden, my daughter found a small beetle on a leaf and said it was a cute little",
        " bug",
        " error",
    ),
]


def main() -> None:
    model = load_model("smollm2-135m", device="cpu")
    sae = SAE.from_pretrained("tlql-readout-smollm2-135m", "cpu")
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in (20, 25, 29)]
    out = {}
    for name, prompt, pos, neg in CASES:
        with torch.no_grad():
            logits, cache = model.run_with_cache(prompt, names_filter=hooks)
        p, n = model.to_single_token(pos), model.to_single_token(neg)
        rank = int((logits[0, -1] > logits[0, -1, p]).sum())
        out[name] = {"prompt": prompt, "margin": f"{pos!r} - {neg!r}", "rank_of_positive_in_model_output": rank}
        for hook in hooks:
            h = logit_lens(model)(cache[hook][0, -1]).float()
            dec = decompose(sae, h, margin(p, n, model.cfg.d_vocab), model=model, n_top=5)
            out[name][hook] = {
                "exact": dec.exact.item(),
                "sum_contributions": dec.contributions.sum().item(),
                "residual": dec.residual.item(),
                "rho0": (dec.residual.abs() / dec.exact.abs()).item(),
                "top": [
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in dec.top_features
                ],
            }
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
