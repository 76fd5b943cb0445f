"""The feature atlas: every feature of every dictionary as a static, offline, searchable site (``tlql atlas``).

    from tl_query_lens.atlas import AtlasConfig, build_atlas
    result = build_atlas(model, ["ffkv:12"], AtlasConfig(out="atlas", features="0-255"))
    print(result.index_html)   # open it in a browser, from file://

See docs/atlas.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tl_query_lens.lazy import lazy_package

_EXPORTS = {
    "AtlasConfig": "tl_query_lens.atlas.config",
    "AtlasResult": "tl_query_lens.atlas.build",
    "DictionaryQuality": "tl_query_lens.atlas.build",
    "build_atlas": "tl_query_lens.atlas.build",
    "load_any_result": "tl_query_lens.atlas.build",
}
__all__ = [
    "AtlasConfig",
    "AtlasResult",
    "DictionaryQuality",
    "build_atlas",
    "load_any_result",
]

if TYPE_CHECKING:
    from tl_query_lens.atlas.build import AtlasResult, DictionaryQuality, build_atlas, load_any_result
    from tl_query_lens.atlas.config import AtlasConfig

__getattr__ = lazy_package(__name__, _EXPORTS)
