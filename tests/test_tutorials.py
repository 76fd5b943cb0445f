"""Every tutorial runs end to end with small settings (smoke test; they use the embedded model)."""

import os
import runpy
from pathlib import Path

import pytest

TUTORIALS = sorted(Path(__file__).resolve().parent.parent.joinpath("tutorials").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_TUTORIAL_SMALL", "1")
    monkeypatch.setenv("TLQL_TUTORIAL_OUT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")
