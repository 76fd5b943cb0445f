"""Checks of what no config can check alone: paths, files, the model name, the device, sizes against the model.

They run after the options are parsed and before any model is loaded. The embedded model's dimensions are known
without loading it; other models are checked again by the methods once loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformer_lens.loading_from_pretrained import get_official_model_name

from tl_query_lens import tensor_checks
from tl_query_lens.broad_corpus import read_manifest
from tl_query_lens.config import RunConfig
from tl_query_lens.corpus import read_documents
from tl_query_lens.errors import InputError, MissingFileError
from tl_query_lens.limits import ModelDims
from tl_query_lens.models import _ALIASES, EMBEDDED_MODELS, smollm2_config
from tl_query_lens.paths import check_folder
from tl_query_lens.sources import check_ffkv_layer, parse_source


def check_corpus(source: str, what: str = "--corpus") -> None:
    """'embedded' / 'stdlib' / 'broad' (installed), an existing .txt/.jsonl file or folder with documents (every line of a .jsonl parsed),
    or a Hugging Face dataset name (read later: needs a hub)."""
    if source in ("embedded", "stdlib"):
        return
    if source == "broad":  # installed by `scripts/setup.sh --broad-corpus`; the error names that option
        read_manifest()
        return
    path = Path(source).expanduser()
    if path.exists():
        if path.is_file() and path.suffix not in {".txt", ".jsonl"}:
            raise InputError(
                f"{what} {path}: corpus files are .txt (blank-line-separated documents) or .jsonl "
                "({'text': ...} per line); rename or convert it."
            )
        if not read_documents(path):
            raise InputError(
                f"{what} {path} holds no documents; a .txt needs text (documents separated by blank "
                "lines), a .jsonl one {'text': ...} object per line."
            )
        return
    if source.startswith(("/", ".", "~")) or path.suffix in {".txt", ".jsonl", ".json"} or source.count("/") > 1:
        raise MissingFileError(
            f"{what} {source}: no such file or folder. Give an existing .txt/.jsonl file or folder, or 'embedded'."
        )


def check_model_name(name: str) -> ModelDims | None:
    """Refuse names neither embedded nor known to TransformerLens; dimensions of the embedded model (else None)."""
    if _ALIASES.get(name.lower(), name.lower()) in EMBEDDED_MODELS:
        cfg = smollm2_config()
        return ModelDims(cfg.n_layers, cfg.d_mlp or 0, cfg.d_vocab, cfg.n_ctx, cfg.d_model)
    try:
        get_official_model_name(name)
    except ValueError:
        raise InputError(
            f"--model {name!r} is neither the embedded model ('smollm2-135m', offline) nor a "
            "TransformerLens model name (transformer_lens.loading.OFFICIAL_MODEL_NAMES)."
        ) from None
    return None


def check_device(device: str | None) -> None:
    """``--device``: a torch device that exists here (see :func:`tl_query_lens.tensor_checks.check_device`)."""
    tensor_checks.check_device(device, "--device")


def check_run(run: RunConfig, *, folders: dict[str, Any] | None = None, **seq_lens: int | None) -> ModelDims | None:
    """Model name, device, corpus, ``--out`` and the other ``folders`` (option → path or None), and each of
    ``seq_lens`` (option name → length) against the embedded model's context. Returns its dimensions (else None)."""
    dims = check_model_name(run.model)
    check_device(run.device)
    for what, path in {"--out": run.out, **(folders or {})}.items():
        if path:
            check_folder(path, what)
    check_corpus(run.corpus)
    if dims is not None:  # FF-KV layers of --dictionary against the model, before it loads
        for item in ",".join(run.dictionary or ()).split(","):
            if item.strip().startswith("ffkv"):
                check_ffkv_layer(parse_source(item), dims.n_layers)
    check_context(dims, **{"seq_len": run.seq_len, **seq_lens})
    return dims


def check_context(dims: ModelDims | None, **seq_lens: int | None) -> None:
    """Each of ``seq_lens`` (option name → length) against the model's context (nothing while ``dims`` is None)."""
    for name, length in seq_lens.items():
        if dims is not None and length is not None and length > dims.n_ctx:
            raise InputError(f"--{name.replace('_', '-')} {length} exceeds the model context {dims.n_ctx}.")
