"""OperatorSet: corpus sums of transition operators with the metadata needed to reuse, resume and merge them (docs/design.md §4).

An operator is stored as the SUM over valid tokens T of the per-token Jacobian (summed over source positions, i.e. a
tangent broadcast to every position) plus the token count |T|, in fp32. The corpus mean ``sums / count`` is what
methods use; sums are what shards add (``merge``, ``all_reduce``) and what a resumed run keeps accumulating.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float
from safetensors import SafetensorError, safe_open

from tl_query_lens.errors import CorruptFileError
from tl_query_lens.results import loads_json, read_tensors, write_tensors
from tl_query_lens.tensor_checks import check_finite

OperatorKind = Literal["value", "key", "module"]
_KINDS = ("value", "key", "module")
FORMAT_VERSION = 1


@dataclass
class OperatorSet:
    """Named corpus-mean operators ``[d_out, d_in]``, stored as fp32 sums plus the valid-token count.

    ``ops[name]`` is the mean operator (``sums[name] / count``). For value operators ``name`` is the source hook and the
    operator maps a perturbation there to the change of ``anchor_hook`` (the final residual unless a ``destination`` was
    given); for key operators
    ``name`` is the destination hook and the operator maps a perturbation of ``anchor_hook`` (``hook_embed``) to it; for
    module operators the names are ``blocks.k.attn`` (∂attn_out_k/∂resid_pre_k) and ``blocks.k.mlp``
    (∂mlp_out_k/∂resid_mid_k).

    Attributes:
        kind: ``"value"``, ``"key"`` or ``"module"``.
        sums: operator sums over valid tokens, fp32, each ``[d_out, d_in]``.
        count: number of valid tokens |T| summed over.
        model_name: ``model.cfg.model_name`` of the model linearised.
        anchor_hook: the final hook (value), the embedding hook (key), or ``""`` (module).
        corpus_fingerprint: :func:`tl_query_lens.corpus.corpus_fingerprint` of the full token batch.
        dtype: the model dtype the Jacobians were computed in.
        skip_positions: positions ``< skip_positions`` of every sequence are excluded from T.
        batches_done: sequence minibatches accumulated so far (for resuming); ``-1`` once complete.
        batch_size: sequences per minibatch (resuming needs the same split).
        extra: free-form JSON-able metadata (the sweep direction used; ``basis``: the fingerprint of the feature basis
            when the operators were computed on one, i.e. hold ``M Vᵀ`` / ``K N`` instead of ``M`` / ``N``).
    """

    kind: OperatorKind
    sums: dict[str, Float[torch.Tensor, "d_out d_in"]]
    count: int
    model_name: str
    anchor_hook: str
    corpus_fingerprint: str
    dtype: str
    skip_positions: int = 0
    batches_done: int = -1
    batch_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {self.kind!r}.")
        self.sums = {name: s.detach().to(torch.float32) for name, s in self.sums.items()}

    # ----- access -------------------------------------------------------------------------------------------------
    @property
    def hooks(self) -> list[str]:
        """Operator names, in insertion order."""
        return list(self.sums)

    @property
    def complete(self) -> bool:
        return self.batches_done < 0

    def keys(self):
        return self.sums.keys()

    def __contains__(self, name: object) -> bool:
        return name in self.sums

    def __iter__(self):
        return iter(self.sums)

    def __len__(self) -> int:
        return len(self.sums)

    def __getitem__(self, name: str) -> Float[torch.Tensor, "d_out d_in"]:
        """The corpus-mean operator ``sums[name] / count``; raises on unknown names and non-finite entries."""
        if name not in self.sums:
            raise KeyError(f"No {self.kind} operator for {name!r}; this set holds {self.hooks}.")
        if self.count <= 0:
            raise ValueError("This OperatorSet has no tokens (count = 0); compute it on a non-empty corpus.")
        mean = self.sums[name] / self.count
        check_operator(mean, f"{self.kind} operator {name!r}")
        return mean

    def items(self):
        return ((name, self[name]) for name in self.sums)

    @property
    def device(self) -> torch.device:
        """Where the sums live (the model's device after the engine; CPU after :meth:`load`)."""
        return next(iter(self.sums.values())).device if self.sums else torch.device("cpu")

    def to(self, device: str | torch.device) -> OperatorSet:
        """The same set with its sums on ``device`` (a no-op copy-free view when they are already there)."""
        return dataclasses.replace(self, sums={name: s.to(device) for name, s in self.sums.items()})

    # ----- combining ----------------------------------------------------------------------------------------------
    def compatible(self, other: OperatorSet) -> bool:
        return (
            self.kind,
            self.model_name,
            self.anchor_hook,
            self.dtype,
            self.skip_positions,
            self.hooks,
            self.extra.get("basis"),
        ) == (
            other.kind,
            other.model_name,
            other.anchor_hook,
            other.dtype,
            other.skip_positions,
            other.hooks,
            other.extra.get("basis"),
        )

    def merge(self, other: OperatorSet) -> OperatorSet:
        """Sums and counts of two shards added (e.g. two corpora, or two ranks); metadata must agree."""
        if not self.compatible(other):
            raise ValueError(
                "Cannot merge operator sets with different kind/model/anchor/dtype/skip_positions/hooks: "
                f"{self.describe()} vs {other.describe()}."
            )
        fingerprint = self.corpus_fingerprint
        if other.corpus_fingerprint != fingerprint:
            fingerprint = "+".join(sorted({*fingerprint.split("+"), *other.corpus_fingerprint.split("+")}))
        return dataclasses.replace(
            self,
            sums={name: self.sums[name] + other.sums[name] for name in self.sums},
            count=self.count + other.count,
            corpus_fingerprint=fingerprint,
            batches_done=-1,
        )

    def describe(self) -> str:
        return (
            f"{self.kind} operators of {self.model_name} ({len(self)} hooks, {self.count} tokens, "
            f"corpus {self.corpus_fingerprint}, {self.dtype}, skip {self.skip_positions})"
        )

    # ----- disk ---------------------------------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "count": self.count,
            "model_name": self.model_name,
            "anchor_hook": self.anchor_hook,
            "corpus_fingerprint": self.corpus_fingerprint,
            "dtype": self.dtype,
            "skip_positions": self.skip_positions,
            "batches_done": self.batches_done,
            "batch_size": self.batch_size,
            "hooks": self.hooks,
            "extra": self.extra,
        }

    def save(self, path: str | Path) -> Path:
        """Write sums + metadata to one safetensors file (atomic)."""
        return write_tensors(path, {name: s for name, s in self.sums.items()}, self.metadata())

    @classmethod
    def load(cls, path: str | Path) -> OperatorSet:
        """Read a file written by :meth:`save`; a truncated or foreign file raises a
        :class:`~tl_query_lens.errors.CorruptFileError` that names it and says to delete it."""
        fix = (
            "Delete it and rerun: the operators are recomputed (cached operator files are safe to delete; "
            "another cache folder works too: cache_dir= / --cache-dir)."
        )
        tensors, meta = read_tensors(path, fix=fix)
        if meta.get("format") != FORMAT_VERSION:
            raise CorruptFileError(
                path, f"is not an OperatorSet file of format {FORMAT_VERSION} (format {meta.get('format')!r})", fix
            )
        try:
            return cls(
                kind=meta["kind"],
                sums={name: tensors[name] for name in meta["hooks"]},
                count=int(meta["count"]),
                model_name=meta["model_name"],
                anchor_hook=meta["anchor_hook"],
                corpus_fingerprint=meta["corpus_fingerprint"],
                dtype=meta["dtype"],
                skip_positions=int(meta["skip_positions"]),
                batches_done=int(meta["batches_done"]),
                batch_size=int(meta["batch_size"]),
                extra=meta.get("extra", {}),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptFileError(path, f"lacks operator data or metadata ({type(err).__name__}: {err})", fix) from err


# Where NaN/inf in an operator comes from, for the error message.
OPERATOR_HINT = (
    "The model produced non-finite activations or gradients on this corpus: compute operators in "
    "float32, check the model's weights and the tokens, or drop the offending sequences."
)


def check_operator(tensor: torch.Tensor, what: str) -> torch.Tensor:
    """:func:`~tl_query_lens.tensor_checks.check_finite` with the operator hint."""
    return check_finite(tensor, what, hint=OPERATOR_HINT)


def cache_path(
    cache_dir: str | Path,
    kind: str,
    model_name: str,
    hooks: list[str],
    fingerprint: str,
    dtype: str,
    skip_positions: int,
) -> Path:
    """Deterministic file name for an operator set, keyed by everything that changes its value."""
    key = json.dumps([kind, model_name, sorted(hooks), fingerprint, dtype, skip_positions, FORMAT_VERSION])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{kind}-{_safe_name(model_name)}-{digest}.safetensors"


def _safe_name(model_name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model_name)


def find_cached(
    cache_dir: str | Path, kind: str, model_name: str, names: list[str], want: dict[str, Any]
) -> OperatorSet | None:
    """The operators ``names`` from a complete cached set of another sweep that holds them all (a sweep over more
    hooks: an atlas's all-layer sweep, when one dictionary is added later), or None.

    A file is used only when everything that changes an operator's value matches: ``want`` gives ``count``-free
    metadata (``corpus_fingerprint``, ``dtype``, ``skip_positions``, ``anchor_hook``) and the ``extra`` entries
    ``weights`` (the weights fingerprint), ``directions`` and ``basis``. Files written before the weights entry
    existed never match. Only the metadata header and the requested tensors are read.
    """
    extra = want.pop("extra", {})
    for path in sorted(Path(cache_dir).glob(f"{kind}-{_safe_name(model_name)}-*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                meta = {k: loads_json(v) for k, v in (handle.metadata() or {}).items()}
                if (
                    meta.get("format") != FORMAT_VERSION
                    or meta.get("kind") != kind
                    or meta.get("model_name") != model_name
                    or meta.get("batches_done") != -1
                    or any(meta.get(k) != v for k, v in want.items())
                    or any((meta.get("extra") or {}).get(k) != v for k, v in extra.items())
                    or not set(names) <= set(meta.get("hooks", []))
                ):
                    continue
                sums = {name: handle.get_tensor(name) for name in names}
        except (SafetensorError, json.JSONDecodeError, OSError, RuntimeError):
            continue  # an unreadable file is not ours to judge here; the exact-key lookup reports those
        return OperatorSet(
            kind=kind,  # type: ignore[arg-type]
            sums=sums,
            count=int(meta["count"]),
            model_name=model_name,
            anchor_hook=meta["anchor_hook"],
            corpus_fingerprint=meta["corpus_fingerprint"],
            dtype=meta["dtype"],
            skip_positions=int(meta["skip_positions"]),
            batches_done=-1,
            batch_size=int(meta["batch_size"]),
            extra={**meta.get("extra", {}), "from": path.name},
        )
    return None
