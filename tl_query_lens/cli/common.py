"""The steps every ``tlql`` analysis takes once its options are checked: model, corpus, tracker, printed rows."""

from __future__ import annotations

import argparse
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch

from tl_query_lens import corpus, models
from tl_query_lens.config import RunConfig
from tl_query_lens.tracking import Tracker


def load_model(run: RunConfig):
    """The model of ``--model`` on ``--device`` (through :func:`tl_query_lens.models.load_model`)."""
    return models.load_model(run.model, device=run.device)


def load_tokens(
    run: RunConfig, model, split: corpus.Split, *, n_seqs: int | None = None, seq_len: int | None = None
) -> torch.Tensor:
    """``[n_seqs, seq_len]`` windows of ``split`` of ``--corpus`` (sizes default to ``--n-seqs`` / ``--seq-len``)."""
    return corpus.load_corpus(
        run.corpus, model, n_seqs=n_seqs or run.n_seqs, seq_len=seq_len or run.seq_len, split=split, seed=run.seed
    )


def tracker(
    run: RunConfig, name: str, args: argparse.Namespace, out: str | Path | None = None, **configs: Any
) -> Tracker:
    """The run's :class:`Tracker`: the options as given plus the configs built from them are its config."""
    record = {k: v for k, v in vars(args).items() if not callable(v)}
    record |= {
        key: asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else cfg for key, cfg in configs.items()
    }
    return Tracker(Path(out or run.out), project=run.wandb_project, name=name, config=record, use_wandb=run.wandb)


def print_rows(columns: list[str] | tuple[str, ...], rows: list[list[Any]]) -> None:
    """One line per row: ``column=value`` (floats to 4 significant digits)."""
    for row in rows:
        print("  " + ", ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(columns, row)))
