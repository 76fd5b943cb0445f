"""What a feature page shows beyond the corpus statistics: signatures (from the Query Lens engine), module shares,
transcoder-neuron links and readout tokens.

Signatures come from :class:`~tl_query_lens.query_lens.QueryLens` only; nothing here differentiates the model.

* ``LL_VALUE`` / ``LL_KEY``: logit lens (weights only), ``QL_VALUE``: Query Lens full value signature (``M_l v``),
  ``QL_KEY``: Query Lens key signature.
* ``QL_INDIRECT``: what the feature promotes through the layers after it, without its direct path: the engine's
  full direction ``M_l v`` minus the direct term ``v``, through ``LN_f`` and ``W_U`` like every value signature.
* module shares: the engine's first-order decomposition (``QL_VALUE_1st``), per downstream module, over the
  feature's top :data:`SHARES_TOP_K` value tokens whatever ``k_tokens`` is (the demo's cards use the same k, so a card
  and its atlas page show the same shares; :func:`module_shares`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from transformer_lens import HookedTransformer

from tl_query_lens.atlas.dictionaries import AtlasDictionary
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value
from tl_query_lens.errors import InputError
from tl_query_lens.query_lens.result import readout_scores

logger = logging.getLogger(__name__)

LOGIT_HIST_BINS = 24
#: Tokens a feature's module shares are summed over (the paper's k = 25); one k for atlas pages and report cards.
SHARES_TOP_K = 25
#: Modules shown per feature (largest |share| first), on atlas pages and report cards alike.
SHARES_SHOWN = 8


def module_shares(sig, row: int) -> dict[str, float]:
    """Feature ``row``'s :data:`SHARES_SHOWN` largest first-order shares (by magnitude), module → share, from a
    ``first_order`` :class:`~tl_query_lens.query_lens.result.Signatures` computed with ``k = SHARES_TOP_K``."""
    if sig.module_shares is None:
        return {}
    shares = dict(zip(sig.module_names or [], sig.module_shares[row].tolist()))
    return dict(sorted(shares.items(), key=lambda kv: -abs(kv[1]))[:SHARES_SHOWN])


@dataclass
class SignatureLists:
    """Top / bottom token ids and scores of one signature method for the unit's features (``[n, k]`` each)."""

    top_ids: torch.Tensor
    top_scores: torch.Tensor
    bottom_ids: torch.Tensor | None = None
    bottom_scores: torch.Tensor | None = None


@dataclass
class UnitSignatures:
    """Everything signature-like of one unit of features.

    Attributes:
        lists: method name → lists. shares: ``[n, n_terms]`` first-order shares with their ``share_names``.
        logit_hist: ``(edges [n, bins+1], counts [n, bins])`` of the logit-lens value scores over the vocabulary.
        missing: method name → why it is not shown.
    """

    lists: dict[str, SignatureLists] = field(default_factory=dict)
    shares: torch.Tensor | None = None
    share_names: list[str] | None = None
    logit_hist: tuple[torch.Tensor, torch.Tensor] | None = None
    missing: dict[str, str] = field(default_factory=dict)


def _lists(sig) -> SignatureLists:
    return SignatureLists(sig.top_ids, sig.top_scores, sig.bottom_ids, sig.bottom_scores)


def _vocab_topk(scores: torch.Tensor, k: int) -> SignatureLists:
    high, low = scores.topk(k, dim=-1), scores.topk(k, dim=-1, largest=False)
    return SignatureLists(high.indices.cpu(), high.values.float().cpu(), low.indices.cpu(), low.values.float().cpu())


def unit_signatures(
    lens, model: HookedTransformer, dictionary: AtlasDictionary, ids: torch.Tensor, k: int, basis: str
) -> UnitSignatures:
    """Signatures of features ``ids`` of ``dictionary`` (a method the dictionary does not allow is recorded in
    ``missing`` with the engine's reason)."""
    out = UnitSignatures()
    sae = dictionary.view  # built once when the dictionary was loaded; the lens takes it as it is

    def attempt(name: str, call) -> Any:
        try:
            return call()
        except (ValueError, TypeError, InputError, NotImplementedError) as err:
            out.missing[name] = str(err).splitlines()[0][:300]
            logger.info("%s %s: %s unavailable (%s)", dictionary.slug, len(ids), name, out.missing[name])
            return None

    ll_value = attempt("LL_VALUE", lambda: lens.value_signatures(sae, ids, k=k, method="logit_lens", basis=basis))
    if ll_value is not None:
        out.lists["LL_VALUE"] = _lists(ll_value)
        out.logit_hist = logit_histograms(model, ll_value)
    full = attempt("QL_VALUE", lambda: lens.value_signatures(sae, ids, k=k, method="full", basis=basis))
    if full is not None:
        out.lists["QL_VALUE"] = _lists(full)
        indirect = attempt("QL_INDIRECT", lambda: _indirect(lens, model, sae, ids, k, basis))
        if indirect is not None:
            out.lists["QL_INDIRECT"] = indirect
    first = attempt(
        "QL_VALUE_1st", lambda: lens.value_signatures(sae, ids, k=SHARES_TOP_K, method="first_order", basis=basis)
    )
    if first is not None and first.module_shares is not None:
        out.shares, out.share_names = first.module_shares, list(first.module_names or [])
    ll_key = attempt("LL_KEY", lambda: lens.key_signatures(sae, ids, k=k, method="logit_lens", basis=basis))
    if ll_key is not None:
        out.lists["LL_KEY"] = _lists(ll_key)
    ql_key = attempt("QL_KEY", lambda: lens.key_signatures(sae, ids, k=k, method="full", basis=basis))
    if ql_key is not None:
        out.lists["QL_KEY"] = _lists(ql_key)
    return out


