"""This project's certification protocol (``protocol="tlql"``, formerly ``"fixed-pool"``; ``tlql certify``'s default).

Where it departs from the paper's (``protocols/paper.py``):
  * evaluation windows are cut from the split's concatenated token stream (several per document), 1000 by default;
  * the headline is the fixed-pool bound U (no ln C(m, P) term: the pool G* is fixed on the calibration split
    before the evaluation split is read);
  * the shuffle ablation reports the signed gap ℓ(S∘M) − ℓ(M).
"""

from __future__ import annotations

from typing import Any

import torch

from tl_query_lens.corpus import load_corpus

HEADLINE = "bound"
ONE_WINDOW_PER_DOCUMENT = False


def evaluation_windows(model, corpus: Any, cfg) -> tuple[torch.Tensor, int | None, int | None]:
    """``cfg.n_eval`` (default 1000) windows of the evaluation stream; no document counts."""
    ev = load_corpus(corpus, model, n_seqs=cfg.n_eval or 1000, seq_len=cfg.seq_len, split="evaluation", seed=cfg.seed)
    return ev, None, None
