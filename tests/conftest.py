import os

import pytest
import torch

from tests.helpers import style  # noqa: F401  (fixture)

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# The exactness tests compare against fp32 references: every "auto" precision runs fp32 in the suite (a CPU with
# bf16 units would otherwise take bf16); tests/test_precision.py sets the variable itself.
os.environ.setdefault("TLQL_PRECISION", "float32")
# two threads on the 2-core CI machine; OMP_NUM_THREADS=1 where the cores are shared (spinning threads stall)
torch.set_num_threads(max(1, min(int(os.environ.get("OMP_NUM_THREADS") or 2), os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def embedded_model():
    """The embedded SmolLM2-135M (slow tests only)."""
    from tl_query_lens import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def demo_quick_atlas(embedded_model, tmp_path_factory):
    """The atlas ``tlql demo --quick`` builds (every feature of its cards' dictionary, the embedded model), built once
    per session by the demo's own function (slow tests only; its cost with the link walk over it:
    docs/benchmarks/demo_atlas_walk.json)."""
    from tl_query_lens.demo import demo_atlas
    from tl_query_lens.demo_config import DemoConfig

    cfg = DemoConfig.quick(out=tmp_path_factory.mktemp("demo_quick"))
    demo_atlas(embedded_model, cfg)
    return cfg.out / "atlas", f"{cfg.ql_layer}-ffkv", embedded_model.cfg.d_mlp
