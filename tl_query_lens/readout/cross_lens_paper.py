"""Cross-lens check on a prompt bank, under the Sparse Readout Prism authors' protocol or this project's (docs/design.md §6).

Two Jacobian lenses h̃ = LN_f(M_l h) (``M_l`` fitted on two corpora) decode the same frozen final-position residuals of
a bank of prompts whose answer is one token. Per prompt, lens and layer, a score is decomposed into readout features
and its dominant feature is argmax_i |c_i| over the row's active features (the μ term is not a feature).

``protocol="paper"`` (hematteo/sparse-readout-prism, checked): the score is the logit of ONE FIXED token, the same
under both lenses (the bank's expected answer, or the model's own top-1); a prompt passes when the same feature
dominates on at least ``min_votes`` (2) of the mid-band layers (4); nulls: the answer vs an unrelated token within
lens A, and prompt i under lens A vs prompt j (another concept) under lens B, three seeded draws per prompt; controls
are reported apart from the headline; Wilson intervals.
``protocol="tlql"`` (this project's ``cross_lens_check``; formerly ``"own-top1"``): each lens scores its OWN top-1 token against the
vocabulary mean, per layer, no vote — a harder test, since the two lenses may pick different tokens.
Both are computed on the same states and lenses in one pass (they share the decompositions), so both live in this
file rather than in ``readout/protocols/``; ``protocol`` picks the headline.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int

from tl_query_lens.config import resolve_config
from tl_query_lens.presentation import Table
from tl_query_lens.readout.config import CrossLensConfig
from tl_query_lens.readout.cross_lens import jacobian_lens
from tl_query_lens.readout.sae import ReadoutSAE, check_compatible, unembedding_rows
from tl_query_lens.results import SavableResult
from tl_query_lens.tensor_checks import check_dictionary_finite

BANK_FILE = "cross_lens_prompts_en.json"
# The authors' mid band on their model is layers 21/24/26/29 (late-middle); the same depth fractions here.
MID_BAND_FRACTIONS = (0.68, 0.77, 0.84, 0.94)


def load_prompt_bank(path: str | None = None) -> list[dict[str, Any]]:
    """The prompt bank: the package's English bank (92 prompts: 80 in 7 families + 12 controls) or a JSON file of the
    same schema (``{"prompts": [{id, group, concept, prompt, answer, null_targets}]}``)."""
    if path is None:
        text = resources.files("tl_query_lens.readout").joinpath("data", BANK_FILE).read_text(encoding="utf-8")
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    prompts = json.loads(text)["prompts"]
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"Duplicate prompt ids in the bank: {sorted({i for i in ids if ids.count(i) > 1})}.")
    return prompts


def mid_band_layers(n_layers: int) -> list[int]:
    """Four late-middle layers at the depth fractions of the authors' band (30 layers → 20, 22, 24, 27)."""
    return sorted({round((n_layers - 1) * f) for f in MID_BAND_FRACTIONS})


def dominant_active(
    contributions: Float[torch.Tensor, "n d_sae"], beta: Float[torch.Tensor, " d_sae"]
) -> Int[torch.Tensor, " n"]:
    """argmax_i |c_i| over the active features (β_i ≠ 0); -1 where no feature is active."""
    active = beta != 0
    if not bool(active.any()):
        return torch.full((contributions.shape[0],), -1, dtype=torch.long)
    masked = contributions.abs().masked_fill(~active, -1.0)
    return masked.argmax(-1)


def majority_same(
    dom_a: Int[torch.Tensor, "... layer"], dom_b: Int[torch.Tensor, "... layer"], *, min_votes: int
) -> torch.Tensor:
    """True where the same feature (≠ -1) dominates on at least ``min_votes`` layers (the last axis)."""
    same = (dom_a == dom_b) & (dom_a >= 0)
    return same.sum(-1) >= min_votes


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval [low, high] of k successes in n (the authors' interval)."""
    if n == 0:
        return [0.0, 1.0]
    p, d = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, centre - half), min(1.0, centre + half)]


