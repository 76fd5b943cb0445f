# %% [markdown]
# # Readout SAEs: split any logit-lens score exactly into per-feature contributions
# A readout SAE is a TopK SAE fitted to the rows of W_U. Every score h·q_α then splits exactly into a shared-bias
# term, per-feature contributions c_i = β_i·(h·d_i) and a residual. Small settings here; the default CPU fit and the
# paper's recipe are one flag away (`tlql readout fit --preset cpu|paper`).

# %%
import os

import torch
from sae_lens import SAE

import tl_query_lens as tlql
from tl_query_lens.readout import decompose, feature_labels, fit_readout, margin, token_logit

SMALL = os.environ.get("TLQL_TUTORIAL_SMALL", "1") == "1"
OUT = os.environ.get("TLQL_TUTORIAL_OUT", "results/tutorials")
model = tlql.load_model("smollm2-135m")

# %% An ordinary logit-lens look at a prompt.
prompt = "The capital of France is"
_, cache = model.run_with_cache(prompt, names_filter=["blocks.29.hook_resid_post"])
h = model.ln_final(cache["blocks.29.hook_resid_post"][0, -1]).detach()
print("logit lens top-5:", model.to_str_tokens((h @ model.W_U + model.b_U).topk(5).indices))

# %% [markdown]
# ## Fit (or load) a readout SAE, saved in SAELens format

# %%
overrides = {"width_mult": 2, "k": 32, "steps": 40, "n_seqs": 4} if SMALL else {}
fit = fit_readout(model, progress=False, **overrides)
fit.sae.save_model(f"{OUT}/readout")
sae = SAE.load_from_disk(f"{OUT}/readout")  # an ordinary SAELens call returns a ReadoutSAE
print(type(sae).__name__, "fitted in", round(fit.seconds), "s")

# %% [markdown]
# ## Decompose a token logit and a margin

# %%
paris, london = model.to_single_token(" Paris"), model.to_single_token(" London")
for name, alpha in [
    ("logit ' Paris'", token_logit(paris, model.cfg.d_vocab)),
    ("margin ' Paris' − ' London'", margin(paris, london, model.cfg.d_vocab)),
]:
    dec = decompose(sae, h.float(), alpha, model=model)
    total = dec.bias + dec.contributions.sum(-1) + dec.residual
    print(
        f"{name}: exact {dec.exact.item():.3f} = bias {dec.bias.item():.3f} + features "
        f"{dec.contributions.sum().item():.3f} + residual {dec.residual.item():.3f}"
    )
    assert torch.allclose(total, dec.exact, rtol=1e-5, atol=1e-6)
    top = dec.top(3)
    labels = feature_labels(sae, [f for f, _ in top], tokenizer=model.tokenizer)
    print("   top features:", [(f, round(c, 3), labels[f]) for f, c in top])
