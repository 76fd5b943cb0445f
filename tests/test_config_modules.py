"""The config modules import none of torch, TransformerLens and SAELens, so the command line can build its parser
from them before any of those loads (docs/architecture.md, "Configs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "tl_query_lens"
HEAVY = ("torch", "transformer_lens", "sae_lens")


def config_modules() -> list[str]:
    """The config convention module, the demo's config and every ``<package>/config.py``."""
    nested = sorted(f"tl_query_lens.{path.parent.name}.config" for path in PACKAGE.glob("*/config.py"))
    return ["tl_query_lens.config", "tl_query_lens.demo_config", *nested]


def test_every_method_package_has_a_config_module():
    """The list the next test imports is the one it should be (a package that lost its config.py would shrink it)."""
    packages = {"atlas", "certify", "dictionaries", "operators", "query_lens", "readout", "reproduce", "saes"}
    assert {f"tl_query_lens.{name}.config" for name in packages} <= set(config_modules())


def test_config_modules_import_no_heavy_library():
    """One fresh interpreter imports every config module; none of torch, TransformerLens, SAELens is loaded."""
    code = (
        "import json, sys\n"
        + "".join(f"import {module}\n" for module in config_modules())
        + f"print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, cwd=REPOSITORY
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing the config modules loaded {loaded}: a config module imports a heavy module"