@dataclass
class CrossLensPromptResult(SavableResult):
    """Cross-lens agreement on a prompt bank under both definitions.

    Attributes:
        protocol: which definition is the headline; ``headline`` / ``headline_ci`` its value (Wilson interval).
        layers: the mid band. min_votes: the vote threshold. n_prompts / n_controls: prompts scored.
        paper_agreement: share of non-control prompts passing the vote (fixed token); ``paper_agreement_ci``.
        control_agreement: the same on the controls.
        null_unrelated: vote agreement of the answer vs an unrelated token within lens A.
        null_shuffled: vote agreement of prompt i (lens A) vs prompt j of another concept (lens B).
        own_top1_agreement: per (prompt, layer), share with the same dominant feature when each lens scores its own
            top-1 against the vocabulary mean (this project's definition), non-control prompts.
        own_top1_tokens_differ: share of (prompt, layer) whose two lens top-1 tokens differ.
        model_top1_is_answer: share of prompts where the clean model's next token is the bank's answer.
        per_group: group → {"pass", "n", "rate"}.
        ids / groups: prompt order. target_tokens: the fixed token per prompt.
        dominant_a / dominant_b: [prompt, layer] dominant features of the fixed token under lens A / B.
        passes: [prompt] vote result.
    """

    protocol: str
    headline: float
    headline_ci: list[float]
    layers: list[int]
    min_votes: int
    n_prompts: int
    n_controls: int
    paper_agreement: float
    paper_agreement_ci: list[float]
    control_agreement: float
    null_unrelated: float
    null_shuffled: float
    own_top1_agreement: float
    own_top1_tokens_differ: float
    model_top1_is_answer: float
    per_group: dict[str, dict[str, float]]
    ids: list[str]
    groups: list[str]
    target_tokens: torch.Tensor
    dominant_a: torch.Tensor
    dominant_b: torch.Tensor
    passes: torch.Tensor
    config: dict[str, Any] = field(default_factory=dict)

    title: ClassVar[str] = "Cross-lens agreement on a prompt bank"

    def tables(self) -> dict[str, Table]:
        """``per_group``: vote passes, prompts and pass rate per concept group."""
        columns = {"group": str, "pass": int, "n": int, "rate": float}
        rows = ([g, int(d["pass"]), int(d["n"]), d["rate"]] for g, d in self.per_group.items())
        return {"per_group": Table.build(columns, rows)}


