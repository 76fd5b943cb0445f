"""Fitting a readout SAE with the Sparse Readout Prism recipe (docs/design.md §6).

Per step: a batch of normalised rows x_t (50% drawn by top-8 frequency over decoded corpus states, 50% uniform),
TopK codes, reconstruction x̂ = code·D, and the loss

    MSE(x̂, x) + λ_prism · mean[(h·r_t / |h·w_t|)²] + code_l2 · mean(code²),   r_t = w_t − (μ + a_t x̂_t),

where the prism term runs over (decoded state h, top-1 token t) pairs. AdamW, gradient clipping, decoder rows
renormalised to unit norm after every step. Departure from the paper, stated: the decoder is initialised from
randomly chosen normalised rows (encoder = its transpose), which makes short CPU fits converge far faster.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from sae_lens.saes.sae import SAEMetadata
from tqdm import tqdm

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint, load_corpus
from tl_query_lens.paths import relative_command
from tl_query_lens.presentation import Table, numeric_fields
from tl_query_lens.primitives import normalise_rows, topk_relu_codes
from tl_query_lens.readout.config import ReadoutFitConfig
from tl_query_lens.readout.sae import (
    ReadoutSAE,
    ReadoutSAEConfig,
    decode_sparse,
    register_operation,
    unembedding_rows,
)
from tl_query_lens.readout.states import StateBank, collect_states
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


@dataclass
class ReadoutFit(SavableResult):
    """A fitted readout SAE and its training record (``history``: one record per ``log_every`` steps)."""

    sae: ReadoutSAE
    config: ReadoutFitConfig
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether the fit ran all ``config.steps`` (``max_seconds`` can stop it early)."""
        return int(self.final.get("steps", self.config.steps)) >= self.config.steps

    def cache_id(self, base: str) -> str:
        """The id to cache this fit under: ``base`` when complete, else ``<base>-capped-s<steps done>``, so a fit
        stopped early never takes the full preset's id."""
        return base if self.complete else f"{base}-capped-s{int(self.final['steps'])}"

    @property
    def provenance(self) -> dict[str, Any]:
        """How the fit was made (seed, threads, library versions, ...): ``sae.cfg.metadata.readout_fit``, saved in
        the SAE's ``cfg.json``; see :func:`fit_provenance`."""
        return dict(self.sae.cfg.metadata.get("readout_fit") or {})

    title: ClassVar[str] = "Readout SAE fit"

    def scalars(self) -> dict[str, float]:
        """The final record's numbers and the wall time."""
        return numeric_fields(self, ("seconds",)) | {k: float(v) for k, v in self.final.items()}

    def tables(self) -> dict[str, Table]:
        """``history``: one row per logged step (the record's keys as float columns)."""
        if not self.history:
            return {}
        keys = list(self.history[0])
        return {"history": Table.build(dict.fromkeys(keys, float), ([r.get(k) for k in keys] for r in self.history))}


def _init_weights(sae: ReadoutSAE, x: torch.Tensor, gen: torch.Generator) -> None:
    n_rows, width = x.shape[0], sae.cfg.d_sae
    pick = (
        torch.randint(n_rows, (width,), generator=gen)
        if width > n_rows
        else torch.randperm(n_rows, generator=gen)[:width]
    )
    noise = torch.randn(width, x.shape[1], generator=gen) * (0.1 / math.sqrt(x.shape[1]))
    dec = F.normalize(x[pick].cpu() + noise, dim=-1).to(x)
    with torch.no_grad():
        sae.W_dec.copy_(dec)
        sae.W_enc.copy_(dec.T)
        sae.b_enc.zero_()
        # TopK(ReLU(·)) is positively homogeneous without b_enc: rescale W_enc so x̂ has the least-squares scale.
        sample = x[torch.randperm(n_rows, generator=gen)[:2048].to(x.device)]
        x_hat = sparse_decode(sae, sample)
        sae.W_enc.mul_((sample * x_hat).sum() / (x_hat * x_hat).sum().clamp_min(1e-12))


def sparse_decode(sae: ReadoutSAE, x: torch.Tensor) -> torch.Tensor:
    """x̂ = TopK(ReLU(x W_enc + b_enc)) · D, gathering only the k active decoder rows."""
    idx, val = topk_relu_codes(x @ sae.W_enc + sae.b_enc, sae.cfg.k)
    return decode_sparse(idx, val, sae.W_dec)


def _row_frequency(bank: StateBank, rows: torch.Tensor, b_U: torch.Tensor, top_n: int) -> torch.Tensor:
    counts = torch.zeros(rows.shape[0], dtype=torch.float32)
    for chunk in bank.states.split(512):
        top = (chunk.to(rows) @ rows.T + b_U).topk(top_n, dim=-1).indices.reshape(-1).cpu()
        counts.index_add_(0, top, torch.ones(top.numel()))
    return counts


