"""The certification paper's protocol (newcodevelop/sparse-lens-certification, checked).

Where it departs from this project's (``protocols/tlql.py``):
  * evaluation data = one window per document (i.i.d. draws, as Hoeffding needs; the paper: one 32-token window per
    C4 document), so N is at most the number of documents in the evaluation split;
  * the headline total bound is the Occam variant (ln C(m, P) in the first Hoeffding term — the paper's Llama
    layer-30 ≈ 13.7 bits at N = 10k is this one);
  * beside it the direct bound on the clean model, R̂(M) + Δ√(ln(1/δ)/2N), which shows what the proxy costs;
  * the shuffle ablation's gap is read as |ℓ(S∘M) − ℓ(M)| (densities), not the signed gap.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from tl_query_lens.documents import one_window_per_document

logger = logging.getLogger(__name__)

HEADLINE = "bound_occam"
ONE_WINDOW_PER_DOCUMENT = True


def evaluation_windows(model, corpus: Any, cfg) -> tuple[torch.Tensor, int | None, int | None]:
    """One window from each of ``cfg.n_eval`` distinct evaluation documents (all eligible ones when None)."""
    windows = one_window_per_document(
        corpus, model, n_seqs=cfg.n_eval, seq_len=cfg.seq_len, split="evaluation", seed=cfg.seed
    )
    ev, n_documents, n_eligible = windows.tokens, windows.n_documents, windows.n_eligible
    logger.info(
        "paper protocol: %d evaluation windows, one from each of %d distinct documents (the split holds "
        "%d documents, %d long enough)",
        ev.shape[0],
        ev.shape[0],
        n_documents,
        n_eligible,
    )
    return ev, n_documents, n_eligible
