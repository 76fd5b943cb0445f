"""Shared primitives checked against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from tl_query_lens.primitives import row_jaccard


def test_row_jaccard_against_hand_counts():
    a = torch.tensor([[1, 2, 3, 4], [5, 6, -1, -1], [7, 8, 9, -1], [-1, -1, -1, -1]])
    b = torch.tensor([[4, 3, 9, 10], [6, 5, 6, 5], [1, 2, 3, -1], [-1, -1, -1, -1]])
    # {1,2,3,4} vs {3,4,9,10}: 2 of 6; {5,6} vs {5,6} (repeats and -1 padding left out): 1; disjoint: 0; empty: 1
    assert row_jaccard(a, b).tolist() == [2 / 6, 1.0, 0.0, 1.0]
    assert row_jaccard(a, b, pad=-2)[1].item() == pytest.approx(2 / 3)  # -1 counted as an id: {5,6,-1} vs {5,6}
    with pytest.raises(ValueError, match="same number of rows"):
        row_jaccard(a, b[:2])