def feature_usage(sae: ReadoutSAE) -> torch.Tensor:
    """How many vocabulary rows use each feature (from the stored codes)."""
    idx, val = sae.code_indices, sae.code_values
    used = idx[val > 0]
    return torch.bincount(used, minlength=sae.cfg.d_sae)


PROVENANCE_PACKAGES = ("torch", "sae-lens", "transformer-lens", "numpy", "tl_query_lens")


def library_versions(packages: tuple[str, ...] = PROVENANCE_PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a fit's numbers depend on (``"not installed"`` where missing), and Python's."""
    versions = {"python": platform.python_version()}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def fit_provenance(cfg: ReadoutFitConfig, device: torch.device, tokens: torch.Tensor | None) -> dict[str, Any]:
    """What a refit needs to know to match this fit: the config (seed included), the threads torch used, library
    versions, device and CPU kernels, the corpus fingerprint, and when it started. Stored as
    ``cfg.metadata.readout_fit`` of the fitted SAE (SAELens keeps extra metadata keys in ``cfg.json``)."""
    return {
        "seed": cfg.seed,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "versions": library_versions(),
        "device": str(device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "platform": f"{platform.system()} {platform.machine()}",
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "corpus_fingerprint": corpus_fingerprint(tokens) if tokens is not None else None,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": relative_command(sys.argv) if sys.argv and sys.argv[0] else None,
        "config": asdict(cfg),
    }


def fit_readout(
    model,
    tokens: torch.Tensor | None = None,
    *,
    states: StateBank | None = None,
    cfg: ReadoutFitConfig | None = None,
    progress: bool = True,
    **overrides,
) -> ReadoutFit:
    """Fit a readout SAE to ``model``'s LM-head rows (docs/design.md §6); no files, no W&B (the caller logs ``history``).

    Args:
        model: a TransformerLens model.
        tokens: corpus tokens for the (state, top-1 token) pairs; None: ``cfg.n_seqs`` × ``cfg.seq_len`` tokens of
            the train split of ``cfg.corpus``.
        states: a ready :class:`StateBank` instead (skips the forward passes).
        cfg: a :class:`ReadoutFitConfig` (``ReadoutFitConfig.preset("paper")`` for the paper's GPU recipe);
            keyword ``overrides`` (``width=``, ``k=``, ``steps=``, …) replace single fields.
        progress: show a progress bar.

    Returns:
        :class:`ReadoutFit` with the SAE (codes of every row stored), config, wall time and loss history.
    """
    cfg = resolve_config(ReadoutFitConfig, cfg, overrides)
    start_time = time.perf_counter()
    device = torch.device(model.cfg.device)
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = unembedding_rows(model).to(device)
    d_vocab, d_model = rows.shape
    width = cfg.width or cfg.width_mult * d_model
    if cfg.k > width:
        raise ValueError(f"k={cfg.k} exceeds the dictionary width {width}.")

    bank_given = states is not None
    if states is None:
        if tokens is None:
            if getattr(model, "tokenizer", None) is None:
                raise ValueError(
                    "The model has no tokenizer: pass corpus tokens (tokens=...) or a StateBank (states=...)."
                )
            tokens = load_corpus(
                cfg.corpus, model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, split="train", seed=cfg.seed
            )
        states = collect_states(model, tokens)
    provenance = fit_provenance(cfg, device, None if bank_given else tokens)
    h_bank = states.states.to(device)
    top1 = states.top1.to(device)
    b_U = model.b_U.detach().float().to(device)
    freq = _row_frequency(states, rows, b_U, min(cfg.top_n, d_vocab))

    # Preprocessing (docs/design.md §6): μ, a_t, x_t.
    mu, norms, x = normalise_rows(rows)

    sae_cfg = ReadoutSAEConfig(
        d_in=d_model,
        d_sae=width,
        d_vocab=d_vocab,
        k=cfg.k,
        dtype="float32",
        device=str(device),
        metadata=SAEMetadata(
            model_name=model.cfg.model_name,
            hook_name="ln_final.hook_normalized",
            hook_layer=model.cfg.n_layers - 1,
            prepend_bos=model.cfg.default_prepend_bos,
            context_size=model.cfg.n_ctx,
        ),
    )
    sae = ReadoutSAE(sae_cfg)
    with torch.no_grad():
        sae.b_dec.copy_(mu)
    _init_weights(sae, x, gen)
    params = [sae.W_enc, sae.b_enc, sae.W_dec]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    n_freq = round(cfg.batch_rows * cfg.frequency_share) if freq.sum() > 0 else 0
    freq_probs = freq / freq.sum().clamp_min(1)

    history: list[dict[str, float]] = []
    fired = torch.zeros(width, device=device)
    rows_seen = 0
    bar = tqdm(range(1, cfg.steps + 1), desc="readout SAE fit", disable=not progress)
    steps_done = 0
    for step in bar:
        if cfg.max_seconds is not None and time.perf_counter() - start_time > cfg.max_seconds:
            logger.warning("Stopping at step %d of %d: max_seconds=%s reached.", step - 1, cfg.steps, cfg.max_seconds)
            break
        steps_done = step
        pick = torch.cat(
            [
                torch.multinomial(freq_probs, n_freq, replacement=True, generator=gen)
                if n_freq
                else torch.empty(0, dtype=torch.long),
                torch.randint(d_vocab, (cfg.batch_rows - n_freq,), generator=gen),
            ]
        ).to(device)
        pairs = torch.randint(h_bank.shape[0], (cfg.batch_pairs,), generator=gen).to(device)
        tok = top1[pairs]
        batch = torch.cat([x[pick], x[tok]])
        idx, vals = topk_relu_codes(batch @ sae.W_enc + sae.b_enc, cfg.k)
        x_hat = torch.einsum("bk,bkd->bd", vals, sae.W_dec[idx])
        mse = F.mse_loss(x_hat[: len(pick)], batch[: len(pick)])
        h = h_bank[pairs]
        r = norms[tok, None] * (x[tok] - x_hat[len(pick) :])  # r_t = w_t − (μ + a_t x̂_t)
        ratio = (h * r).sum(-1) / (h * rows[tok]).sum(-1).abs().clamp_min(1e-6)
        prism = ratio.pow(2).mean()
        code_pen = vals[: len(pick)].pow(2).sum() / (len(pick) * width)  # mean over all F code entries
        loss = mse + cfg.lambda_prism * prism + cfg.code_l2 * code_pen
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        with torch.no_grad():
            sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8))
            fired.index_add_(
                0,
                idx[: len(pick)][vals[: len(pick)] > 0],
                torch.ones(int((vals[: len(pick)] > 0).sum()), device=device),
            )
            rows_seen += len(pick)
        if step % cfg.log_every == 0 or step == cfg.steps:
            record = {
                "step": step,
                "loss": loss.item(),
                "mse": mse.item(),
                "prism": prism.item(),
                "code_l2": code_pen.item(),
                "row_ev_batch": 1.0 - mse.item() * d_model,
                "dead_rate_window": (fired == 0).float().mean().item(),
                "rare_rate_window": ((fired > 0) & (fired < 1e-4 * rows_seen)).float().mean().item(),
                "seconds": time.perf_counter() - start_time,
            }
            history.append(record)
            bar.set_postfix(
                mse=f"{record['mse']:.2e}", prism=f"{record['prism']:.3f}", dead=f"{record['dead_rate_window']:.2f}"
            )
            fired.zero_()
            rows_seen = 0
    sae.store_codes(rows)
    sae.bound_rows = rows  # decompose() needs no model= right after fitting
    usage = feature_usage(sae)
    final = {
        "dead_rate": (usage == 0).float().mean().item(),
        "rare_rate": ((usage > 0) & (usage < cfg.rare_rows)).float().mean().item(),
        "row_ev": row_explained_variance(sae, rows),
        "seconds": time.perf_counter() - start_time,
        "width": width,
        "k": cfg.k,
        "steps": steps_done,
    }
    sae.cfg.metadata.readout_fit = provenance | {"steps_done": steps_done, "seconds": final["seconds"]}
    logger.info(
        "Readout SAE fitted in %.0f s: rowEV %.3f, dead %.3f, rare %.3f",
        final["seconds"],
        final["row_ev"],
        final["dead_rate"],
        final["rare_rate"],
    )
    return ReadoutFit(sae=sae, config=cfg, seconds=final["seconds"], history=history, final=final)


@torch.no_grad()
def row_explained_variance(sae: ReadoutSAE, rows: torch.Tensor) -> float:
    """rowEV = 1 − Σ‖w_t − ŵ_t‖² / Σ‖w_t − μ‖² over all vocabulary rows (raw row space)."""
    err = sum(
        ((rows[i] - sae.reconstructed_rows(torch.arange(i.start, i.stop))) ** 2).sum().item()
        for i in _chunks(rows.shape[0], 4096)
    )
    return 1.0 - err / ((rows - sae.b_dec) ** 2).sum().item()


def _chunks(n: int, size: int):
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


register_operation("fit", fit_readout)  # ReadoutSAE.fit
