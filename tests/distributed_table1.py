"""Worker for the two-rank torchrun test of Table 1: each rank evaluates its share of three dictionaries, twice (the
second run loads every part from the shared checkpoint folder), and saves what it returned; ``up_key`` mode scores
a gated model's FF-KV with the up-projection key instead, ``features`` mode the three dictionaries in the feature
basis."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from tests.test_table1_saes import table1_inputs
from tl_query_lens.query_lens import table1
from tl_query_lens.query_lens.table1 import evaluate_table1


def main(out: Path, mode: str = "") -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode in ("up_key", "features"):  # operators computed while the signatures are (every rank, one order)
        out.mkdir(exist_ok=True)
        if mode == "up_key":
            model, dictionaries, tokens, kwargs = table1_inputs(up_key=True)
        else:
            model, dictionaries, tokens, kwargs = table1_inputs(3)
            kwargs["basis"] = "features"
        evaluate_table1(model, dictionaries, tokens[:2], tokens, **kwargs).save(out / f"rank{rank}")
        dist.destroy_process_group()
        return
    model, dictionaries, tokens, kwargs = table1_inputs(3)
    evaluated, real = [], table1.evaluate_signatures

    def counted(model, dictionary, *args, **kw):
        evaluated.append(next(label for label, d in dictionaries.items() if d is dictionary))
        return real(model, dictionary, *args, **kw)

    table1.evaluate_signatures = counted
    first = evaluate_table1(model, dictionaries, tokens[:2], tokens, checkpoint_dir=str(out / "parts"), **kwargs)
    first.save(out / f"rank{rank}")
    again = evaluate_table1(model, dictionaries, tokens[:2], tokens, checkpoint_dir=str(out / "parts"), **kwargs)
    record = {"evaluated": evaluated, "resumed": again.config["resumed_dictionaries"]}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
