"""torch.distributed support for the engine: each rank sums its slice of the corpus, then sums are all-reduced.

Launch any script that calls the engine with ``torchrun --nproc_per_node N script.py`` after
``torch.distributed.init_process_group("gloo")`` (CPU) or ``"nccl"`` (GPU); the engine notices the initialised group,
takes ``torch.tensor_split(tokens, N)[rank]`` and all-reduces operator sums and token counts, so every rank returns
the operators of the full corpus. Nothing changes for a single process. With a cache folder, each rank keeps its
progress in its own file (``<cache file>.rank{r}of{w}``), resumed by a rerun with the same number of ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tl_query_lens.operators.store import OperatorSet


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_ranks(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (an object all-gather); ``[obj]`` for one process."""
    _rank, world = rank_and_world()
    if world == 1:
        return [obj]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered


def gathered_by_key(mine: dict[Any, Any], order: list[Any]) -> dict[Any, Any]:
    """Every rank's ``{key: value}`` merged, in ``order`` (ranks hold disjoint keys that together cover it);
    ``mine`` itself for one process."""
    if rank_and_world()[1] == 1:
        return mine
    merged = {key: value for part in all_ranks(mine) for key, value in part.items()}
    return {key: merged[key] for key in order}


def world_slice(tokens: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """This rank's contiguous slice of the sequences, with ``(rank, world)``."""
    rank, world = rank_and_world()
    if world == 1:
        return tokens, 0, 1
    return torch.tensor_split(tokens, world)[rank], rank, world


def all_reduce_sums(sums: dict[str, torch.Tensor], count: int) -> tuple[dict[str, torch.Tensor], int]:
    """Sum operator sums and token counts over all ranks (in a fixed hook order, so every rank issues the same calls)."""
    out = {}
    for name, value in sums.items():
        tensor = value.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        out[name] = tensor
    device = next(iter(sums.values())).device if sums else torch.device("cpu")
    total = torch.tensor([count], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return out, int(total.item())


def all_reduce(operators: OperatorSet) -> OperatorSet:
    """An OperatorSet whose sums and count are summed over all ranks (for sets each rank computed on its own shard)."""
    _rank, world = rank_and_world()
    if world == 1:
        return operators
    sums, count = all_reduce_sums(operators.sums, operators.count)
    return OperatorSet(
        kind=operators.kind,
        sums=sums,
        count=count,
        model_name=operators.model_name,
        anchor_hook=operators.anchor_hook,
        corpus_fingerprint=operators.corpus_fingerprint,
        dtype=operators.dtype,
        skip_positions=operators.skip_positions,
        batches_done=-1,
        batch_size=operators.batch_size,
        extra=dict(operators.extra),
    )
