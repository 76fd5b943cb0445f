"""Feature records: the statistics and signatures of a unit of features as the JSON the site and exports read.

A shard holds a string table and one record per feature; token strings are indices into the table. Activation values
of a context are integers in -1000..1000 of the feature's maximum (``scale``), so a context costs a few bytes a token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tl_query_lens.atlas.collect import HIST_EDGES, FeatureStats
from tl_query_lens.atlas.features import UnitSignatures
from tl_query_lens.query_lens.max_activating import normalise_token
from tl_query_lens.report.tokens import display_token

VALUE_METHODS = ("LL_VALUE", "QL_VALUE", "QL_INDIRECT")
KEY_METHODS = ("LL_KEY", "QL_KEY")
#: Search weights: where a token appears in a feature's page.
SEARCH_WEIGHTS = {"QL_VALUE": 3.0, "QL_INDIRECT": 2.0, "LL_VALUE": 2.0, "QL_KEY": 3.0, "LL_KEY": 2.0, "context": 1.0}


def _trimmed(counts: list[int], edges: list[float]) -> dict[str, list]:
    """``{"edges", "counts"}`` of a histogram without its empty bins at either end (both empty when all are)."""
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return {"edges": [], "counts": []}
    return {"edges": [sig_round(e, 3) for e in edges[used[0] : used[-1] + 2]], "counts": counts[used[0] : used[-1] + 1]}


def sig_round(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (NaN and inf kept as None)."""
    if not math.isfinite(x):
        return None  # type: ignore[return-value]
    return float(f"{x:.{digits}g}")


