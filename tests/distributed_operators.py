"""Worker for the two-rank torchrun test: each rank computes operators on its shard; the engine all-reduces them."""

import sys
from pathlib import Path

import torch.distributed as dist

from tests.helpers import tiny_model, tiny_tokens
from tests.test_operators import KEY_HOOKS, VALUE_HOOKS
from tl_query_lens.operators import key_operators, value_operators


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    model = tiny_model("gated_rms")
    tokens = tiny_tokens(model, n_seqs=5)  # odd: the ranks get 3 and 2 sequences
    rank = dist.get_rank()
    value_operators(model, tokens, VALUE_HOOKS, progress=False).save(out / f"value-rank{rank}.safetensors")
    key_operators(model, tokens, KEY_HOOKS, progress=False).save(out / f"key-rank{rank}.safetensors")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
