"""Train the suite: TopK residual SAEs and TopK transcoders at chosen layers, with SAELens' ``MultiSAETrainer``.

Plan (measured on the 2-core machine, docs/saes.md): the model runs once over the training tokens and every hook's
activations go to a float16 cache on disk (:mod:`tl_query_lens.saes.activations`); SAELens' ``MultiSAETrainer`` then
trains all dictionaries in lockstep from seeded, shuffled epochs over that cache (SAELens' own runner would rerun the
model for every training token, and its cached-activations mode is single-hook). Transcoders train through the same
trainer with :class:`~tl_query_lens.saes.transcoder.TopKTrainingTranscoder` (batch = MLP input and output stacked).

Checkpoints (SAELens' layout, written to a temporary folder and renamed, so a kill never leaves half a checkpoint)
go to ``<release folder>/.train/checkpoints/<samples>``; a rerun resumes from the newest one, with the same data
order. After every checkpoint the current dictionaries are exported to ``<release folder>/<sae_id>.partial`` (their own
id, so a half-trained dictionary never loads under the full name); the finished ones go to ``<sae_id>``.
``suite.json`` there says how many tokens they have seen.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import pickle
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sae_lens.config import LoggingConfig, SAETrainerConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig
from sae_lens.training._interruption import InterruptedException, interrupt_callback
from sae_lens.training.multi_sae_trainer import MultiSAETrainer
from safetensors import SafetensorError
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint, load_corpus
from tl_query_lens.errors import CorruptFileError
from tl_query_lens.estimates import BatchClock, estimate
from tl_query_lens.paths import folder_lock
from tl_query_lens.results import SavableResult, write_json
from tl_query_lens.saes.activations import ActivationCache, cache_activations
from tl_query_lens.saes.config import Kind, SAESuiteConfig
from tl_query_lens.saes.registry import SAES_RELEASES, sae_id, suite_hooks
from tl_query_lens.saes.transcoder import (
    FastTopKTrainingSAE,
    TopKTrainingTranscoder,
    TopKTrainingTranscoderConfig,
)

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"  # id suffix of a dictionary exported before its training completed


@dataclass
class SAESuiteResult(SavableResult):
    """What a training call produced.

    Attributes:
        release: the SAELens release name (``SAE.from_pretrained(release, sae_id)``).
        folder: the release folder (one sub-folder per ``sae_id``).
        sae_ids: the dictionaries trained.
        training_tokens_seen: activations each dictionary has been trained on.
        epochs: passes over the cached training rows (every position from ``exclude_first_positions`` on).
        n_cached_tokens: tokens in the activation cache.
        activation_cache: its folder.
        resumed_from: the checkpoint this call started from, else None.
        seconds_activations / seconds_training: wall time of this call's two phases.
        complete: whether training reached ``cfg.training_tokens``.
    """

    release: str
    folder: str
    sae_ids: list[str]
    training_tokens_seen: int
    epochs: float
    n_cached_tokens: int
    activation_cache: str
    resumed_from: str | None
    seconds_activations: float
    seconds_training: float
    complete: bool
    config: dict[str, Any] = field(default_factory=dict)

    def summary_line(self) -> str:
        """The release, what was trained and how long each phase took."""
        return (
            f"{self.release}: {len(self.sae_ids)} dictionaries, {self.training_tokens_seen} tokens each "
            f"({self.epochs:.1f} epochs over {self.n_cached_tokens} cached tokens) in {self.folder}; "
            f"activation pass {self.seconds_activations:.0f} s, training {self.seconds_training:.0f} s"
        )


class ShuffledEpochs:
    """Seeded shuffled batches over an activation cache, epoch after epoch.

    ``keys`` maps a batch key to the hooks stacked on its last axis (one hook for an SAE, input and output for a
    transcoder). Batch ``p`` depends only on ``(seed, p)``, so a resumed run sees the same data as an unbroken one.
    """

    def __init__(
        self,
        cache: ActivationCache,
        keys: dict[str, tuple[str, ...]],
        batch_size: int,
        seed: int,
        position: int = 0,
        *,
        seq_len: int | None = None,
        exclude_first_positions: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = torch.device(device)
        if exclude_first_positions:
            if not seq_len or cache.n_tokens % seq_len:
                raise ValueError(f"seq_len={seq_len} does not divide the cache's {cache.n_tokens} tokens.")
            self.rows = np.flatnonzero(np.arange(cache.n_tokens) % seq_len >= exclude_first_positions)
        else:
            self.rows = np.arange(cache.n_tokens)
        if len(self.rows) < batch_size:
            raise ValueError(
                f"The activation cache holds {len(self.rows)} usable tokens, fewer than one batch ({batch_size})."
            )
        self.arrays = {h: cache.array(h) for hooks in keys.values() for h in hooks}
        self.keys = keys
        self.batch_size = batch_size
        self.seed = seed
        self.position = position
        self.per_epoch = len(self.rows) // batch_size
        self._perm: tuple[int, torch.Tensor] | None = None

    def __iter__(self) -> ShuffledEpochs:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        epoch, i = divmod(self.position, self.per_epoch)
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(self.per_epoch * self.batch_size, generator=gen))
        idx = np.sort(self.rows[self._perm[1][i * self.batch_size : (i + 1) * self.batch_size].numpy()])
        self.position += 1
        return {
            key: torch.from_numpy(np.concatenate([self.arrays[h][idx] for h in hooks], axis=1)).to(self.device).float()
            for key, hooks in self.keys.items()
        }


class _CheckpointingTrainer(MultiSAETrainer):
    """SAELens' ``MultiSAETrainer`` with atomic checkpoints, the data position saved beside them, and exports."""

    keep = 2

    def __init__(
        self, *args: Any, data: ShuffledEpochs, on_checkpoint, means: dict | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.data = data
        self.on_checkpoint = on_checkpoint
        self.means = means  # sae id -> (input mean, output mean or None); used once, on a fresh start
        self.clock: BatchClock | None = None  # ticked as each step starts (fit() sets it: the steps left)

    def fit(self) -> dict[str, Any]:
        left = -(-(self.cfg.total_training_samples - self.n_training_samples) // self.cfg.train_batch_size_samples)
        # the first few real steps, past the first one's warm-up (optimiser state), give the estimate
        self.clock = estimate("saes train", left, "--training-tokens", unit="training steps", n_first=min(5, left - 1))
        return super().fit()

    def _maybe_log_sparsity(self, final: bool = False) -> None:
        if not final and self.clock is not None:  # SAELens' fit() calls it first in every step
            self.clock.tick(self.cfg.train_batch_size_samples)
        super()._maybe_log_sparsity(final)

    def _estimate_scaling_factors(self) -> None:
        super()._estimate_scaling_factors()
        if self.means is None:
            return
        for sid, (x_mean, y_mean) in self.means.items():
            factor = self.trainers[sid].activation_scaler.scaling_factor
            init_biases_from_mean(self.saes[sid], x_mean * (factor or 1.0), y_mean)
        self.means = None

    def save_checkpoint(self, checkpoint_name: str, wandb_aliases: list[str] | None = None) -> None:
        base = Path(str(self.cfg.checkpoint_path))
        staging = f".partial-{checkpoint_name}"
        shutil.rmtree(base / staging, ignore_errors=True)
        super().save_checkpoint(staging, wandb_aliases)
        write_json(base / staging / "data_position.json", {"position": self.data.position})
        final = base / checkpoint_name
        if final.exists():
            shutil.rmtree(final)
        (base / staging).rename(final)
        for old in _checkpoints(base)[: -self.keep]:  # keep the newest few; each holds Adam state of every SAE
            shutil.rmtree(old)
        self.on_checkpoint(final)


@torch.no_grad()
def init_biases_from_mean(sae, x_mean: torch.Tensor, y_mean: torch.Tensor | None = None) -> None:
    """Start a TopK SAE or transcoder at the data mean (see ``SAESuiteConfig.init_biases_from_mean``).

    SAE (``apply_b_dec_to_input``): ``b_dec = x̄``, so the encoder sees ``x − x̄``. Transcoder: a fixed input mean
    x̄ is subtracted before the encoder (``center_input``; folded into ``b_enc`` on export) and ``b_dec = ȳ``.
    """
    x_mean = x_mean.to(sae.W_enc)
    if y_mean is None:
        if not sae.cfg.apply_b_dec_to_input:
            raise ValueError("An SAE without apply_b_dec_to_input needs input centring; give it a transcoder's y_mean.")
        sae.b_dec.copy_(x_mean)
        return
    sae.center_input(x_mean)
    sae.b_dec.copy_(y_mean.to(sae.b_dec))


def _mean_rows(data: ShuffledEpochs, hooks: tuple[str, ...], n: int = 65_536, seed: int = 0) -> torch.Tensor:
    """Mean of ``n`` seeded training rows (the positions training uses) of ``hooks`` stacked on the last axis."""
    gen = np.random.default_rng(seed)
    rows = np.sort(gen.choice(data.rows, size=min(n, len(data.rows)), replace=False))
    means = [torch.from_numpy(np.asarray(data.arrays[h][rows], dtype=np.float64).mean(0)) for h in hooks]
    return torch.cat(means).float()


def train_saes(
    model: HookedTransformer,
    cfg: SAESuiteConfig | None = None,
    *,
    tokens: torch.Tensor | None = None,
    folder: str | Path | None = None,
    resume: bool = True,
    **overrides: Any,
) -> SAESuiteResult:
    """Train (or resume) the suite and export it where ``SAE.from_pretrained("tlql-saes-<model>", id)`` finds it.

    Args:
        model: the model (its hooks are checked against ``cfg.layers``).
        cfg: what to train; keywords in ``overrides`` replace its fields.
        tokens: ``[n_seqs, seq_len]`` training sequences; default: ``cfg.n_seqs`` windows of the train split of
            ``cfg.corpus``.
        folder: release folder (default: the user cache, ``<cache>/saes/tlql-saes-<model>``).
        resume: continue from the newest checkpoint of the same configuration (False: start again; earlier
            checkpoints are moved aside, not deleted).

    Raises:
        IndexError: a layer outside the model. ValueError: a corpus too small for the requested sequences.
        CorruptFileError: a checkpoint that cannot be read (its folder is named; nothing is deleted).
        LockedError: another process is training into the same release folder (its pid is named).
    """
    cfg = resolve_config(SAESuiteConfig, cfg, overrides)
    root = Path(folder) if folder is not None else SAES_RELEASES.root() / SAES_RELEASES.release_name(cfg.model)
    with folder_lock(root, "the release folder"):  # two trainings of one release never replace each other's files
        return _train_locked(model, cfg, root, tokens, folder, resume)


def _train_locked(
    model: HookedTransformer,
    cfg: SAESuiteConfig,
    root: Path,
    tokens: torch.Tensor | None,
    folder: str | Path | None,
    resume: bool,
) -> SAESuiteResult:
    n_layers = model.cfg.n_layers
    bad = [layer for layer in cfg.layers if not 0 <= layer < n_layers]
    if bad:
        raise IndexError(
            f"Layers {bad} are out of range; this model has layers 0..{n_layers - 1} "
            f"(e.g. --layers {','.join(str(x) for x in range(0, n_layers, max(1, n_layers // 4)))})."
        )
    train_dir = root / ".train"
    ckpt_dir = train_dir / "checkpoints"
    names = {sae_id(kind, layer): (kind, layer) for layer in cfg.layers for kind in cfg.kinds}
    hooks = {sid: suite_hooks(model, kind, layer) for sid, (kind, layer) in names.items()}

    start = time.perf_counter()
    if tokens is None:
        tokens = load_corpus(cfg.corpus, model, n_seqs=cfg.n_seqs, seq_len=cfg.seq_len, split="train", seed=cfg.seed)
    all_hooks = [h for sid in names for h in hooks[sid]]
    # One folder per (tokens, hooks, precision): a rerun with other sizes gets its own cache instead of a refusal.
    cache_key = hashlib.sha256(
        json.dumps([corpus_fingerprint(tokens), sorted(set(all_hooks)), cfg.autocast_lm]).encode()
    ).hexdigest()[:12]
    device = next(model.parameters()).device
    cache = cache_activations(
        model,
        tokens,
        all_hooks,
        train_dir / f"activations-{cache_key}",
        batch_size=cfg.activation_batch_size,
        autocast=cfg.autocast_lm,
    )
    seconds_activations = time.perf_counter() - start

    state_file = train_dir / "state.json"
    done_file = train_dir / "result" / "result.json"
    if resume and state_file.exists() and done_file.exists():
        old = json.loads(state_file.read_text(encoding="utf-8"))
        done = SAESuiteResult.load(train_dir / "result")
        if old.get("fingerprint") == cfg.fingerprint() and done.complete:
            logger.info(
                "the suite in %s is already trained (%d tokens each); nothing to do", root, done.training_tokens_seen
            )
            return done
    if state_file.exists():
        old = json.loads(state_file.read_text(encoding="utf-8"))
        if old.get("fingerprint") != cfg.fingerprint() or not resume:
            _set_aside(ckpt_dir, reason="config changed" if resume else "resume=False")
    write_json(state_file, {"fingerprint": cfg.fingerprint(), "config": asdict(cfg), "cache": cache.fingerprint})

    torch.manual_seed(cfg.seed)
    dims = {h: model.cfg.d_model for h in all_hooks}
    saes = {
        sid: _build(kind, cfg, dims[hooks[sid][0]], dims[hooks[sid][-1]], str(device))
        for sid, (kind, _) in names.items()
    }
    for sid, (kind, layer) in names.items():
        meta = saes[sid].cfg.metadata
        meta.model_name, meta.hook_name, meta.hook_layer = cfg.model, hooks[sid][0], layer
        if kind == "transcoder":
            meta.hook_name_out, meta.hook_layer_out = hooks[sid][-1], layer
        meta.context_size, meta.prepend_bos = cfg.seq_len, False
        meta.dataset_path = f"tl_query_lens:{cfg.corpus}:train"

    trainer_cfg = SAETrainerConfig(
        total_training_samples=cfg.n_steps * cfg.batch_size_tokens,
        train_batch_size_samples=cfg.batch_size_tokens,
        lr=cfg.lr,
        lr_end=cfg.lr / 10,
        lr_warm_up_steps=cfg.lr_warm_up_steps,
        lr_decay_steps=int(cfg.n_steps * cfg.lr_decay_fraction),
        dead_feature_window=cfg.dead_feature_window,
        feature_sampling_window=max(cfg.dead_feature_window, 100),
        n_checkpoints=cfg.n_checkpoints,
        checkpoint_path=str(ckpt_dir),
        logger=LoggingConfig(log_to_wandb=False),
        n_batches_for_norm_estimate=min(50, cache.n_tokens // cfg.batch_size_tokens),
        autocast=cfg.autocast,
        device=str(device),
    )
    data = ShuffledEpochs(
        cache,
        {sid: hooks[sid] for sid in names},
        cfg.batch_size_tokens,
        cfg.seed,
        seq_len=tokens.shape[1],
        exclude_first_positions=cfg.exclude_first_positions,
        device=device,
    )

    def export(checkpoint: Path | None) -> None:
        _export(trainer, root, cfg, cache, len(data.rows), complete=checkpoint is None)
        if folder is None:
            SAES_RELEASES.register()

    trainer = _CheckpointingTrainer(
        trainer_cfg, saes, {sid: sid for sid in names}, data, data=data, on_checkpoint=export
    )
    resumed_from = _resume(trainer, data, ckpt_dir) if resume else None
    if resumed_from is None and cfg.init_biases_from_mean:
        means = {}
        for sid, (kind, _) in names.items():
            both = _mean_rows(data, hooks[sid], seed=cfg.seed)
            d_in = dims[hooks[sid][0]]
            means[sid] = (both[:d_in], None) if kind == "sae" else (both[:d_in], both[d_in:])
        trainer.means = means

    start = time.perf_counter()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in previous:
            signal.signal(s, interrupt_callback)
        trainer.fit()
    except (KeyboardInterrupt, InterruptedException):
        logger.warning("interrupted: saving a checkpoint at %d samples", trainer.n_training_samples)
        trainer.save_checkpoint(str(trainer.n_training_samples))
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    seconds_training = time.perf_counter() - start
    export(None)
    seen = trainer.n_training_samples
    result = SAESuiteResult(
        release=SAES_RELEASES.release_name(cfg.model),
        folder=str(root),
        sae_ids=list(names),
        training_tokens_seen=seen,
        epochs=seen / len(data.rows),
        n_cached_tokens=cache.n_tokens,
        activation_cache=str(cache.path),
        resumed_from=resumed_from,
        seconds_activations=seconds_activations,
        seconds_training=seconds_training,
        complete=seen >= trainer_cfg.total_training_samples,
        config=asdict(cfg),
    )
    result.save(train_dir / "result")
    if folder is None:
        SAES_RELEASES.register()  # the release now lists what was trained
    return result


def _build(kind: Kind, cfg: SAESuiteConfig, d_in: int, d_out: int, device: str = "cpu"):
    k = cfg.k if kind == "sae" or cfg.transcoder_k is None else cfg.transcoder_k
    common: dict[str, Any] = {"d_in": d_in, "d_sae": cfg.d_sae, "k": k, "dtype": "float32", "device": device}
    if kind == "sae":
        return FastTopKTrainingSAE(TopKTrainingSAEConfig(**common, normalize_activations="expected_average_only_in"))
    return TopKTrainingTranscoder(TopKTrainingTranscoderConfig(**common, d_out=d_out))


def _checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.exists():
        return []
    found = [p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def _resume(trainer: _CheckpointingTrainer, data: ShuffledEpochs, ckpt_dir: Path) -> str | None:
    found = _checkpoints(ckpt_dir)
    if not found:
        return None
    newest = found[-1]
    try:
        trainer.load_checkpoint(newest)
        data.position = int(json.loads((newest / "data_position.json").read_text(encoding="utf-8"))["position"])
    except (
        OSError,
        RuntimeError,
        KeyError,
        ValueError,
        TypeError,
        EOFError,
        pickle.UnpicklingError,
        SafetensorError,
    ) as err:  # UnpicklingError: torch.load(weights_only=True) refused a crafted or corrupt trainer_state.pt
        older = f" The previous checkpoint {found[-2]} is intact." if len(found) > 1 else ""
        reason = " ".join(str(err).split())[:200]
        raise CorruptFileError(
            newest,
            f"cannot be resumed from ({type(err).__name__}: {reason})",
            f"{older.strip()} Move that folder away (e.g. `mv {newest} {newest.parent / ('corrupt-' + newest.name)}`) "
            "and rerun to resume from the one before, or rerun with --restart (resume=False) to start again; "
            "nothing has been deleted.",
        ) from err
    trainer.checkpoint_thresholds = [t for t in trainer.checkpoint_thresholds if t > trainer.n_training_samples]
    logger.info("resumed from %s (%d samples)", newest, trainer.n_training_samples)
    return str(newest)


def _set_aside(ckpt_dir: Path, *, reason: str) -> None:
    if _checkpoints(ckpt_dir):
        target = ckpt_dir.with_name(f"checkpoints-set-aside-{int(time.time())}")
        ckpt_dir.rename(target)
        logger.warning("%s: earlier checkpoints moved to %s (not deleted)", reason, target)


@torch.no_grad()
def _export(
    trainer: MultiSAETrainer, root: Path, cfg: SAESuiteConfig, cache: ActivationCache, n_rows: int, *, complete: bool
) -> None:
    """Write the current dictionaries in SAELens' inference format (activation scaling folded in) + suite.json."""
    for sid, sae in trainer.saes.items():
        scaler = trainer.trainers[sid].activation_scaler
        snapshot = copy.deepcopy(sae)
        if scaler.scaling_factor is not None:
            snapshot.fold_activation_norm_scaling_factor(scaler.scaling_factor)
        staging = root / f".export-{sid}"
        shutil.rmtree(staging, ignore_errors=True)
        snapshot.save_inference_model(str(staging))
        # A dictionary that has not seen all its training tokens never takes the full id: it is exported as
        # ``<sid>.partial`` (its own id in the release) and replaced by ``<sid>`` when training completes.
        name = sid if complete else f"{sid}{PARTIAL_SUFFIX}"
        target, old = root / name, root / f".old-{name}"
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)  # two renames: a reader finds the folder except for microseconds
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        if complete:
            shutil.rmtree(root / f"{sid}{PARTIAL_SUFFIX}", ignore_errors=True)
    seen = trainer.n_training_samples
    write_json(
        root / "suite.json",
        {
            "model": cfg.model,
            "sae_ids": list(trainer.saes),
            "status": "complete" if complete else "partial",
            "training_tokens_seen": seen,
            "training_tokens": cfg.n_steps * cfg.batch_size_tokens,
            "epochs": seen / n_rows,
            "n_cached_tokens": cache.n_tokens,
            "n_training_rows": n_rows,
            "activation_cache": str(cache.path),
            "config": asdict(cfg),
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    logger.info(
        "exported %d dictionaries at %d samples (%.2f epochs) to %s",
        len(trainer.saes),
        seen,
        seen / n_rows,
        root,
    )
