"""Corpus-mean transition operators between hook points: the one Jacobian engine every method uses (docs/design.md §4)."""

from tl_query_lens.operators.config import EngineConfig
from tl_query_lens.operators.distributed import all_reduce
from tl_query_lens.operators.engine import final_hook, key_operators, module_operators, value_operators
from tl_query_lens.operators.store import OperatorSet

__all__ = [
    "EngineConfig",
    "OperatorSet",
    "all_reduce",
    "final_hook",
    "key_operators",
    "module_operators",
    "value_operators",
]
