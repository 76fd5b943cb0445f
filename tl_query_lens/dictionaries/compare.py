"""The FF-KV paper's comparison (arXiv 2510.22332) of any list of dictionaries on one model, with a random-model control.

Per dictionary: alive rate, L0, explained variance, CE / KL change of the splice (:func:`splice_metrics`) and
first-letter absorption (:mod:`absorption`); per transcoder: the share of features with a matching FF-KV neuron
(:mod:`faithfulness`). The control is the paper's "random transformer": the same ``HookedTransformerConfig`` with
seeded random weights, FF-KV on it, scored on the same tokens and prompts.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from jaxtyping import Int
from sae_lens import SAE, HookedSAETransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.dictionaries.absorption import first_letter_absorption, first_letter_activations
from tl_query_lens.dictionaries.config import AbsorptionConfig, CompareConfig, FaithfulnessConfig
from tl_query_lens.dictionaries.faithfulness import transcoder_faithfulness
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.dictionaries.splice import splice_metrics
from tl_query_lens.presentation import Table
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


@dataclass
class DictionaryComparison(SavableResult):
    """One table of dictionaries (rows) and one of transcoder faithfulness, with the config and timings.

    Attributes:
        rows: one dict per dictionary: label, model ("trained" / "random"), kind, layer, read/write hooks,
            alive_rate, mean_l0, explained_variance, ce_clean, ce_delta, kl, absorption_fraction,
            full_absorption, absorption_letters, absorption_note.
        faithfulness: one dict per transcoder (and per random-model control): label, layer and the
            :class:`FaithfulnessResult` scalars.
        absorption: label → per-letter absorption details.
        config: the :class:`CompareConfig` used.
        times: seconds per stage.
    """

    rows: list
    faithfulness: list
    absorption: dict
    config: dict
    times: dict

    COLUMN_TYPES: ClassVar[dict[str, type | tuple[type, None]]] = {
        "label": str,
        "model": str,
        "kind": str,
        "layer": (int, None),
        "alive_rate": float,
        "mean_l0": float,
        "explained_variance": float,
        "ce_delta": float,
        "kl": float,
        "absorption_fraction": (float, None),
        "full_absorption": (float, None),
        "absorption_letters": (int, None),
    }
    COLUMNS = tuple(COLUMN_TYPES)
    FAITHFULNESS_METRICS = (
        "share_matched",
        "null_share_matched",
        "share_matched_enc",
        "share_matched_dec",
        "share_matched_same",
        "mean_max_cos_enc",
        "null_mean_max_cos_enc",
        "mean_max_cos_dec",
        "null_mean_max_cos_dec",
    )
    FAITHFULNESS_COLUMNS = ("label", "layer", *FAITHFULNESS_METRICS)

    def table(self) -> list[list]:
        """The rows as lists in :attr:`COLUMNS` order."""
        return [[row.get(c) for c in self.COLUMNS] for row in self.rows]

    def faithfulness_table(self) -> list[list]:
        return [[row.get(c) for c in self.FAITHFULNESS_COLUMNS] for row in self.faithfulness]

    FAITHFULNESS_TYPES: ClassVar[dict[str, type | tuple[type, None]]] = {
        "label": str,
        "layer": (int, None),
        **dict.fromkeys(FAITHFULNESS_METRICS, float),
    }
    title: ClassVar[str] = "Dictionaries compared (FF-KV paper)"

    def scalars(self) -> dict[str, float]:
        """Seconds per stage (``seconds/{stage}``); the per-dictionary numbers are in the tables."""
        return {f"seconds/{k}": float(v) for k, v in self.times.items()}

    def tables(self) -> dict[str, Table]:
        """``comparison``: one row per dictionary; ``faithfulness``: one row per transcoder (and control)."""
        return {
            "comparison": Table.build(self.COLUMN_TYPES, self.table()),
            "faithfulness": Table.build(self.FAITHFULNESS_TYPES, self.faithfulness_table()),
        }


def dictionary_kind(sae: SAE) -> str:
    """``"ffkv:<variant>"``, ``"transcoder"`` (reads one hook, writes another) or ``"sae"``."""
    if sae.cfg.architecture() == "ffkv":
        return f"ffkv:topk{sae.cfg.k}" if sae.cfg.variant == "topk" else f"ffkv:{sae.cfg.variant}"
    view = as_key_value(sae)
    return "transcoder" if view.write_hook != view.read_hook else "sae"


def random_model_like(model: HookedSAETransformer, *, seed: int = 0) -> HookedSAETransformer:
    """A model of the same config with seeded random weights (TransformerLens' own init) and the same tokenizer.

    The global RNG is left as it was.
    """
    cfg = copy.deepcopy(model.cfg)
    cfg.seed, cfg.init_weights = None, True  # cfg.seed would reseed every global RNG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random_model = HookedSAETransformer(cfg, tokenizer=model.tokenizer)
    return random_model.to(model.cfg.device).eval()


def _hooks(dictionaries: Mapping[str, SAE]) -> list[str]:
    views = [as_key_value(d) for d in dictionaries.values()]
    return list(dict.fromkeys(h for v in views for h in (v.read_hook, v.write_hook)))


def _score(
    label: str, model_name: str, model: HookedSAETransformer, sae: SAE, tokens: torch.Tensor, data, cfg: CompareConfig
) -> tuple[dict, dict | None]:
    view = as_key_value(sae, model)
    splice = splice_metrics(
        model, sae, tokens, batch_size=cfg.batch_size, exclude_first_positions=cfg.exclude_first_positions
    )
    row = {
        "label": label,
        "model": model_name,
        "kind": dictionary_kind(sae),
        "layer": view.layer,
        "read_hook": view.read_hook,
        "write_hook": view.write_hook,
        "d_sae": view.d_sae,
        "alive_rate": splice.alive_rate,
        "mean_l0": splice.mean_l0,
        "explained_variance": splice.explained_variance,
        "ce_clean": splice.ce_clean,
        "ce_delta": splice.ce_delta,
        "kl": splice.kl,
        "absorption_fraction": None,
        "full_absorption": None,
        "absorption_letters": None,
        "absorption_note": "",
    }
    details = None
    if data is not None:
        result = first_letter_absorption(sae, data, cfg=cfg.absorption)
        row.update(
            absorption_fraction=result.mean_absorption_fraction,
            full_absorption=result.mean_full_absorption,
            absorption_letters=result.n_letters,
            absorption_note=result.note,
        )
        details = result.per_letter
    logger.info(
        "%s (%s): L0 %.1f, EV %.3f, CE change %+.4f, absorption %s",
        label,
        model_name,
        splice.mean_l0,
        splice.explained_variance,
        splice.ce_delta,
        row["absorption_fraction"],
    )
    return row, details


def compare_dictionaries(
    model: HookedSAETransformer,
    dictionaries: Mapping[str, SAE],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    cfg: CompareConfig | None = None,
    **overrides,
) -> DictionaryComparison:
    """Score ``dictionaries`` (label → SAELens SAE / transcoder / FF-KV, all on ``model``) on ``tokens``.

    Adds the random-model FF-KV control for every layer that appears (``cfg.random_control``) and, for every
    transcoder, its faithfulness to the same layer's FF-KV (and the random model's FF-KV as a null reference).
    """
    cfg = resolve_config(CompareConfig, cfg, overrides)
    if isinstance(cfg.absorption, dict):
        cfg.absorption = AbsorptionConfig(**cfg.absorption)
    if isinstance(cfg.faithfulness, dict):
        cfg.faithfulness = FaithfulnessConfig(**cfg.faithfulness)
    if not dictionaries:
        raise ValueError("compare_dictionaries needs at least one dictionary (label → SAE).")
    times: dict[str, float] = {}
    rows, faithfulness, absorption = [], [], {}

    start = time.perf_counter()
    data = first_letter_activations(model, _hooks(dictionaries), cfg=cfg.absorption) if cfg.absorption else None
    times["first_letter_prompts"] = time.perf_counter() - start
    start = time.perf_counter()
    for label, sae in dictionaries.items():
        row, details = _score(label, "trained", model, sae, tokens, data, cfg)
        rows.append(row)
        if details is not None:
            absorption[label] = details
    times["dictionaries"] = time.perf_counter() - start

    layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
    start = time.perf_counter()
    controls: dict[int, SAE] = {}
    if cfg.random_control and layers:
        random_model = random_model_like(model, seed=cfg.seed)
        control = {}
        for layer in layers:
            for variant in cfg.control_variants:
                k = _control_k(rows, layer, cfg) if variant == "topk" else None
                name = f"random FF-KV {variant}{k or ''} L{layer}"
                control[name] = FFKV.from_model(random_model, layer, variant, k)  # type: ignore[arg-type]
                if variant == "vanilla":
                    controls[layer] = control[name]
        r_data = first_letter_activations(random_model, _hooks(control), cfg=cfg.absorption) if cfg.absorption else None
        for label, sae in control.items():
            row, details = _score(label, "random", random_model, sae, tokens, r_data, cfg)
            rows.append(row)
            if details is not None:
                absorption[label] = details
        del random_model
    times["random_control"] = time.perf_counter() - start

    start = time.perf_counter()
    for label, sae in dictionaries.items():
        if dictionary_kind(sae) != "transcoder":
            continue
        layer = as_key_value(sae).layer
        assert layer is not None  # a transcoder writes inside a block
        reference = FFKV.from_model(model, layer, "vanilla")
        faithfulness.append(_faithfulness_row(label, layer, sae, reference, cfg))
    for layer, sae in controls.items():  # the null in real shapes: random-model FF-KV against the trained one
        faithfulness.append(
            _faithfulness_row(
                f"random FF-KV vanilla L{layer}", layer, sae, FFKV.from_model(model, layer, "vanilla"), cfg
            )
        )
    times["faithfulness"] = time.perf_counter() - start
    return DictionaryComparison(
        rows=rows, faithfulness=faithfulness, absorption=absorption, config=asdict(cfg), times=times
    )


def _control_k(rows: list[dict], layer: int, cfg: CompareConfig) -> int:
    if cfg.control_k is not None:
        return cfg.control_k
    for row in rows:
        if row["layer"] == layer and row["kind"].startswith("ffkv:topk"):
            return int(row["kind"].removeprefix("ffkv:topk"))
    return 32


def _faithfulness_row(label: str, layer: int, sae: SAE, reference: SAE, cfg: CompareConfig) -> dict:
    result = transcoder_faithfulness(sae, reference, cfg=cfg.faithfulness)
    scalars = {k: v for k, v in asdict(result).items() if not isinstance(v, torch.Tensor)}
    return {"label": label, "layer": layer, **scalars}
