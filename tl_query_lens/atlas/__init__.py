"""The feature atlas: every feature of every dictionary as a static, offline, searchable site (``tlql atlas``).

    from tl_query_lens.atlas import AtlasConfig, build_atlas
    result = build_atlas(model, ["ffkv:12"], AtlasConfig(out="atlas", features="0-255"))
    print(result.index_html)   # open it in a browser, from file://

See docs/atlas.md.
"""

from tl_query_lens.atlas.build import AtlasResult, DictionaryQuality, build_atlas, load_any_result
from tl_query_lens.atlas.config import AtlasConfig

__all__ = ["AtlasConfig", "AtlasResult", "DictionaryQuality", "build_atlas", "load_any_result"]
