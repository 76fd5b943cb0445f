"""Corpus-mean transition operators between hook points: the one Jacobian engine every method uses (docs/design.md §4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "EngineConfig": "tl_query_lens.operators.config",
    "OperatorSet": "tl_query_lens.operators.store",
    "all_reduce": "tl_query_lens.operators.distributed",
    "final_hook": "tl_query_lens.operators.engine",
    "key_operators": "tl_query_lens.operators.engine",
    "module_operators": "tl_query_lens.operators.engine",
    "value_operators": "tl_query_lens.operators.engine",
}
__all__ = [
    "EngineConfig",
    "OperatorSet",
    "all_reduce",
    "final_hook",
    "key_operators",
    "module_operators",
    "value_operators",
]

if TYPE_CHECKING:
    from tl_query_lens.operators.config import EngineConfig
    from tl_query_lens.operators.distributed import all_reduce
    from tl_query_lens.operators.engine import final_hook, key_operators, module_operators, value_operators
    from tl_query_lens.operators.store import OperatorSet

__getattr__ = lazy_package(__name__, _EXPORTS)
