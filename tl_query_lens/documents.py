"""At most one token window per document: independent draws for Hoeffding bounds and per-document lens corpora.

``load_corpus`` cuts the concatenated token stream of a split into windows, so neighbouring windows come from the same
document (the embedded evaluation split: 1,539 windows of 32 tokens from a few hundred documents). A concentration
bound assumes i.i.d. draws; the certification paper takes one 32-token window per C4 document. This sampler does the
same on any corpus source: one window per document, documents drawn without replacement, so no two windows share a
document.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int

from tl_query_lens.config import Split
from tl_query_lens.corpus import SPLIT_SHARES, _get_tokenizer, document_split, read_documents
from tl_query_lens.results import SavableResult


@dataclass
class DocumentWindows(SavableResult):
    """Token windows with the document each came from.

    Attributes:
        tokens: ``[n, seq_len]`` windows.
        document: index (into the split's document list) of each window's document; all distinct.
        start: token offset of each window inside its document.
        n_documents: documents in the split.
        n_eligible: documents of the split with at least ``seq_len + skip_first`` tokens (the largest N available).
        split / seq_len / skip_first / seed: how the windows were drawn.
    """

    tokens: Int[torch.Tensor, "batch pos"]
    document: Int[torch.Tensor, " batch"]
    start: Int[torch.Tensor, " batch"]
    n_documents: int
    n_eligible: int
    split: str
    seq_len: int
    skip_first: int = 0
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)


def one_window_per_document(
    source: str | Path | Iterable[str] = "embedded",
    tokenizer=None,
    *,
    n_seqs: int | None = None,
    seq_len: int = 32,
    split: Split = "evaluation",
    skip_first: int = 0,
    random_start: bool = True,
    seed: int = 0,
) -> DocumentWindows:
    """One ``seq_len``-token window from each of ``n_seqs`` distinct documents of ``split`` (seeded).

    Args:
        source: a corpus source as for :func:`~tl_query_lens.corpus.load_corpus`.
        tokenizer: a tokenizer or a model with ``.tokenizer``.
        n_seqs: windows wanted (default: one per eligible document). More than the eligible documents is an error.
        seq_len: tokens per window.
        split: the document split (the same hash split as ``load_corpus``, so splits stay disjoint).
        skip_first: tokens skipped at the start of every document before a window may begin.
        random_start: a seeded random offset inside the document (else the window starts at ``skip_first``).
        seed: draws the documents and the offsets.

    Raises:
        ValueError: unknown split, or fewer eligible documents than ``n_seqs`` (the message says how many there are).
    """
    if split not in SPLIT_SHARES:
        raise ValueError(f"Unknown split {split!r}; use one of {sorted(SPLIT_SHARES)}.")
    if seq_len < 1 or skip_first < 0:
        raise ValueError(f"seq_len must be positive and skip_first >= 0, got {seq_len}, {skip_first}.")
    tok = _get_tokenizer(tokenizer)
    docs = [d for d in read_documents(source) if d.strip() and document_split(d) == split]
    encoded = [tok.encode(d, add_special_tokens=False) for d in docs]
    eligible = [i for i, ids in enumerate(encoded) if len(ids) >= seq_len + skip_first]
    n = len(eligible) if n_seqs is None else n_seqs
    if n < 1 or n > len(eligible):
        raise ValueError(
            f"Split {split!r} of {source!r} holds {len(docs)} documents, {len(eligible)} of them with at least "
            f"{seq_len + skip_first} tokens, so at most {len(eligible)} windows of one per document; asked for "
            f"{n_seqs}. Lower n_seqs or seq_len, or use a larger corpus (one window per document keeps the draws "
            "independent)."
        )
    rng = random.Random(seed)
    chosen = rng.sample(eligible, n)
    starts = [rng.randint(skip_first, len(encoded[i]) - seq_len) if random_start else skip_first for i in chosen]
    tokens = torch.tensor([encoded[i][s : s + seq_len] for i, s in zip(chosen, starts)], dtype=torch.long)
    return DocumentWindows(
        tokens=tokens,
        document=torch.tensor(chosen, dtype=torch.long),
        start=torch.tensor(starts, dtype=torch.long),
        n_documents=len(docs),
        n_eligible=len(eligible),
        split=split,
        seq_len=seq_len,
        skip_first=skip_first,
        seed=seed,
        config={"source": str(source) if isinstance(source, (str, Path)) else "<texts>", "random_start": random_start},
    )
