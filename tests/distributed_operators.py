"""Worker for the two-rank torchrun tests: each rank computes operators on its shard; the engine all-reduces them.

``worker.py OUT`` computes value and key operators. ``worker.py OUT stop`` computes value operators with a cache,
one sequence per minibatch, and ends the process (as a kill would) right after its first saved progress;
``worker.py OUT resume`` then reruns it and records how many minibatches each rank swept.
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from tests.helpers import tiny_model, tiny_tokens
from tests.test_operators import KEY_HOOKS, VALUE_HOOKS
from tl_query_lens.operators import engine, key_operators, value_operators
from tl_query_lens.operators.store import OperatorSet


def main(out: Path, mode: str = "") -> None:
    dist.init_process_group("gloo")
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=5)  # odd: the ranks get 3 and 2 sequences
    rank = dist.get_rank()
    if not mode:
        value_operators(model, tokens, VALUE_HOOKS, progress=False).save(out / f"value-rank{rank}.safetensors")
        key_operators(model, tokens, KEY_HOOKS, progress=False).save(out / f"key-rank{rank}.safetensors")
        dist.destroy_process_group()
        return
    if mode == "stop":
        save = OperatorSet.save

        def save_then_stop(self, path):
            save(self, path)
            dist.barrier()  # both ranks' progress is on disk before either stops (torchrun ends the other then)
            os._exit(3)  # killed right after the first minibatch's progress reached the disk

        OperatorSet.save = save_then_stop
    swept, sweep = [], engine._run_sweep

    def counted(model, batch, *args, **kwargs):
        swept.append(batch.shape[0])
        return sweep(model, batch, *args, **kwargs)

    engine._run_sweep = counted
    ops = value_operators(model, tokens, VALUE_HOOKS, progress=False, batch_size=1, cache_dir=str(out / "cache"))
    ops.save(out / f"resumed-rank{rank}.safetensors")
    (out / f"swept-rank{rank}.json").write_text(json.dumps(len(swept)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
