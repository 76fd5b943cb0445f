"""This project's readout diagnostics (``protocol="tlql"``, formerly ``"mixed-layers"``): :func:`evaluate_readout`.

Where it departs from the authors' (``protocols/paper.py``):
  * states: the logit-lens states of 4 layers mixed (the authors: the final layer's LM-head inputs LN_f(h_L) only);
  * score bank: five families per state (token logit, top-1 vs competitor, a margin between two of the top 20, the
    group mean of the top 5, top-1 vs the vocabulary mean, whose reconstructed side is the mean of Ŵ's rows);
  * ρ_δ with δ = 0.5 (the authors: ρ₀ = |ε|/|s|);
  * ablation: squared Pearson r over the top-3 features of every top-1-vs-competitor contrast, the control ablating
    random unit directions (the authors: through-origin R² over the top-10 of covered contrasts);
  * row-geometry baselines: neighbours exclude only the row itself; k-means keeps a dead centroid where it was, runs
    10 iterations and codes a row on its top-k centroids by signed cosine with λ = 1e-3 (``readout/baselines.py``).
"""

from tl_query_lens.readout.config import ReadoutEvalConfig
from tl_query_lens.readout.evaluate import evaluate_readout

__all__ = ["ReadoutEvalConfig", "diagnostics"]

diagnostics = evaluate_readout  # the protocol's entry (readout.protocols.readout_diagnostics)
