import os

import pytest
import torch

from tests.helpers import style  # noqa: F401  (fixture)

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# The exactness tests compare against fp32 references: every "auto" precision runs fp32 in the suite (a CPU with
# bf16 units would otherwise take bf16); tests/test_precision.py sets the variable itself.
os.environ.setdefault("TLQL_PRECISION", "float32")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def embedded_model():
    """The embedded SmolLM2-135M (slow tests only)."""
    from tl_query_lens import load_model

    return load_model("smollm2-135m", device="cpu")
