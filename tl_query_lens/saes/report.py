"""Quality of each trained dictionary on the evaluation split: L0, alive share, EV, CE-loss recovered, KL.

CE-loss recovered = (CE_zero − CE_splice) / (CE_zero − CE_clean), with CE_zero the loss when the dictionary's
write hook is zero-ablated (the residual stream at ``blocks.L.hook_resid_post`` for an SAE, the MLP output
``blocks.L.hook_mlp_out`` for a transcoder). The statistics are summed by the same accumulator as
:func:`tl_query_lens.dictionaries.splice.splice_metrics` (:class:`~tl_query_lens.dictionaries.splice.SpliceStats`),
but the forward passes differ: every dictionary is measured from ONE clean forward pass per batch, and the splice and
the ablation restart the model at block L+1 (``start_at_layer``) from the edited residual, instead of rerunning the
whole model per dictionary (tests check that both give the same figures on the same dictionary).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Int
from sae_lens import SAE, HookedSAETransformer
from safetensors.torch import load_file
from tqdm.auto import tqdm

from tl_query_lens.config import check_first_positions
from tl_query_lens.dictionaries.splice import SpliceStats
from tl_query_lens.hooks import check_hook, hook_layer
from tl_query_lens.presentation import Table
from tl_query_lens.primitives import write_from
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)

#: The columns that name a dictionary, then its metrics (keys of ``SpliceStats.metrics()``, plus ``dead_rate``), then
#: the tokens scored. A new metric is one more name in :data:`METRICS`; nothing slices these lists by position.
ID_COLUMNS = ["sae_id", "kind", "layer", "d_sae"]
METRICS = [
    "mean_l0",
    "alive_rate",
    "dead_rate",
    "explained_variance",
    "ce_clean",
    "ce_spliced",
    "ce_zero",
    "ce_recovered",
    "kl",
]
COLUMNS = [*ID_COLUMNS, *METRICS, "n_tokens"]


_SAELENS_CELLS = [(k, ".1f" if k == "mean_l0" else ".3f") for k in ("mean_l0", "explained_variance", "ce_clean")]
_SAELENS_CELLS += [(k, ".3f") for k in ("ce_spliced", "ce_zero", "ce_recovered", "kl")]


def _pair(theirs: dict, ours: dict, key: str, fmt: str) -> str:
    """``theirs / ours`` of one figure (``theirs`` alone where the project has no row)."""
    return f"{theirs[key]:{fmt}} / {ours[key]:{fmt}}" if key in ours else f"{theirs[key]:{fmt}}"


@dataclass
class SuiteQuality(SavableResult):
    """One row per dictionary (keys: :data:`COLUMNS`), plus the run's facts."""

    rows: list[dict[str, Any]]
    n_tokens: int
    seconds: float
    config: dict[str, Any] = field(default_factory=dict)
    #: ``--protocol saelens``: SAELens' ``run_evals`` of the residual SAEs on the same windows
    #: (:func:`tl_query_lens.saes.saelens_eval.saelens_quality`), one row per SAE.
    saelens: list[dict[str, Any]] = field(default_factory=list)
    #: ``--protocol saebench``: SAEBench's core ``run_evals`` of the residual SAEs on the same windows
    #: (:func:`tl_query_lens.saes.saebench_eval.saebench_quality`), one row per SAE.
    saebench: list[dict[str, Any]] = field(default_factory=list)

    def row(self, sae_id: str) -> dict[str, Any]:
        for row in self.rows:
            if row["sae_id"] == sae_id:
                return row
        raise KeyError(f"No row {sae_id!r}; rows: {[r['sae_id'] for r in self.rows]}.")

    def summary_line(self) -> str:
        """Tokens scored, seconds taken, and how long the dictionaries were trained (``config["suite"]``)."""
        suite = self.config.get("suite", {})
        return (
            f"{self.n_tokens} evaluation tokens, {self.seconds:.0f} s; dictionaries trained on "
            f"{suite.get('training_tokens_seen', '?')} tokens each ({suite.get('status', '?')})"
        )

    def markdown(self) -> str:
        """The table as Markdown (the columns of docs/saes.md)."""
        head = "| id | L0 | alive (eval) | alive (train window) | EV | CE clean | CE splice | CE zero | CE recovered | KL |"
        lines = [head, "|" + "---|" * 10]
        for r in self.rows:
            window = f"{r['alive_train_window']:.1%}" if "alive_train_window" in r else "–"
            lines.append(
                f"| `{r['sae_id']}` | {r['mean_l0']:.1f} | {r['alive_rate']:.1%} | {window} | "
                f"{r['explained_variance']:.3f} | {r['ce_clean']:.3f} | {r['ce_spliced']:.3f} | "
                f"{r['ce_zero']:.3f} | {r['ce_recovered']:.3f} | {r['kl']:.3f} |"
            )
        ours = {r["sae_id"]: r for r in self.rows}
        for title, theirs in (
            ("SAELens `run_evals` (every position spliced, special tokens left out by id)", self.saelens),
            ("SAEBench core `run_evals` (every position spliced, special tokens out of the statistics)", self.saebench),
        ):
            if not theirs:
                continue
            lines += ["", f"{title} / this protocol (first position clean):", ""]
            lines += ["| id | L0 (theirs / ours) | EV | CE clean | CE splice | CE zero | CE recovered | KL |"]
            lines.append("|" + "---|" * 8)
            for r in theirs:
                cells = [_pair(r, ours.get(r["sae_id"], {}), key, fmt) for key, fmt in _SAELENS_CELLS]
                lines.append(f"| `{r['sae_id']}` | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    COLUMN_TYPES: ClassVar[dict[str, type]] = {
        "sae_id": str,
        "kind": str,
        "layer": int,
        "d_sae": int,
        **dict.fromkeys(METRICS, float),
        "n_tokens": int,
    }
    title: ClassVar[str] = "SAE / transcoder suite quality"

    #: The headline numbers of each dictionary (W&B scalars ``{sae_id}/{key}``).
    HEADLINE: ClassVar[tuple[str, ...]] = ("explained_variance", "ce_recovered", "kl", "mean_l0", "alive_rate")

    def scalars(self) -> dict[str, float]:
        """:attr:`HEADLINE` of each dictionary as ``{sae_id}/{key}``, the tokens scored and the seconds taken."""
        out = {f"{r['sae_id']}/{k}": float(r[k]) for r in self.rows for k in self.HEADLINE}
        return out | {"n_tokens": float(self.n_tokens), "seconds": float(self.seconds)}

    def tables(self) -> dict[str, Table]:
        """``quality``: one row per dictionary, the columns of :attr:`COLUMN_TYPES`."""
        return {"quality": Table.build(self.COLUMN_TYPES, ([r[c] for c in self.COLUMN_TYPES] for r in self.rows))}