class Strings:
    """A shard's string table: token id → index of its readable string."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.table: list[str] = []
        self.by_id: dict[int, int] = {}

    def __call__(self, token_id: int) -> int:
        token_id = int(token_id)
        if token_id not in self.by_id:
            self.by_id[token_id] = len(self.table)
            self.table.append(display_token(self.tokenizer, token_id))
        return self.by_id[token_id]

    def text(self, token_id: int) -> str:
        return self.table[self(token_id)]


@dataclass
class UnitRecords:
    """The records of one unit, its search postings ``token string → [(feature, weight)]``, and export rows."""

    strings: list[str]
    features: list[dict[str, Any]]
    postings: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def _context(
    tokens: torch.Tensor,
    seq: int,
    acts: torch.Tensor,
    scale: float,
    before: int,
    after: int,
    skip: int,
    strings: Strings,
) -> dict[str, Any]:
    """One context: a window of tokens around the max token, with quantised activations."""
    acts = acts.float()
    valid = acts.clone()
    valid[:skip] = float("-inf")
    peak = int(valid.argmax())
    lo, hi = max(0, peak - before), min(acts.shape[0], peak + after + 1)
    window = tokens[seq, lo:hi].tolist()
    q = [round(1000 * float(a) / scale) if scale > 0 else 0 for a in acts[lo:hi].tolist()]
    return {
        "s": int(seq),
        "o": lo,
        "t": [strings(t) for t in window],
        "q": q,
        "m": peak - lo,
        "v": sig_round(float(acts[peak])),
    }


def unit_records(
    stats: FeatureStats,
    sigs: UnitSignatures | None,
    tokens: torch.Tensor,
    tokenizer,
    *,
    n_bands: int,
    band_examples: int,
    before: int,
    after: int,
    skip: int,
    k_tokens: int,
    links: dict[int, list[tuple[str, int, float]]] | None = None,
    readout: dict[int, list[tuple[int, float]]] | None = None,
) -> UnitRecords:
    """Records of every feature of ``stats`` (see the module docstring)."""
    strings = Strings(tokenizer)
    records: list = []
    postings: dict = {}
    edges = HIST_EDGES.tolist()
    for row, feature in enumerate(stats.ids.tolist()):
        fires = int(stats.fires[row])
        act_max = float(stats.act_max[row])
        scale = max(abs(act_max), abs(float(stats.act_min[row])), 1e-12) if math.isfinite(act_max) else 1.0
        top = [
            _context(tokens, int(s), stats.top_acts[row, j], scale, before, after, skip, strings)
            for j, (s, v) in enumerate(zip(stats.top_seq[row].tolist(), stats.top_val[row].tolist()))
            if s >= 0 and v > 0
        ]
        bands = _bands(stats, row, tokens, scale, n_bands, band_examples, before, after, skip, strings)
        hist: dict[str, Any] = _trimmed(stats.hist[row].tolist(), edges)
        negative = _trimmed(stats.hist_neg[row].tolist(), edges)
        if negative["counts"]:
            hist["neg"] = negative  # magnitudes of the negative activations, same bins
        record: dict[str, Any] = {
            "i": feature,
            "density": sig_round(fires / max(stats.n_positions, 1)),
            "fires": fires,
            "max": sig_round(act_max),
            "min": sig_round(float(stats.act_min[row])),
            "scale": sig_round(scale, 6),
            "hist": hist,
            "top": top,
            "bands": bands,
        }
        if sigs is not None:
            record["sig"] = {}
            for name, lists in sigs.lists.items():
                entry = {
                    "top": [
                        [strings(t), sig_round(s)]
                        for t, s in zip(
                            lists.top_ids[row, :k_tokens].tolist(), lists.top_scores[row, :k_tokens].tolist()
                        )
                    ]
                }
                if lists.bottom_ids is not None and lists.bottom_scores is not None and name in VALUE_METHODS:
                    entry["bottom"] = [
                        [strings(t), sig_round(s)]
                        for t, s in zip(
                            lists.bottom_ids[row, :k_tokens].tolist(), lists.bottom_scores[row, :k_tokens].tolist()
                        )
                    ]
                record["sig"][name] = entry
            if sigs.missing:
                record["sig_missing"] = dict(sigs.missing)
            if sigs.shares is not None:
                pairs = list(zip(sigs.share_names or [], sigs.shares[row].tolist()))
                record["shares"] = [[n, sig_round(v)] for n, v in pairs]
            if sigs.logit_hist is not None:
                e, c = sigs.logit_hist
                record["logit_hist"] = {"edges": [sig_round(x) for x in e[row].tolist()], "counts": c[row].tolist()}
        if links and feature in links:
            record["links"] = [[slug, i, cos] for slug, i, cos in links[feature]]
        if readout is not None and feature in readout:
            record["readout"] = [[strings(t), code] for t, code in readout[feature]]
        records.append(record)
        _post(postings, record, strings.table, feature)
    return UnitRecords(strings.table, records, postings)


def _bands(stats, row, tokens, scale, n_bands, per_band, before, after, skip, strings) -> list[dict[str, Any]]:
    """Quantile bands of the sampled firing contexts: sorted by their maximum, cut into ``n_bands`` equal groups."""
    keep = [
        (v, s, j)
        for j, (v, s, key) in enumerate(
            zip(stats.sample_val[row].tolist(), stats.sample_seq[row].tolist(), stats.sample_key[row].tolist())
        )
        if s >= 0 and key > float("-inf")
    ]
    keep.sort(key=lambda item: (-item[0], item[1]))
    if not keep:
        return []
    bands = []
    size = max(1, math.ceil(len(keep) / n_bands))
    for b in range(n_bands):
        group = keep[b * size : (b + 1) * size]
        if not group:
            continue
        shown = group[:: max(1, len(group) // per_band)][:per_band]
        bands.append(
            {
                "name": f"quantile {b + 1}/{n_bands}",
                "hi": sig_round(group[0][0]),
                "lo": sig_round(group[-1][0]),
                "ex": [
                    _context(tokens, s, stats.sample_acts[row, j], scale, before, after, skip, strings)
                    for _, s, j in shown
                ],
            }
        )
    return bands


def _post(postings: dict[str, list[tuple[int, float]]], record: dict[str, Any], table: list[str], feature: int):
    """Search postings of one feature: its signature tokens (weighted by method and rank) and top-context tokens."""
    weights: dict[str, float] = {}
    for name, entry in record.get("sig", {}).items():
        for rank, (s, _score) in enumerate(entry["top"]):
            key = normalise_token(table[s])
            if key:
                weights[key] = weights.get(key, 0.0) + SEARCH_WEIGHTS[name] / (1 + 0.2 * rank)
    for ctx in record["top"]:
        key = normalise_token(table[ctx["t"][ctx["m"]]])
        if key:
            weights[key] = weights.get(key, 0.0) + SEARCH_WEIGHTS["context"] / 4
    for key, weight in weights.items():
        postings.setdefault(key, []).append((feature, round(weight, 2)))
