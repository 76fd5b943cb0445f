"""circuit-tracer feature cards in the layout and the semantics of the frontend its PyPI package ships.

The frontend (``circuit_tracer/frontend/assets``) names a graph node's feature ``cantor(layer, index)`` (the Cantor
pairing ``(l + i)(l + i + 1)/2 + i``) and, for a graph whose ``scan`` is a local path (``./...``), fetches the card
``<scan>/<that number>.json``. A card of layer ``l`` and feature ``i`` of the dictionary set ``<set>`` (the atlas
slug ``"{l}-{set}"``) is therefore ``exports/circuit-tracer/<set>/<cantor(l, i)>.json``: one folder holds every
layer of a transcoder set, as one ``scan`` does. (The binary ``features/index.json.gz`` layout with byte ranges is
only read from Hugging Face repositories, never from a local path.)

What the frontend does with a card, and what the card holds for it:

* the examples are coloured by ``d3.scaleSequential(interpolateOranges).domain([act_min, act_max])``, clamped: the
  scale is one-sided, so ``act_min`` is 0 (a signed FF-KV neuron's negative values show white, like zero, instead of
  pushing zero to mid-scale) and ``act_max`` the feature's maximum, or 1 for a feature that never fired (a finite
  domain, no NaN marker);
* ``histogram`` is drawn as equal-width bins over ``[act_min, act_max]`` with the node's activation marked in bin
  ``floor((a - act_min) / (act_max - act_min) * n)``: :data:`HIST_BINS` bins of the positive activations, re-binned
  from the atlas's log-spaced histogram (each log bin's count spread evenly over its width);
* a node's activation ``a`` is labelled ``"<k>pct"`` with ``k`` the first (1-based) ``quantile_values`` entry
  ``>= a``: ``quantile_values`` are the 1st, 2nd, ..., 100th percentiles of the positive activations, ascending,
  read from the same histogram by linear interpolation within a bin (the 100th is ``act_max``).
"""

from __future__ import annotations

from typing import Any

from tl_query_lens.atlas.collect import HIST_EDGES
from tl_query_lens.atlas.records import sig_round

HIST_BINS = 50
_FIRST_EDGE = float(HIST_EDGES[0])


def cantor(layer: int, index: int) -> int:
    """circuit-tracer's feature number of feature ``index`` of layer ``layer``."""
    return (layer + index) * (layer + index + 1) // 2 + index


def uncantor(z: int) -> tuple[int, int]:
    """The ``(layer, index)`` of a feature number (the inverse of :func:`cantor`)."""
    w = int(((8 * z + 1) ** 0.5 - 1) // 2)
    while (w + 1) * (w + 2) // 2 <= z:
        w += 1
    while w * (w + 1) // 2 > z:
        w -= 1
    index = z - w * (w + 1) // 2
    return w - index, index


def place(slug: str) -> tuple[str, int] | None:
    """``(set, layer)`` of an atlas slug ``"{layer}-{set}"`` (None when it does not start with a layer)."""
    layer, _, rest = slug.partition("-")
    return (rest, int(layer)) if layer.isdigit() and rest else None


def _bins(hist: dict, act_max: float) -> list[tuple[float, float, float]]:
    """``(low, high, count)`` of each log bin, the first reaching down to 0 and the last up to ``act_max``."""
    edges, counts = hist["edges"], hist["counts"]
    out = []
    for k, count in enumerate(counts):
        low, high = float(edges[k]), float(edges[k + 1])
        if k == 0 and abs(low - _FIRST_EDGE) <= 1e-6:
            low = 0.0  # the first bin of the atlas also takes everything below its edge
        if k == len(counts) - 1 or high > act_max:
            high = act_max
        out.append((min(low, high), high, float(count)))
    return out


def equal_width(hist: dict, act_max: float, n: int = HIST_BINS) -> list[float]:
    """The counts of ``hist`` spread over ``n`` equal bins of ``[0, act_max]``."""
    out = [0.0] * n
    if act_max <= 0:
        return out
    width = act_max / n
    for low, high, count in _bins(hist, act_max):
        if high <= low:
            out[min(n - 1, int(low / width))] += count
            continue
        for j in range(max(0, int(low / width)), min(n, int(high / width) + 1)):
            overlap = min(high, (j + 1) * width) - max(low, j * width)
            if overlap > 0:
                out[j] += count * overlap / (high - low)
    return [round(c, 3) for c in out]


def percentiles(hist: dict, act_max: float) -> list[float]:
    """The 1st..100th percentiles of the positive activations in ``hist`` (all 0 when there are none)."""
    bins = _bins(hist, act_max)
    total = sum(c for _, _, c in bins)
    if total <= 0:
        return [0.0] * 100
    out, seen, k = [], 0.0, 0
    for p in range(1, 101):
        target = total * p / 100
        while k < len(bins) - 1 and seen + bins[k][2] < target:
            seen += bins[k][2]
            k += 1
        low, high, count = bins[k]
        frac = min(1.0, max(0.0, (target - seen) / count)) if count else 1.0
        out.append(sig_round(low + frac * (high - low)))
    out[-1] = sig_round(act_max)
    for i in range(1, 100):  # rounding must not break the order
        out[i] = max(out[i], out[i - 1])
    return out


def feature_card(slug: str, feature: dict, strings: list[str], context_values) -> dict[str, Any]:
    """circuit-tracer's card of one atlas feature (``context_values(ctx, scale)``: a context's activations)."""
    scale = feature["scale"] or 1.0
    fired = feature["max"] is not None and feature["max"] > 0
    act_max = float(feature["max"]) if fired else 1.0

    def example(ctx: dict) -> dict[str, Any]:
        return {
            "tokens": [strings[t] for t in ctx["t"]],
            "tokens_acts_list": context_values(ctx, scale),
            "train_token_ind": int(ctx["m"]),
            "is_repeated_datapoint": False,
        }

    quantiles = [{"quantile_name": "Top activations", "examples": [example(c) for c in feature["top"]]}]
    quantiles += [{"quantile_name": b["name"], "examples": [example(c) for c in b["ex"]]} for b in feature["bands"]]
    value = feature.get("sig", {}).get("QL_VALUE") or feature.get("sig", {}).get("LL_VALUE") or {}
    return {
        "transcoder_id": slug,
        "index": int(feature["i"]),
        "examples_quantiles": quantiles,
        "top_logits": [strings[s] for s, _ in value.get("top", [])],
        "bottom_logits": [strings[s] for s, _ in value.get("bottom", [])],
        "act_min": 0.0,
        "act_max": act_max,
        "quantile_values": percentiles(feature["hist"], act_max) if fired else [0.0] * 100,
        "histogram": equal_width(feature["hist"], act_max) if fired else [0.0] * HIST_BINS,
        "activation_frequency": float(feature["density"] or 0.0),
    }
