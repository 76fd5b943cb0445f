"""Query Lens: key and value signatures of every feature of a dictionary (docs/design.md §5)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "QueryLens": "tl_query_lens.query_lens.lens",
    "downstream_modules": "tl_query_lens.query_lens.lens",
    "query_lens_reference": "tl_query_lens.query_lens.reference",
    "Signatures": "tl_query_lens.query_lens.result",
}
__all__ = [
    "QueryLens",
    "Signatures",
    "downstream_modules",
    "query_lens_reference",
]

if TYPE_CHECKING:
    from tl_query_lens.query_lens.lens import QueryLens, downstream_modules
    from tl_query_lens.query_lens.reference import query_lens_reference
    from tl_query_lens.query_lens.result import Signatures

__getattr__ = lazy_package(__name__, _EXPORTS)
