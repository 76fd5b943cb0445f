"""The single forward pass of an atlas: per-feature statistics of every dictionary from one run over the corpus.

For each feature it keeps, streaming over the corpus windows:

* the ``n_top`` windows with the highest maximum activation, with the activation at every position (shading);
* a uniform sample of ``band_sample`` windows among those where the feature fires (priority sampling: each
  (window, feature) pair gets a seeded uniform key and the largest keys are kept), from which the quantile bands
  are drawn;
* the number of positions where it fires (activation > 0), its extremes, and histograms of its positive
  activations and of the magnitudes of its negative ones (signed features: SwiGLU neurons) on fixed log-spaced bins
  (:data:`HIST_EDGES`).

Every random key depends only on (seed, dictionary, window), so a feature's statistics do not depend on which other
features or dictionaries share the pass (the same files from one rank or several).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

HIST_LO, HIST_HI, HIST_PER_DECADE = -3, 3, 4
#: Edges of the activation histogram (positive activations; the first bin also takes everything below 1e-3).
HIST_EDGES = torch.logspace(HIST_LO, HIST_HI, (HIST_HI - HIST_LO) * HIST_PER_DECADE + 1)
N_BINS = len(HIST_EDGES) - 1


def dictionary_seed(seed: int, slug: str) -> int:
    """A seed for one dictionary's random keys (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}:{slug}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


@dataclass
class FeatureStats:
    """What the pass kept for ``n`` features of one dictionary (rows in the order of ``ids``).

    Attributes:
        ids: feature ids. top_val / top_seq / top_acts: the top windows (value, window index, activation at every
            position), best first. sample_key / sample_val / sample_seq / sample_acts: the uniform sample of firing
            windows. fires: positions with activation > 0. act_max / act_min: extremes over all positions.
            hist: counts of positive activations per log bin. hist_neg: counts of negative activations per log bin
            of their magnitude. n_positions: positions seen (per feature).
    """

    ids: torch.Tensor
    top_val: torch.Tensor
    top_seq: torch.Tensor
    top_acts: torch.Tensor
    sample_key: torch.Tensor
    sample_val: torch.Tensor
    sample_seq: torch.Tensor
    sample_acts: torch.Tensor
    fires: torch.Tensor
    act_max: torch.Tensor
    act_min: torch.Tensor
    hist: torch.Tensor
    hist_neg: torch.Tensor
    n_positions: int = 0

    def rows(self, select: torch.Tensor) -> FeatureStats:
        """The statistics of the features at positions ``select``."""
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "n_positions"}
        return FeatureStats(**{k: v[select] for k, v in fields.items()}, n_positions=self.n_positions)


class StatsCollector:
    """Streaming statistics of the features ``ids`` of one dictionary (see the module docstring)."""

    def __init__(self, ids: torch.Tensor, seq_len: int, *, n_top: int, n_sample: int, seed: int, slug: str):
        n = len(ids)
        self.ids = ids
        self.seed = dictionary_seed(seed, slug)
        self.stats = FeatureStats(
            ids=ids.clone(),
            top_val=torch.full((n, n_top), float("-inf")),
            top_seq=torch.full((n, n_top), -1, dtype=torch.long),
            top_acts=torch.zeros(n, n_top, seq_len, dtype=torch.float16),
            sample_key=torch.full((n, n_sample), float("-inf")),
            sample_val=torch.zeros(n, n_sample),
            sample_seq=torch.full((n, n_sample), -1, dtype=torch.long),
            sample_acts=torch.zeros(n, n_sample, seq_len, dtype=torch.float16),
            fires=torch.zeros(n, dtype=torch.long),
            act_max=torch.full((n,), float("-inf")),
            act_min=torch.full((n,), float("inf")),
            hist=torch.zeros(n, N_BINS, dtype=torch.long),
            hist_neg=torch.zeros(n, N_BINS, dtype=torch.long),
        )

    def keys(self, first_seq: int, n_seqs: int, d_sae: int) -> torch.Tensor:
        """Uniform keys ``[n_seqs, n_features]`` of windows ``first_seq ..``: drawn per window for all ``d_sae``
        features of the dictionary, then the collector's features picked."""
        rows = []
        for seq in range(first_seq, first_seq + n_seqs):
            gen = torch.Generator().manual_seed(self.seed + seq)
            rows.append(torch.rand(d_sae, generator=gen)[self.ids])
        return torch.stack(rows)

    @torch.no_grad()
    def update(self, acts: torch.Tensor, first_seq: int, d_sae: int, skip: int) -> None:
        """Add a batch: ``acts [batch, pos, n_features]`` of windows ``first_seq ..`` (positions < ``skip`` zeroed)."""
        s = self.stats
        acts = acts.float().cpu()
        acts[:, :skip] = 0.0
        valid = acts[:, skip:]
        b = acts.shape[0]
        s.n_positions += valid.shape[0] * valid.shape[1]
        s.fires += (valid > 0).sum((0, 1))
        s.act_max = torch.maximum(s.act_max, valid.amax((0, 1)))
        s.act_min = torch.minimum(s.act_min, valid.amin((0, 1)))
        for hist, mask, size in ((s.hist, valid > 0, valid), (s.hist_neg, valid < 0, -valid)):
            picked = size[mask]
            if picked.numel():
                feature = torch.nonzero(mask)[:, 2]
                bins = (torch.bucketize(picked, HIST_EDGES[1:-1], right=True)).clamp(0, N_BINS - 1)
                hist.view(-1).index_add_(0, feature * N_BINS + bins, torch.ones_like(bins))
        seq_max = valid.amax(1).T  # [n, b]
        seqs = torch.arange(first_seq, first_seq + b).expand(len(self.ids), b)
        per_feature = acts.permute(2, 0, 1).to(torch.float16)  # [n, b, pos]
        s.top_val, s.top_seq, s.top_acts = _merge(
            s.top_val, s.top_seq, s.top_acts, seq_max, seqs, per_feature, key=None
        )
        key = self.keys(first_seq, b, d_sae).T  # [n, b]
        key = torch.where(seq_max > 0, key, torch.full_like(key, float("-inf")))
        merged = _merge(s.sample_key, s.sample_seq, s.sample_acts, key, seqs, per_feature, key=(s.sample_val, seq_max))
        s.sample_key, s.sample_seq, s.sample_acts, s.sample_val = merged

    def result(self) -> FeatureStats:
        return self.stats


def _merge(old_score, old_seq, old_acts, new_score, new_seq, new_acts, *, key):
    """Keep the rows with the largest scores of ``old`` and ``new`` (per feature; ties: the earlier window)."""
    score = torch.cat([old_score, new_score], 1)
    seq = torch.cat([old_seq, new_seq], 1)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, : old_score.shape[1]]
    acts = torch.cat([old_acts, new_acts], 1)
    picked = (
        score.gather(1, order),
        seq.gather(1, order),
        acts.gather(1, order[..., None].expand(-1, -1, acts.shape[2])),
    )
    if key is None:
        return picked
    values = torch.cat([key[0], key[1]], 1).gather(1, order)
    return (*picked, values)
