"""``tlql reproduce``: every row of docs/reproduction.md and the FF-KV comparison table, re-measured from the shipped
dictionaries and set beside the paper's number and the documented one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "EXPERIMENTS": "tl_query_lens.reproduce.experiments",
    "Experiment": "tl_query_lens.reproduce.experiments",
    "ROWS": "tl_query_lens.reproduce.rows",
    "Row": "tl_query_lens.reproduce.rows",
    "rows_for": "tl_query_lens.reproduce.rows",
    "Reproduction": "tl_query_lens.reproduce.run",
    "load_documented": "tl_query_lens.reproduce.run",
    "reproduce": "tl_query_lens.reproduce.run",
    "ReproduceConfig": "tl_query_lens.reproduce.config",
}
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

if TYPE_CHECKING:
    from tl_query_lens.reproduce.config import ReproduceConfig
    from tl_query_lens.reproduce.experiments import EXPERIMENTS, Experiment
    from tl_query_lens.reproduce.rows import ROWS, Row, rows_for
    from tl_query_lens.reproduce.run import Reproduction, load_documented, reproduce

__getattr__ = lazy_package(__name__, _EXPORTS)
