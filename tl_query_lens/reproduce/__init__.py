"""``tlql reproduce``: every row of docs/reproduction.md and the FF-KV comparison table, re-measured from the shipped
dictionaries and set beside the paper's number and the documented one."""

from tl_query_lens.reproduce.experiments import EXPERIMENTS, Experiment
from tl_query_lens.reproduce.rows import ROWS, Row, rows_for
from tl_query_lens.reproduce.run import ReproduceConfig, Reproduction, load_documented, reproduce

__all__ = [
    "EXPERIMENTS",
    "ROWS",
    "Experiment",
    "ReproduceConfig",
    "Reproduction",
    "Row",
    "load_documented",
    "reproduce",
    "rows_for",
]