@torch.no_grad()
def _indirect(lens, model, view: KeyValueView, ids, k: int, basis: str) -> SignatureLists:
    if view.value_source is not None:
        raise ValueError("the direct term of a post-norm dictionary is no fixed direction; only the full signature")
    full = lens.value_directions(view, ids, method="full", basis=basis)
    direct = lens.value_directions(view, ids, method="logit_lens", basis=basis)
    raw = (full - direct.to(full)).to(model.cfg.dtype)
    directions = model.ln_final(raw[None])[0].float()  # LN_f on the direction itself, as for every value signature
    scores = readout_scores(model, directions, "unembed", False, None)
    return _vocab_topk(scores, k)


@torch.no_grad()
def logit_histograms(model, sig, bins: int = LOGIT_HIST_BINS, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Histogram of each feature's logit-lens scores over the whole vocabulary (Neuronpedia's logits histogram)."""
    edges, counts = [], []
    for start in range(0, len(sig), chunk):
        scores = readout_scores(model, sig.directions[start : start + chunk], sig.readout, sig.add_bias, sig.center)
        lo, hi = scores.amin(1, keepdim=True), scores.amax(1, keepdim=True)
        width = (hi - lo).clamp_min(1e-12) / bins
        index = ((scores - lo) / width).long().clamp(0, bins - 1)
        count = torch.zeros(scores.shape[0], bins, dtype=torch.long, device=scores.device)
        count.scatter_add_(1, index, torch.ones_like(index))
        edges.append((lo + width * torch.arange(bins + 1, device=scores.device)).cpu())
        counts.append(count.cpu())
    return torch.cat(edges), torch.cat(counts)


@torch.no_grad()
def neuron_links(
    model: HookedTransformer, dictionaries: list[AtlasDictionary], n_links: int
) -> dict[str, dict[int, list[tuple[str, int, float]]]]:
    """Transcoder feature ↔ MLP neuron links by the cosine of their value (decoder) directions.

    Each transcoder of layer l gets its ``n_links`` best neurons of layer l's MLP (the FF-KV dictionary's values
    ``W_out``), and each neuron its ``n_links`` best features of every such transcoder. Returns slug → feature →
    ``[(target slug, target feature, cosine)]``; the target slug of a neuron is ``"{l}-ffkv"``.
    """
    links: dict[str, dict[int, list[tuple[str, int, float]]]] = {}
    for dictionary in dictionaries:
        if dictionary.kind != "transcoder" or not dictionary.write_hook.endswith("hook_mlp_out"):
            continue
        layer = dictionary.layer
        neurons = FFKV.from_model(model, layer)
        rows = dictionary.view.values.float()
        cols = as_key_value(neurons).values.float()  # the model's own W_out: no hooks to check
        cos = torch.nn.functional.normalize(rows, dim=1) @ torch.nn.functional.normalize(cols, dim=1).T
        n = min(n_links, cos.shape[1])
        best = cos.topk(n, dim=1)
        target = f"{layer}-ffkv"
        forward = links.setdefault(dictionary.slug, {})
        for f, (idx, val) in enumerate(zip(best.indices.tolist(), best.values.tolist())):
            forward[f] = [(target, i, round(v, 4)) for i, v in zip(idx, val)]
        back = cos.T.topk(min(n_links, cos.shape[0]), dim=1)
        reverse = links.setdefault(target, {})
        for f, (idx, val) in enumerate(zip(back.indices.tolist(), back.values.tolist())):
            reverse.setdefault(f, []).extend((dictionary.slug, i, round(v, 4)) for i, v in zip(idx, val))
    return links


@torch.no_grad()
def readout_tokens(dictionary: AtlasDictionary, n: int) -> dict[int, list[tuple[int, float]]]:
    """Readout SAE: each feature's vocabulary rows with the largest stored codes (the tokens it reads out)."""
    sae = dictionary.sae
    if dictionary.kind != "readout" or not hasattr(sae, "code_indices"):
        return {}
    idx = sae.code_indices.reshape(-1).long().cpu()
    val = sae.code_values.reshape(-1).float().cpu()
    rows = torch.arange(sae.code_indices.shape[0]).repeat_interleave(sae.code_indices.shape[1])
    order = torch.argsort(val, descending=True, stable=True)
    order = order[torch.argsort(idx[order], stable=True)]  # by feature, then by code, largest first
    out: dict[int, list[tuple[int, float]]] = {}
    for position in order.tolist():
        feature = int(idx[position])
        picked = out.setdefault(feature, [])
        if len(picked) < n and float(val[position]) > 0:
            picked.append((int(rows[position]), round(float(val[position]), 4)))
    return out
