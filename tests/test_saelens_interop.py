"""SAELens interop: our architectures load through SAELens' own calls in a process that never imports tl_query_lens,
and every cached readout fit is reachable through ``SAE.from_pretrained``."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sae_lens import SAE

from tests.helpers import tiny_model, tiny_readout
from tl_query_lens import FFKV, FFKVSAE, ReadoutSAE
from tl_query_lens.readout import cached_sae_path, register_releases
from tl_query_lens.readout.registry import release_name

ROOT = Path(__file__).resolve().parents[1]
PTH = "tl_query_lens-saelens.pth"

SCRIPT = """
import json, sys
from sae_lens import SAE
ffkv = SAE.load_from_disk(sys.argv[1])
readout = SAE.load_from_disk(sys.argv[2], dtype="bfloat16")
pretrained = SAE.from_pretrained("tlql-readout-interop-tiny", "mine")
print(json.dumps({"types": [type(s).__module__ + "." + type(s).__name__ for s in (ffkv, readout, pretrained)],
                  "ids": readout.code_indices.tolist()}))
"""


def _installed_pth() -> bool:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any((Path(d) / PTH).is_file() for d in dirs)


def _run_fresh(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter running SCRIPT, which never imports tl_query_lens. Where this environment has the .pth
    installed (a wheel install, or scripts/setup.sh) it is processed at start-up as usual; otherwise the repo's .pth
    is processed the way site.py does for site-packages (``site.addsitedir``) before the script runs."""
    code = SCRIPT
    if not _installed_pth():
        site_dir = tmp_path / "site"
        site_dir.mkdir(exist_ok=True)
        shutil.copy(ROOT / PTH, site_dir / PTH)
        code = f"import site; site.addsitedir({str(site_dir)!r})\n" + SCRIPT
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )


def test_load_without_import(tmp_path):
    model = tiny_model("gated_rms")
    ffkv = FFKV.from_model(model, 1, "topk", k=8)
    readout = tiny_readout(model, d_sae=1024)
    ffkv.save_model(tmp_path / "ffkv")
    readout.save_model(tmp_path / "readout")
    cache = tmp_path / "cache"
    readout.save_model(cache / "readout" / release_name("interop-tiny") / "mine")
    args = [str(tmp_path / "ffkv"), str(tmp_path / "readout")]

    done = _run_fresh(tmp_path, args, TLQL_CACHE=str(cache))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["types"] == [
        "tl_query_lens.dictionaries.ffkv.FFKVSAE",
        "tl_query_lens.readout.sae.ReadoutSAE",
        "tl_query_lens.readout.sae.ReadoutSAE",
    ]
    assert out["ids"] == readout.code_indices.tolist()  # bf16 load, every feature id kept

    # Control: with the start-up hook switched off, SAELens alone cannot resolve the architecture.
    off = _run_fresh(tmp_path, args, TLQL_CACHE=str(cache), TLQL_SAELENS_AUTOLOAD="0")
    assert off.returncode != 0 and "KeyError: 'ffkv'" in off.stderr


def test_hook_is_inert_without_sae_lens_and_when_package_imports_it():
    """The hook imports nothing until sae_lens is imported, and stays out of tl_query_lens' own import."""
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]);"
        "import _tl_query_lens_saelens as h;"
        "assert 'tl_query_lens' not in sys.modules and 'torch' not in sys.modules;"
        "assert any(isinstance(f, h.RegisterAfterSAELens) for f in sys.meta_path);"
        "import tl_query_lens; from sae_lens.registry import SAE_CLASS_REGISTRY as R;"
        "assert {'ffkv', 'readout'} <= set(R); print('ok')"
    )
    site_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"tlql-pth-{os.getpid()}"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(ROOT / PTH, site_dir / PTH)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(site_dir)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
            timeout=600,
            check=False,
        )
    finally:
        shutil.rmtree(site_dir, ignore_errors=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_readout_cached_ids_reachable(tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    model = tiny_model("gelu_ln")
    sae = tiny_readout(model)
    release = release_name("smollm2-135m")
    ids = ["cpu", "quick", "paper", "my-fit"]  # the presets, `tlql demo --quick`, and a user-named --sae-id
    for i, sae_id in enumerate(ids):
        with torch.no_grad():
            sae.b_enc.fill_(float(i))  # tell the fits apart
        sae.save_model(cached_sae_path("smollm2-135m", sae_id))  # cached after the releases were registered

    for i, sae_id in enumerate(ids):
        loaded = SAE.from_pretrained(release, sae_id)
        assert isinstance(loaded, ReadoutSAE) and torch.all(loaded.b_enc == i)
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    assert set(ids) <= set(get_pretrained_saes_directory()[release].saes_map)

    with pytest.raises(FileNotFoundError) as err:
        SAE.from_pretrained(release, "nope")
    message = str(err.value)
    assert "Cached ids" in message and "cpu, my-fit, paper, quick" in message and "--sae-id nope" in message

    # A model with a cached fit but no shipped release gets one when the releases are registered.
    sae.save_model(cached_sae_path("other-model", "cpu"))
    assert release_name("other-model") in register_releases()
    assert isinstance(SAE.from_pretrained(release_name("other-model"), "cpu"), ReadoutSAE)


def test_ffkv_round_trip_is_the_registered_class(tmp_path):
    sae = FFKV.from_model(tiny_model("gelu_ln"), 0)
    sae.save_model(tmp_path / "sae")
    assert type(SAE.load_from_disk(tmp_path / "sae")) is FFKVSAE