@torch.no_grad()
def final_residuals(model, prompts: list[str | list[int]], hooks: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals at the final position of each prompt ``[prompt, hook, d_model]`` and the clean model's next token.

    A prompt is a string (tokenized with ``model.to_tokens``, BOS prepended as the model does) or a list of token ids.
    """
    resid, top1 = [], []
    for text in prompts:
        tokens = torch.tensor([text]) if isinstance(text, list) else model.to_tokens(text)
        logits, cache = model.run_with_cache(tokens, names_filter=hooks)
        resid.append(torch.stack([cache[h][0, -1] for h in hooks]))
        top1.append(int(logits[0, -1].argmax()))
    return torch.stack(resid).float(), torch.tensor(top1)


def bank_states(model, bank: list[dict[str, Any]], layers: list[int]) -> Float[torch.Tensor, "prompt layer d_model"]:
    """The bank's final-position residuals at ``blocks.l.hook_resid_post`` — the feature basis of a pushed lens.
    (``final_residuals`` gives them with the model's next tokens, which ``cross_lens_prompts(states=...)`` reuses.)"""
    return final_residuals(model, [p["prompt"] for p in bank], [f"blocks.{layer}.hook_resid_post" for layer in layers])[
        0
    ]


def lens_images(model, operator: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """``LN_f(M h)`` for each state: from the full ``M`` ``[d, d]``, or from ``M Hᵀ`` ``[d, n]`` pushed on ``states``."""
    d, n = model.cfg.d_model, states.shape[0]
    if operator.shape == (d, d):
        return jacobian_lens(model, operator)(states.to(model.W_U))
    if operator.shape != (d, n):
        raise ValueError(
            f"A lens operator must be the full M [{d}, {d}] or M Hᵀ [{d}, {n}] pushed on the bank's {n} states "
            f"(value_operators(..., basis=bank_states(...)[:, layer_index])), not {tuple(operator.shape)}."
        )
    pushed = operator.detach().to(model.W_U).T
    ln = getattr(model, "ln_final", None)
    return ln(pushed) if ln is not None else pushed


def _first_token(model, text: str | int) -> int:
    if isinstance(text, int):
        return text
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError(f"{text!r} encodes to no tokens; give every bank answer and null a non-empty string.")
    return int(ids[0])


class DominantFeatures:
    """argmax_i |c_i| over active features for the two scores the check uses, without a full decomposition per call.

    :func:`~tl_query_lens.readout.decompose.decompose_rows` gives c_i = β_i (h·d_i) with β = Σ_t α_t z_t; for a token's
    logit (α = e_t) β is the row's own code z_t, and for its vocabulary-mean contrast (α = e_t − 1/|V|) β = z_t − z̄,
    where z̄ = mean_t z_t is summed once here. Same float64 arithmetic as ``decompose_rows`` (checked against it in
    tests/test_cross_lens_paper.py); one dictionary check instead of one per call.
    """

    def __init__(self, sae: ReadoutSAE):
        check_dictionary_finite(sae, {"W_dec": sae.W_dec, "code_values": sae.code_values})
        self.sae = sae
        self.D = sae.W_dec.detach().double()
        idx, val = sae.row_codes()
        self.code_mean = self._beta(idx, val) / sae.cfg.d_vocab

    def _beta(self, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros(self.sae.cfg.d_sae, dtype=torch.float64, device=self.D.device)
        return zero.index_add_(0, idx.reshape(-1).to(self.D.device), val.reshape(-1).to(self.D))

    def projections(self, h: Float[torch.Tensor, "n d_model"]) -> Float[torch.Tensor, "n d_sae"]:
        """h·d_i for every state and feature (computed once per lens and layer)."""
        return h.to(self.D) @ self.D.T

    def __call__(self, proj: Float[torch.Tensor, " d_sae"], token: int, *, vocab_mean: bool = False) -> int:
        idx, val = self.sae.row_codes(torch.tensor([token]))
        beta = self._beta(idx, val)
        if vocab_mean:
            beta = beta - self.code_mean
        return int(dominant_active((proj.to(beta) * beta)[None], beta)[0])


@torch.no_grad()
def cross_lens_prompts(
    model,
    sae: ReadoutSAE,
    operators_a: dict[int, torch.Tensor],
    operators_b: dict[int, torch.Tensor],
    bank: list[dict[str, Any]] | None = None,
    *,
    states: tuple[torch.Tensor, torch.Tensor] | None = None,
    cfg: CrossLensConfig | None = None,
    **overrides: Any,
) -> CrossLensPromptResult:
    """Do two Jacobian lenses attribute the same readout feature on a prompt bank? (docs/design.md §6, module docstring.)

    Args:
        model: the model (tokenizer, LN_f, W_U).
        sae: readout SAE of ``model``.
        operators_a / operators_b: layer → value operator fitted on two corpora; must cover ``cfg.layers``. Either
            the full ``M_l`` ``[d_model, d_model]`` (``value_operators(...)["blocks.l.hook_resid_post"]``) or, much
            cheaper, ``M_l Hᵀ`` ``[d_model, n_bank]``: the engine's feature basis pushing only the bank's own states
            ``H = bank_states(model, bank, layers)[:, j]`` (``value_operators(..., basis=H)``), whose columns are the
            lens images ``M_l h_i`` the check needs (the same numbers as the full operator; when ``n_bank == d_model``
            a square operator is read as the full one).
        bank: prompts (default :func:`load_prompt_bank`).
        states: ``final_residuals(model, prompts, hooks of cfg.layers)`` of this bank, when the caller already has
            them (e.g. from building the pushed lenses): the bank is then not run again. None: computed here.
        cfg: options; keywords override its fields.
    """
    cfg = resolve_config(CrossLensConfig, cfg, overrides)
    check_compatible(sae, model)
    bank = bank if bank is not None else load_prompt_bank()
    layers = cfg.layers or mid_band_layers(model.cfg.n_layers)
    missing = [layer for layer in layers if layer not in operators_a or layer not in operators_b]
    if missing:
        raise KeyError(
            f"Layers {missing} have no operator in both lenses; fit value_operators at "
            f"{[f'blocks.{layer}.hook_resid_post' for layer in missing]} on both corpora."
        )
    if cfg.min_votes > len(layers):
        raise ValueError(f"min_votes={cfg.min_votes} exceeds the {len(layers)} layers of the band.")
    rows = unembedding_rows(model)
    b_U = model.b_U.detach().float()
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    if states is None:
        states = final_residuals(model, [p["prompt"] for p in bank], hooks)
    resid, model_top1 = states
    if resid.shape[:2] != (len(bank), len(layers)) or model_top1.shape != (len(bank),):
        raise ValueError(
            f"states must be final_residuals(...) of the {len(bank)} prompts at layers {layers}: residuals "
            f"[{len(bank)}, {len(layers)}, d_model] and next tokens [{len(bank)}], got {tuple(resid.shape)} and "
            f"{tuple(model_top1.shape)}."
        )
    answers = torch.tensor([_first_token(model, p["answer"]) for p in bank])
    targets = answers if cfg.target == "answer" else model_top1
    nulls = [[_first_token(model, t) for t in p.get("null_targets", [])] for p in bank]
    n, n_layers = len(bank), len(layers)
    dom_a = torch.full((n, n_layers), -1, dtype=torch.long)
    dom_b = torch.full_like(dom_a, -1)
    own_same = torch.zeros(n, n_layers, dtype=torch.bool)
    own_differ = torch.zeros_like(own_same)
    null_dom = [[[-1] * n_layers for _ in p] for p in nulls]
    dominant = DominantFeatures(sae)
    for j, layer in enumerate(layers):
        h_a = lens_images(model, operators_a[layer], resid[:, j]).float()
        h_b = lens_images(model, operators_b[layer], resid[:, j]).float()
        top_a = (h_a @ rows.T + b_U).argmax(-1)
        top_b = (h_b @ rows.T + b_U).argmax(-1)
        proj_a, proj_b = dominant.projections(h_a), dominant.projections(h_b)
        for i in range(n):
            t = int(targets[i])
            dom_a[i, j] = dominant(proj_a[i], t)
            dom_b[i, j] = dominant(proj_b[i], t)
            for m, null in enumerate(nulls[i]):
                null_dom[i][m][j] = dominant(proj_a[i], null)
            own_a = dominant(proj_a[i], int(top_a[i]), vocab_mean=True)
            own_b = dominant(proj_b[i], int(top_b[i]), vocab_mean=True)
            own_same[i, j] = own_a == own_b
            own_differ[i, j] = bool(top_a[i] != top_b[i])
    passes = majority_same(dom_a, dom_b, min_votes=cfg.min_votes)
    groups = [p["group"] for p in bank]
    is_ctrl = torch.tensor([g.startswith("ctrl_") for g in groups])
    main = ~is_ctrl
    k, m = int(passes[main].sum()), int(main.sum())
    null_hits = [
        bool(majority_same(dom_a[i], torch.tensor(d), min_votes=cfg.min_votes))
        for i in range(n)
        if main[i]
        for d in null_dom[i]
    ]
    rng = random.Random(cfg.seed)
    main_ids = [i for i in range(n) if main[i]]
    shuffle_hits = []
    for i in main_ids:
        others = [o for o in main_ids if bank[o]["concept"] != bank[i]["concept"]]
        for o in rng.sample(others, min(cfg.n_shuffle, len(others))):
            shuffle_hits.append(bool(majority_same(dom_a[i], dom_b[o], min_votes=cfg.min_votes)))
    per_group = {}
    for g in sorted(set(groups)):
        sel = torch.tensor([x == g for x in groups])
        per_group[g] = {"pass": int(passes[sel].sum()), "n": int(sel.sum()), "rate": passes[sel].float().mean().item()}
    paper = k / m if m else float("nan")
    own = own_same[main].float().mean().item() if m else float("nan")
    headline, ci = (paper, wilson(k, m)) if cfg.protocol == "paper" else (own, [float("nan"), float("nan")])
    return CrossLensPromptResult(
        protocol=cfg.protocol,
        headline=headline,
        headline_ci=ci,
        layers=list(layers),
        min_votes=cfg.min_votes,
        n_prompts=m,
        n_controls=int(is_ctrl.sum()),
        paper_agreement=paper,
        paper_agreement_ci=wilson(k, m),
        control_agreement=passes[is_ctrl].float().mean().item() if is_ctrl.any() else float("nan"),
        null_unrelated=sum(null_hits) / len(null_hits) if null_hits else float("nan"),
        null_shuffled=sum(shuffle_hits) / len(shuffle_hits) if shuffle_hits else float("nan"),
        own_top1_agreement=own,
        own_top1_tokens_differ=own_differ[main].float().mean().item() if m else float("nan"),
        model_top1_is_answer=(model_top1 == answers).float().mean().item(),
        per_group=per_group,
        ids=[p["id"] for p in bank],
        groups=groups,
        target_tokens=targets,
        dominant_a=dom_a,
        dominant_b=dom_b,
        passes=passes,
        config=dict(vars(cfg)) | {"layers": list(layers)},
    )
