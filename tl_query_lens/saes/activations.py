"""Model activations at several hooks, computed in one forward pass per batch and kept on disk for many epochs.

On a CPU the model's forward pass costs far more per token than an SAE training step, so the suite runs the model
once over the training tokens (``stop_at_layer`` just past the deepest hook), stores every hook's activations as a
float16 ``.npy`` memmap under the user cache, and trains every dictionary for several epochs from those files.
The pass is resumable: batches already written are kept, and a killed pass restarts after the last one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Int
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.estimates import estimate
from tl_query_lens.hooks import check_hook, hook_dims, hook_layer
from tl_query_lens.results import write_json

logger = logging.getLogger(__name__)

FP16_MAX = 65504.0


@dataclass
class ActivationCache:
    """Float16 activations of ``n_tokens`` tokens at each hook, one ``[n_tokens, d]`` memmap per hook.

    Attributes:
        path: the cache folder.
        hooks: hook names, in file order.
        n_tokens: tokens stored per hook (every position of every sequence, row-major).
        fingerprint: :func:`tl_query_lens.corpus.corpus_fingerprint` of the tokens.
    """

    path: Path
    hooks: list[str]
    n_tokens: int
    fingerprint: str

    def array(self, hook: str) -> np.ndarray:
        """The read-only memmap of ``hook`` (``[n_tokens, d]``, float16)."""
        if hook not in self.hooks:
            raise KeyError(f"{hook!r} is not in this activation cache ({self.path}); it holds {self.hooks}.")
        return np.load(self.path / _file_name(hook), mmap_mode="r")

    @classmethod
    def open(cls, path: str | Path) -> ActivationCache:
        """Open a complete cache written by :func:`cache_activations`."""
        path = Path(path)
        info_file = path / "cache.json"
        if not info_file.exists():
            raise FileNotFoundError(f"No activation cache at {path}; build it with cache_activations(...).")
        info = json.loads(info_file.read_text(encoding="utf-8"))
        if info["done_seqs"] < info["n_seqs"]:
            raise RuntimeError(
                f"The activation cache at {path} is incomplete ({info['done_seqs']} of {info['n_seqs']} "
                "sequences); rerun cache_activations(...) with the same tokens to finish it."
            )
        return cls(path, list(info["hooks"]), info["n_seqs"] * info["seq_len"], info["fingerprint"])


def _file_name(hook: str) -> str:
    return f"{hook}.npy"


@torch.no_grad()
def cache_activations(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    hooks: list[str],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    autocast: bool = False,
) -> ActivationCache:
    """Run ``model`` once over ``tokens`` and store the activations at ``hooks`` as float16 memmaps in ``out_dir``.

    Resumable: a folder holding a partial cache of the same tokens and hooks continues after its last written batch;
    one holding other tokens or hooks raises an error naming the folder (nothing is overwritten).

    ``autocast``: run the forward pass under bf16 autocast (fp32 weights, bf16 matrix products; SAELens'
    ``autocast_lm``); recorded in ``cache.json``, so a cache of the other precision is not reused.

    Raises:
        OverflowError: an activation exceeds the float16 range (its hook and value are named).
    """
    out = Path(out_dir)
    hooks = list(dict.fromkeys(hooks))
    for hook in hooks:
        check_hook(model, hook)
    dims = hook_dims(model, hooks)
    n_seqs, seq_len = tokens.shape
    info = {
        "hooks": hooks,
        "dims": [dims[h] for h in hooks],
        "n_seqs": n_seqs,
        "seq_len": seq_len,
        "fingerprint": corpus_fingerprint(tokens),
        "model": model.cfg.model_name,
        "dtype": "float16",
        "autocast": bool(autocast),
    }
    info_file = out / "cache.json"
    done = 0
    if info_file.exists():
        old = json.loads(info_file.read_text(encoding="utf-8"))
        if {k: old.get(k) for k in info} != info:
            raise ValueError(f"{out} holds activations of other tokens or hooks; choose another folder or delete it.")
        done = int(old["done_seqs"])
    out.mkdir(parents=True, exist_ok=True)
    mode = "r+" if done else "w+"
    arrays = {
        h: np.lib.format.open_memmap(
            out / _file_name(h), mode=mode, dtype=np.float16, shape=(n_seqs * seq_len, dims[h])
        )
        for h in hooks
    }
    write_json(info_file, {**info, "done_seqs": done})
    layers = [hook_layer(h) for h in hooks]
    stop = None if any(layer is None for layer in layers) else max(layers) + 1  # type: ignore[type-var, operator]
    if stop is not None and stop >= model.cfg.n_layers:
        stop = None
    device = next(model.parameters()).device
    n_batches = -(-(n_seqs - done) // batch_size)
    clock = estimate("saes train: activation pass", n_batches, "--n-seqs").on_forward(model)
    with clock, tqdm(total=n_seqs * seq_len, initial=done * seq_len, desc="activation pass", unit="tok") as bar:
        for start in range(done, n_seqs, batch_size):
            batch = tokens[start : start + batch_size].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                _, cache = model.run_with_cache(batch, names_filter=hooks, stop_at_layer=stop)
            rows = slice(start * seq_len, (start + batch.shape[0]) * seq_len)
            for hook in hooks:
                act = cache[hook].reshape(-1, dims[hook]).float()
                peak = act.abs().max().item()
                if not peak < FP16_MAX:
                    raise OverflowError(
                        f"An activation at {hook} reaches {peak:.3g}, beyond float16; "
                        "this model needs a float32 activation cache."
                    )
                arrays[hook][rows] = act.cpu().numpy().astype(np.float16)
            for array in arrays.values():
                array.flush()
            write_json(info_file, {**info, "done_seqs": start + batch.shape[0]})
            bar.update(batch.numel())
    return ActivationCache(out, hooks, n_seqs * seq_len, str(info["fingerprint"]))