def _write_hook(sae: SAE) -> str:
    meta = sae.cfg.metadata
    return meta.hook_name_out or meta.hook_name


def _layer(sae: SAE) -> int:
    layer = hook_layer(_write_hook(sae))
    if layer is None:
        raise ValueError(f"{_write_hook(sae)!r} is not inside a block; the report splices at blocks.L hooks only.")
    return layer


def _mlp_input_residual(layer: int, parallel: bool) -> list[str]:
    """Hooks whose sum is the residual block ``layer`` adds its MLP write to: ``resid_mid``, or ``resid_pre`` +
    ``attn_out`` in a block with parallel attention and MLP (no ``resid_mid`` there)."""
    if parallel:
        return [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_attn_out"]
    return [f"blocks.{layer}.hook_resid_mid"]


def _residual_after(sae: SAE, cache, written: torch.Tensor, parallel: bool = False) -> torch.Tensor:
    """The residual after block L when the write hook carries ``written``."""
    hook = _write_hook(sae)
    layer = _layer(sae)
    if hook == f"blocks.{layer}.hook_resid_post":
        return written
    if hook == f"blocks.{layer}.hook_mlp_out":
        return sum(cache[name] for name in _mlp_input_residual(layer, parallel)) + written
    raise ValueError(f"The report splices at hook_resid_post or hook_mlp_out, not {hook!r}.")


@torch.no_grad()
def suite_quality(
    model: HookedSAETransformer,
    saes: dict[str, SAE],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    batch_size: int = 8,
    exclude_first_positions: int = 1,
) -> SuiteQuality:
    """Quality of every dictionary in ``saes`` (id → SAE) on ``tokens``; one clean forward pass per batch.

    The first ``exclude_first_positions`` positions of every window keep their clean activation in the splice and
    are left out of L0, alive, EV and KL (SAEBench's ``exclude_special_tokens_from_reconstruction``, applied by
    position because the windows start mid-text: SmolLM2's first position is an attention sink, see
    ``SAESuiteConfig.exclude_first_positions``). The zero ablation zeroes every position, as SAEBench's does.
    """
    check_first_positions(exclude_first_positions, tokens.shape[1])
    if tokens.numel() == 0 or tokens.shape[1] < 2:
        raise ValueError(
            "Need at least one sequence of >= 2 tokens; load them with load_corpus(..., split='evaluation')."
        )
    start = time.perf_counter()
    parallel = bool(model.cfg.parallel_attn_mlp)
    needed: set[str] = set()
    for sae in saes.values():
        layer = _layer(sae)
        needed |= {sae.cfg.metadata.hook_name, _write_hook(sae), *_mlp_input_residual(layer, parallel)}
    for hook in needed:
        check_hook(model, hook)
    stats = {sid: SpliceStats(sae.cfg.d_sae) for sid, sae in saes.items()}
    device = next(model.parameters()).device
    keep = torch.arange(tokens.shape[1], device=device) >= exclude_first_positions  # positions that are spliced
    for begin in tqdm(range(0, tokens.shape[0], batch_size), desc="report batches"):
        batch = tokens[begin : begin + batch_size].to(device)
        logits, cache = model.run_with_cache(batch, names_filter=sorted(needed))
        for sid, sae in saes.items():
            x, y = cache[sae.cfg.metadata.hook_name], cache[_write_hook(sae)]
            acts = sae.encode(x[:, exclude_first_positions:])  # only the spliced positions are encoded
            y_hat = write_from(exclude_first_positions, sae.decode(acts), y)
            restart = _layer(sae) + 1
            spliced = model(_residual_after(sae, cache, y_hat, parallel), start_at_layer=restart)
            zeroed = model(_residual_after(sae, cache, torch.zeros_like(y), parallel), start_at_layer=restart)
            stats[sid].update(batch, keep, acts, y[:, keep], y_hat[:, keep], logits, spliced, zeroed)
    rows = []
    for sid, sae in saes.items():
        values = stats[sid].metrics()
        values["dead_rate"] = 1.0 - values["alive_rate"]
        names: dict[str, Any] = {"sae_id": sid, "kind": "transcoder" if sae.cfg.metadata.hook_name_out else "sae"}
        names |= {"layer": _layer(sae), "d_sae": sae.cfg.d_sae}
        columns = [c for c in SuiteQuality.COLUMN_TYPES if c not in names]  # the metrics and n_tokens, by name
        rows.append(names | {column: values[column] for column in columns})
    n_tok = tokens.shape[0] * int(keep.sum())
    return SuiteQuality(rows=rows, n_tokens=n_tok, seconds=time.perf_counter() - start)


def add_training_window_alive(quality: SuiteQuality, folder) -> None:
    """Alive share over the last sparsity window of training (SAELens' ``sparsity.safetensors`` of the newest
    checkpoint: log10 firing frequency, -10 = never fired), a larger sample than a small evaluation set."""
    checkpoints = sorted(
        (p for p in (folder / ".train" / "checkpoints").glob("*") if p.name.isdigit()), key=lambda p: int(p.name)
    )
    if not checkpoints:
        return
    for row in quality.rows:
        path = checkpoints[-1] / row["sae_id"] / "sparsity.safetensors"
        if path.exists():
            row["alive_train_window"] = (load_file(str(path))["sparsity"] > -9.99).float().mean().item()
            row["checkpoint"] = checkpoints[-1].name
