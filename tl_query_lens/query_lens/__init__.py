"""Query Lens: key and value signatures of every feature of a dictionary (docs/design.md §5)."""

from tl_query_lens.query_lens.lens import QueryLens, downstream_modules
from tl_query_lens.query_lens.reference import query_lens_reference
from tl_query_lens.query_lens.result import Signatures

__all__ = ["QueryLens", "Signatures", "downstream_modules", "query_lens_reference"]
