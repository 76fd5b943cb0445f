# %% [markdown]
# # Query Lens: what a feature promotes (value) and what activates it (key), indirect effects included
# An ordinary SAELens-style script looks at a feature through the logit lens, W_U·v. Query Lens adds the effect of v
# through every downstream attention and MLP module (corpus-mean transition operators), and traces the key back to
# the input embeddings. Small settings (`TLQL_TUTORIAL_SMALL=1`) keep this a smoke test.

# %%
import os

import tl_query_lens as tlql

SMALL = os.environ.get("TLQL_TUTORIAL_SMALL", "1") == "1"
model = tlql.load_model("smollm2-135m")
tokens = tlql.load_corpus("embedded", model, n_seqs=1 if SMALL else 32, seq_len=12 if SMALL else 64, split="train")
LAYER = 27 if SMALL else 18  # a late layer keeps the smoke test cheap: fewer downstream blocks

# %% The usual script: a dictionary (here FF-KV; any SAELens SAE or transcoder works) and its logit lens.
sae = tlql.FFKV.from_model(model, LAYER)
features = [3, 141, 592]
print("LL_VALUE:", [model.to_str_tokens((sae.W_dec[f] @ model.W_U).topk(6).indices) for f in features])

# %% [markdown]
# ## Add the plugin (three lines)

# %%
lens = tlql.QueryLens(model, tokens)
values = lens.value_signatures(sae, features, k=10, method="full")  # W_U·LN_f(M_l v) + b_U
keys = lens.key_signatures(sae, features, k=10, method="full")  # ⟨N_lᵀ k, (e_t − c)/‖e_t − c‖⟩
for row, f in enumerate(features):
    print(f"feature {f}: promotes {values.top_strings[row][:6]} | activated by {keys.top_strings[row][:6]}")

# %% [markdown]
# ## Per-module shares: which downstream modules carry the effect
# The first-order variant splits the value signature into the direct term v and one term J̄_m·v per downstream
# module m; shares are each term's part of the top-k scores.

# %%
first = lens.value_signatures(sae, features, k=10, method="first_order")
for row, f in enumerate(features):
    shares = sorted(zip(first.module_names, first.module_shares[row].tolist()), key=lambda t: -abs(t[1]))[:4]
    print(f"feature {f}:", ", ".join(f"{n} {s:+.2f}" for n, s in shares))

# %% Results are objects you can save, reload and stream full-vocabulary scores from.
values.save(os.path.join(os.environ.get("TLQL_TUTORIAL_OUT", "results/tutorials"), "ql_values"))
print("full-vocabulary scores of the first feature:", tuple(values.scores(0).shape))
