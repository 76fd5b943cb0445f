import os

import pytest
import torch

from tests.helpers import style  # noqa: F401  (fixture)

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# two threads on the 2-core CI machine; OMP_NUM_THREADS=1 where the cores are shared (spinning threads stall)
torch.set_num_threads(max(1, min(int(os.environ.get("OMP_NUM_THREADS") or 2), os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def embedded_model():
    """The embedded SmolLM2-135M (slow tests only)."""
    from tl_query_lens import load_model

    return load_model("smollm2-135m", device="cpu")
