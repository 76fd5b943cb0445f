# %% [markdown]
# # Certification: can this SAE stand in for the model?
# Splice an SAE's reconstruction in (proxy patching) and bound the frozen model's risk by proxy risk + reconstruction
# gap + concept-pool mismatch + a complexity term (DESIGN §7). Calibration and evaluation splits must be disjoint.

# %%
import os

import tl_query_lens as tlql
from tl_query_lens.certify.plots import bound_vs_n_figure

SMALL = os.environ.get("TLQL_TUTORIAL_SMALL", "1") == "1"
OUT = os.environ.get("TLQL_TUTORIAL_OUT", "results/tutorials")
model = tlql.load_model("smollm2-135m")
cal = tlql.load_corpus("embedded", model, n_seqs=16 if SMALL else 256, seq_len=32, split="calibration")
ev = tlql.load_corpus("embedded", model, n_seqs=48 if SMALL else 1000, seq_len=32, split="evaluation")

# %% Any SAELens SAE, transcoder or FF-KV works; here a TopK-64 FF-KV dictionary of layer 24.
sae = tlql.FFKV.from_model(model, 24, "topk", k=64)
cert = tlql.certify(model, sae, cal, ev, k=64, delta=0.05)
print(
    f"U = {cert.bound:.2f} bits (Occam {cert.bound_occam:.2f}) vs log2|V| = {cert.baseline_bits:.2f};"
    f" R_hat {cert.R_hat:.2f}, eps_hat {cert.eps_hat:.3f}, eta_hat {cert.eta_hat:.3f}, P {cert.P}/{cert.m},"
    f" N* {cert.N_star:.0f} ({'observed' if cert.N_star_observed else 'extrapolated'})"
)
print(f"KL(M‖proxy) {cert.kl_bits:.3f} bits, top-1 agreement {cert.top1_agreement:.3f}")

# %% The certificate is a result object: save it, plot bound vs N.
cert.save(f"{OUT}/certificate")
bound_vs_n_figure({"FF-KV L24": cert}).write_html(f"{OUT}/bound_vs_n.html", include_plotlyjs=True)

# %% Overlapping splits are refused, not silently used.
try:
    tlql.certify(model, sae, ev[:16], ev, k=64)
except ValueError as err:
    print("refused:", str(err)[:100])
