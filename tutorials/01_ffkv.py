# %% [markdown]
# # FF-KV: an MLP's key–value memories as an SAELens dictionary
# Start from an ordinary TransformerLens + SAELens script, then add `tl_query_lens` in two lines.
# Settings are small so the file runs as a smoke test (`TLQL_TUTORIAL_SMALL=1`); raise them for real work.

# %%
import os

import torch
from sae_lens import SAE

import tl_query_lens as tlql

SMALL = os.environ.get("TLQL_TUTORIAL_SMALL", "1") == "1"
OUT = os.environ.get("TLQL_TUTORIAL_OUT", "results/tutorials/ffkv")

# %% The usual TL script: a HookedSAETransformer and some tokens (here the embedded model, offline).
model = tlql.load_model("smollm2-135m")
tokens = tlql.load_corpus("embedded", model, n_seqs=4 if SMALL else 64, seq_len=32, split="evaluation")
logits, cache = model.run_with_cache(tokens, names_filter=["blocks.18.mlp.hook_post"])

# %% [markdown]
# ## Add the plugin: layer 18's MLP as a dictionary
# Each of the 1,536 hidden units is a feature: its key is the (gate) column it reads, its value the row of W_out it
# writes. The vanilla dictionary is exact, so splicing it in changes nothing.

# %%
ffkv = tlql.FFKV.from_model(model, 18)  # vanilla
spliced = model.run_with_saes(tokens, saes=[ffkv], use_error_term=False)
print("max |Δlogit| of the exact splice:", (spliced - logits).abs().max().item())
acts = ffkv.encode(
    model.run_with_cache(tokens, names_filter=[ffkv.cfg.metadata.hook_name])[1][ffkv.cfg.metadata.hook_name]
)
print("FF-KV activations equal mlp.hook_post:", torch.allclose(acts, cache["blocks.18.mlp.hook_post"], atol=1e-4))

# %% [markdown]
# ## A sparse dictionary: TopK, and what sparsity costs

# %%
from tl_query_lens.dictionaries.splice import splice_metrics

topk = tlql.FFKV.from_model(model, 18, "topk", k=64)
m = splice_metrics(model, topk, tokens)
print(
    f"TopK-64: L0 {m.mean_l0:.0f}, explained variance {m.explained_variance:.3f}, "
    f"CE change {m.ce_delta:+.4f} nats, alive {m.alive_rate:.3f}"
)

# %% [markdown]
# ## It is an ordinary SAELens SAE: save, load, inspect keys and values

# %%
topk.save_model(f"{OUT}/layer18_topk64")
reloaded = SAE.load_from_disk(f"{OUT}/layer18_topk64")
view = tlql.as_key_value(reloaded, model)
print(type(reloaded).__name__, view.read_hook, "→", view.write_hook, tuple(view.keys.shape), tuple(view.values.shape))
feature = int(acts.abs().mean((0, 1)).argmax())
top_logit_tokens = (view.values[feature] @ model.W_U).topk(8).indices
print(f"feature {feature} value, logit lens:", model.to_str_tokens(top_logit_tokens))
