"""Saved SAE folders (SAELens format: ``cfg.json`` + ``sae_weights.safetensors``), checked before they are loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_lens import SAE
from sae_lens.constants import SAE_CFG_FILENAME, SAE_WEIGHTS_FILENAME
from sae_lens.registry import SAE_CLASS_REGISTRY

from tl_query_lens.errors import CorruptFileError, MissingFileError
from tl_query_lens.results import read_json, read_tensors
from tl_query_lens.tensor_checks import check_device

SAVE_FIX = (
    "Pass a folder written by sae.save_model(folder) or the SAELens training runner "
    f"({SAE_CFG_FILENAME} + {SAE_WEIGHTS_FILENAME}); re-save it if it was cut short."
)
REQUIRED_KEYS = ("d_in", "d_sae", "dtype")


def check_sae_folder(path: str | Path) -> dict[str, Any]:
    """Check that ``path`` holds a loadable SAE without building it; returns its ``cfg.json``.

    Raises:
        MissingFileError: ``path`` is not a folder.
        CorruptFileError: the config or weights are missing, unreadable, incomplete or of an unknown architecture
            (the message names the file and the fix).
    """
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"{path} is not a folder holding a saved SAE. {SAVE_FIX}")
    cfg_file = path / SAE_CFG_FILENAME
    if not cfg_file.is_file():
        raise CorruptFileError(path, f"holds no {SAE_CFG_FILENAME}, so it is not a saved SAE", SAVE_FIX)
    cfg = read_json(cfg_file, fix=SAVE_FIX)
    if not isinstance(cfg, dict):
        raise CorruptFileError(cfg_file, "is not a JSON object", SAVE_FIX)
    missing = [key for key in REQUIRED_KEYS if key not in cfg]
    if missing:
        raise CorruptFileError(cfg_file, f"lacks {missing}, so it is not an SAELens SAE config", SAVE_FIX)
    architecture = cfg.get("architecture", "standard")
    if architecture not in SAE_CLASS_REGISTRY:
        raise CorruptFileError(
            cfg_file,
            f"names architecture {architecture!r}, which SAELens does not know (known: {sorted(SAE_CLASS_REGISTRY)})",
            "Import the package that registers it first (tl_query_lens registers 'ffkv' and "
            "'readout'), or re-save the SAE.",
        )
    weights, _ = read_tensors(path / SAE_WEIGHTS_FILENAME, fix=SAVE_FIX)
    if "W_dec" not in weights:
        raise CorruptFileError(
            path / SAE_WEIGHTS_FILENAME, f"holds no W_dec (tensors: {sorted(weights)[:8]})", SAVE_FIX
        )
    return cfg


def load_sae(path: str | Path, *, device: str = "cpu") -> SAE:
    """``SAE.load_from_disk`` after :func:`check_sae_folder`; SAELens errors on a malformed folder name the folder."""
    check_sae_folder(path)
    check_device(device, "device")  # before loading: a device that is missing here is not a corrupt folder
    try:
        return SAE.load_from_disk(str(path), device=device)
    except (
        KeyError,
        TypeError,
        ValueError,
        RuntimeError,
    ) as err:  # a config field or tensor shape SAELens rejects
        raise CorruptFileError(path, f"could not be loaded by SAELens ({type(err).__name__}: {err})", SAVE_FIX) from err
