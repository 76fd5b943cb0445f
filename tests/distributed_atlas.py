"""Worker for the torchrun atlas test: every rank builds its dictionaries of a tiny model's atlas in one folder."""

import sys
from pathlib import Path

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens.atlas import AtlasConfig, build_atlas


def main(out: Path) -> None:
    model = tiny_model("gelu_ln")
    cfg = AtlasConfig(
        out=out, dictionary=("ffkv:0", "ffkv:1", "ffkv:2"), n_tokens=24 * 16, seq_len=16, shard_size=32, band_sample=8
    )
    tokens = tiny_tokens(model, n_seqs=cfg.n_seqs, seq_len=16)
    build_atlas(model, None, cfg, tokens=tokens, operator_tokens=tiny_tokens(model, 2, 8, seed=1), progress=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
