"""Splice metrics of any dictionary: sparsity, explained variance at the write hook, CE-loss change of the splice."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Int
from sae_lens import SAE, HookedSAETransformer
from tqdm import tqdm

from tl_query_lens import corpus
from tl_query_lens.config import check_first_positions, resolve_config
from tl_query_lens.dictionaries.config import FFKVSummaryConfig
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.errors import InputError
from tl_query_lens.interrupts import with_resume
from tl_query_lens.limits import ModelDims, check_limits, dims_of
from tl_query_lens.operators.engine import check_tokens
from tl_query_lens.presentation import Table, numeric_fields
from tl_query_lens.primitives import kl_divergence, write_from
from tl_query_lens.ranges import parse_layers
from tl_query_lens.results import SavableResult
from tl_query_lens.tensor_checks import check_outputs

logger = logging.getLogger(__name__)


@dataclass
class SpliceMetrics(SavableResult):
    """Corpus statistics of a dictionary spliced into the model (no error term).

    Attributes:
        alive_rate: share of features nonzero on at least one token.
        mean_l0: mean number of nonzero features per token.
        explained_variance: 1 − Σ‖y − ŷ‖² / Σ‖y − ȳ‖² at the write hook (y = clean activation).
        ce_clean / ce_spliced: mean next-token cross-entropy (nats) without / with the splice.
        ce_delta: ce_spliced − ce_clean.
        kl: mean KL(clean ‖ spliced) of next-token distributions (nats).
        n_tokens: tokens scored.
    """

    alive_rate: float
    mean_l0: float
    explained_variance: float
    ce_clean: float
    ce_spliced: float
    ce_delta: float
    kl: float
    n_tokens: int


class SpliceStats:
    """Streaming sums of one dictionary's splice statistics, batch by batch: the one place they are computed.

    :func:`splice_metrics` (any dictionary, one spliced forward pass per batch) and
    :func:`tl_query_lens.saes.report.suite_quality` (many dictionaries, restarted from the clean residual) both feed it.
    Per batch (:meth:`update`): the codes, the write-hook activation and its reconstruction at the scored positions,
    and the clean, spliced (and optionally zero-ablated) logits of the whole windows. L0, alive, EV and KL count the
    scored positions; CE counts every next-token prediction.
    """

    def __init__(self, d_sae: int) -> None:
        self.fired = torch.zeros(d_sae, dtype=torch.bool)
        self.l0 = self.sse = self.y_sq = self.kl = 0.0
        self.y_sum: torch.Tensor | float = 0.0
        self.ce_clean = self.ce_spliced = self.ce_zero = 0.0
        self.n_tokens = self.n_reconstructed = self.n_predictions = 0
        self.has_zero = False

    def update(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        keep: torch.Tensor,
        acts: torch.Tensor,
        y: torch.Tensor,
        y_hat: torch.Tensor,
        clean_logits: torch.Tensor,
        spliced_logits: torch.Tensor,
        zero_logits: torch.Tensor | None = None,
    ) -> None:
        """Add one batch.

        Args:
            tokens: the batch ``[batch, pos]``.
            keep: ``[pos]`` bool, the scored positions (all but the ``exclude_first_positions`` first ones).
            acts: codes at the scored positions ``[batch, kept, d_sae]``.
            y / y_hat: write-hook activation and its reconstruction at the scored positions ``[batch, kept, ...]``.
            clean_logits / spliced_logits / zero_logits: ``[batch, pos, d_vocab]`` of the clean run, the spliced run
                and the run with the write hook zeroed (CE recovered; None: not measured).
        """
        self.update_codes(acts)
        self.update_reconstruction(y, y_hat)
        self.update_logits(tokens, keep, clean_logits, spliced_logits, zero_logits)

    def update_codes(self, acts: torch.Tensor) -> None:
        """Add the codes ``[batch, kept, d_sae]`` of the scored positions: L0 and alive, the one definition of both
        (a feature is alive when its code is nonzero at some position: a signed FF-KV neuron that only fires
        negatively is alive)."""
        nonzero = acts != 0
        self.fired |= nonzero.reshape(-1, self.fired.numel()).any(0).cpu()
        self.l0 += nonzero.sum().item()
        self.n_tokens += acts.shape[0] * acts.shape[1]

    def update_reconstruction(self, y: torch.Tensor, y_hat: torch.Tensor) -> None:
        """Add the write-hook activation and its reconstruction ``[batch, kept, ...]`` of the scored positions (EV)."""
        y, y_hat = y.flatten(2), y_hat.flatten(2)  # hook_z: [batch, kept, n_heads·d_head]
        self.sse += (y - y_hat).pow(2).sum().item()
        self.y_sum = self.y_sum + y.reshape(-1, y.shape[-1]).double().sum(0)
        self.y_sq += y.double().pow(2).sum().item()
        self.n_reconstructed += y.shape[0] * y.shape[1]

    def update_logits(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        keep: torch.Tensor,
        clean_logits: torch.Tensor,
        spliced_logits: torch.Tensor,
        zero_logits: torch.Tensor | None = None,
    ) -> None:
        """Add the clean, spliced (and optionally zero-ablated) logits of the whole windows (CE, KL)."""
        self.n_predictions += tokens.shape[0] * (tokens.shape[1] - 1)
        self.ce_clean += _ce_sum(clean_logits, tokens)
        self.ce_spliced += _ce_sum(spliced_logits, tokens)
        logp, logq = clean_logits.log_softmax(-1), spliced_logits.log_softmax(-1)
        self.kl += kl_divergence(logp, logq)[:, keep].sum().item()
        if zero_logits is not None:
            self.has_zero = True
            self.ce_zero += _ce_sum(zero_logits, tokens)

    def metrics(self) -> dict[str, Any]:
        """alive_rate, mean_l0, n_tokens; explained_variance when reconstructions were added; ce_clean, ce_spliced,
        ce_delta, kl when logits were added (and ce_zero, ce_recovered = (CE_zero − CE_spliced) / (CE_zero − CE_clean)
        when zero-ablated logits were given)."""
        n_tok, n_pred = self.n_tokens, self.n_predictions
        out: dict[str, Any] = {
            "alive_rate": self.fired.float().mean().item(),
            "mean_l0": self.l0 / max(n_tok, 1),
            "n_tokens": n_tok,
        }
        if self.n_reconstructed:
            y_sum = torch.as_tensor(self.y_sum, dtype=torch.float64)
            sst = self.y_sq - (y_sum.pow(2).sum() / self.n_reconstructed).item()
            out["explained_variance"] = 1.0 - self.sse / max(sst, 1e-30)
        if not n_pred:
            return out
        clean, spliced = self.ce_clean / n_pred, self.ce_spliced / n_pred
        out |= {
            "ce_clean": clean,
            "ce_spliced": spliced,
            "ce_delta": (self.ce_spliced - self.ce_clean) / n_pred,
            "kl": self.kl / n_tok,
        }
        if self.has_zero:
            zero = self.ce_zero / n_pred
            out["ce_zero"] = zero
            out["ce_recovered"] = (zero - spliced) / (zero - clean) if zero != clean else float("nan")
        return out


@torch.no_grad()
def splice_metrics(
    model: HookedSAETransformer,
    sae: SAE,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    batch_size: int = 8,
    exclude_first_positions: int = 0,
) -> SpliceMetrics:
    """Measure a dictionary's fidelity on ``tokens`` (clean run vs. ``run_with_saes`` without the error term).

    ``exclude_first_positions > 0`` keeps the clean activation at the first positions of every window (the splice
    runs as a hook that writes the reconstruction from the clean read-hook activation at the other positions) and
    leaves them out of L0, alive, EV and KL: SAEBench's ``exclude_special_tokens_from_reconstruction``, by position,
    for models whose first position is an attention sink (SmolLM2, ``docs/saes.md``).

    Metrics are taken in the dictionary's own space, at its own hooks (``metadata.hook_name`` / ``hook_name_out``), as
    SAELens splices it: a hook_z SAE (all heads, ``reshape_activations="hook_z"``) is measured on the concatenated
    ``hook_z`` (``[n_heads·d_head]``), not on ``hook_attn_out`` where its key–value view writes. The statistics are
    :class:`SpliceStats`'.
    """
    view = as_key_value(sae, model)
    if view.head_index is not None:
        raise InputError(
            f"This SAE reads one head of {view.read_hook} (hook_head_index={view.head_index}); SAELens does not splice "
            "one-head SAEs into a HookedSAETransformer, so there is no splice to measure. Use an SAE over all heads "
            '(reshape_activations="hook_z").'
        )
    read_hook = sae.cfg.metadata.hook_name
    write_hook = sae.cfg.metadata.hook_name_out or read_hook
    tokens = check_tokens(model, tokens)
    check_first_positions(exclude_first_positions, tokens.shape[1])
    keep = torch.arange(tokens.shape[1], device=model.cfg.device) >= exclude_first_positions
    stats = SpliceStats(view.d_sae)
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        logits, cache = model.run_with_cache(batch, names_filter=[read_hook, write_hook])
        acts = sae.encode(cache[read_hook][:, keep])
        y_hat = sae.decode(acts)
        if exclude_first_positions:

            def splice(act: torch.Tensor, hook: Any, y_hat: torch.Tensor = y_hat) -> torch.Tensor:
                return write_from(exclude_first_positions, y_hat, act)

            spliced = model.run_with_hooks(batch, fwd_hooks=[(write_hook, splice)])
        else:
            spliced = model.run_with_saes(batch, saes=[sae], use_error_term=False)
        stats.update(batch, keep, acts, cache[write_hook][:, keep], y_hat, logits, spliced)
    values = stats.metrics()
    metrics = SpliceMetrics(**{f.name: values[f.name] for f in dataclasses.fields(SpliceMetrics)})
    return check_outputs(
        metrics,
        "splice_metrics",
        hint="The clean or spliced forward pass produced non-finite "
        "activations or logits: check the model's weights and dtype (the dictionary's weights "
        "were checked on entry).",
    )


def _ce_sum(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1), reduction="sum"
    ).item()


@dataclass
class FFKVSummary(SavableResult):
    """Splice metrics of FF-KV dictionaries per layer.

    Attributes:
        k: TopK size of the sparse splice.
        sparse: layer → metrics of the TopK-k FF-KV splice.
        dense: layer → metrics of the vanilla FF-KV splice (empty when not asked for).
    """

    k: int
    sparse: dict[int, SpliceMetrics]
    dense: dict[int, SpliceMetrics] = field(default_factory=dict)

    COLUMN_TYPES: ClassVar[dict[str, type | tuple[type, None]]] = {
        "layer": int,
        "alive_rate_vanilla": (float, None),
        "alive_rate_topk": float,
        "mean_l0_topk": float,
        "ev_vanilla": (float, None),
        "ev_topk": float,
        "ce_clean": float,
        "ce_delta_topk": float,
        "kl_topk": float,
    }
    COLUMNS = tuple(COLUMN_TYPES)

    def rows(self) -> list[list]:
        """One row per layer, columns :attr:`COLUMNS` (vanilla columns None without ``dense``)."""
        rows = []
        for layer, s in self.sparse.items():
            d = self.dense.get(layer)
            rows.append(
                [
                    layer,
                    d and d.alive_rate,
                    s.alive_rate,
                    s.mean_l0,
                    d and d.explained_variance,
                    s.explained_variance,
                    s.ce_clean,
                    s.ce_delta,
                    s.kl,
                ]
            )
        return rows

    def _subfolder(self, name: str, key=None) -> str:
        if key is None:
            return name
        return f"layer{key}" if name == "sparse" else f"layer{key}_vanilla"

    title: ClassVar[str] = "FF-KV dictionaries: splice metrics per layer"

    def scalars(self) -> dict[str, float]:
        """``layer{L}/{metric}`` of the TopK splice (``layer{L}/vanilla/{metric}`` of the vanilla one)."""
        out: dict[str, float] = {}
        for layer, m in self.sparse.items():
            out.update(numeric_fields(m, prefix=f"layer{layer}/"))
        for layer, m in self.dense.items():
            out.update(numeric_fields(m, prefix=f"layer{layer}/vanilla/"))
        return out

    def tables(self) -> dict[str, Table]:
        """``per_layer``: one row per layer (vanilla columns empty without ``dense``)."""
        return {"per_layer": Table.build(self.COLUMN_TYPES, self.rows())}

    def figures(self) -> dict[str, Any]:
        """``per_layer``: explained variance and CE change of the TopK splice per layer."""
        import plotly.graph_objects as go

        layers = list(self.sparse)
        fig = go.Figure()
        fig.add_trace(
            go.Bar(x=layers, y=[m.explained_variance for m in self.sparse.values()], name="explained variance")
        )
        fig.add_trace(go.Bar(x=layers, y=[m.ce_delta for m in self.sparse.values()], name="CE change (nats)"))
        fig.update_layout(
            title=f"FF-KV TopK-{self.k} splice per layer", xaxis_title="layer", barmode="group", template="plotly_white"
        )
        return {"per_layer": fig}


def ffkv_summary(
    model: HookedSAETransformer,
    layers: Sequence[int],
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    cfg: FFKVSummaryConfig | None = None,
    **overrides: Any,
) -> FFKVSummary:
    """Splice the TopK-k (and the vanilla) FF-KV dictionary of each layer and measure it on ``tokens``."""
    cfg = resolve_config(FFKVSummaryConfig, cfg, overrides)
    sparse, dense = {}, {}
    for layer in tqdm(list(layers), desc="FF-KV layers", leave=False):
        if cfg.dense:
            dense[layer] = splice_metrics(
                model, FFKV.from_model(model, layer, "vanilla"), tokens, batch_size=cfg.batch_size
            )
        sparse[layer] = splice_metrics(
            model, FFKV.from_model(model, layer, "topk", k=cfg.k), tokens, batch_size=cfg.batch_size
        )
        logger.info(
            "layer %d: TopK-%d EV %.3f, CE change %+.4f nats",
            layer,
            cfg.k,
            sparse[layer].explained_variance,
            sparse[layer].ce_delta,
        )
    return FFKVSummary(k=cfg.k, sparse=sparse, dense=dense)


def check_ffkv(cfg: Any, dims: ModelDims | None) -> None:
    """``tlql ffkv`` before the model loads: the layers and the TopK size against the model."""
    parse_layers(cfg.run.layers, dims.n_layers if dims else None)
    check_limits(dims, {"--k": (cfg.summary.k, "d_mlp")}, cfg.run.model)


def run_ffkv(model: HookedSAETransformer, cfg: Any) -> FFKVSummary:
    """``tlql ffkv`` (:class:`~tl_query_lens.dictionaries.config.FFKVCommandConfig`): the summary of the FF-KV
    dictionaries of ``cfg.run.layers`` on the corpus' evaluation split, one layer at a time (an interrupt saves the
    finished layers under ``--out`` and names the command for the rest); with ``save_dictionaries`` each layer's
    TopK dictionary in SAELens format under ``<out>/layer<L>/sae``."""
    run = cfg.run
    check_limits(dims_of(model), {"--k": (cfg.summary.k, "d_mlp")}, run.model)
    layers = parse_layers(run.layers, model.cfg.n_layers)
    tokens = corpus.load_corpus(
        run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="evaluation", seed=run.seed
    )
    out = Path(run.out)
    summary = FFKVSummary(k=cfg.summary.k, sparse={}, dense={})
    try:
        for layer in layers:  # one layer at a time: an interrupt keeps the finished ones
            part = ffkv_summary(model, [layer], tokens, cfg=cfg.summary)
            summary.sparse.update(part.sparse)
            summary.dense.update(part.dense)
    except KeyboardInterrupt as err:
        left = ",".join(str(layer) for layer in layers if layer not in summary.sparse)
        if not summary.sparse:
            raise with_resume(err, "no layer had finished; rerun the same command") from None
        summary.save(out)
        raise with_resume(
            err,
            f"layers {sorted(summary.sparse)} are saved in {out}; run the rest with --layers {left} and another --out",
        ) from None
    if cfg.save_dictionaries:
        for layer in layers:
            FFKV.from_model(model, layer, "topk", k=cfg.summary.k).save_model(out / f"layer{layer}" / "sae")
    return summary
