"""The readout SAE: a TopK dictionary of the LM head's rows, as an SAELens SAE (docs/design.md §6, Sparse Readout Prism).

Rows w_t of the unembedding (columns of TL's ``W_U``) are centred and normalised, μ = mean row, a_t = ‖w_t − μ‖,
x_t = (w_t − μ)/a_t, and a TopK SAE with unit-norm decoder rows d_i and no decoder bias is fitted to the x_t.
In row space every token's row is then exactly

    w_t = μ + Σ_i z_{t,i} d_i + r_t,   z_t = a_t · TopK_k(ReLU(x_t W_enc + b_enc)).

As an SAELens SAE the input is a row w (d_in = d_model): ``encode(w)`` returns the row-space code z (a_t folded in)
and ``decode(z) = z W_dec + b_dec`` with ``b_dec = μ``, so ``decode(encode(w_t))`` reconstructs w_t. The paper's
"no decoder bias" refers to the normalised space; in row space the only shift is the shared bias μ.
The fitted codes of every vocabulary row are stored (``code_indices``/``code_values``, [d_vocab, k]) together with
the row norms a_t, so a saved dictionary decomposes scores without re-encoding. The release shipped inside the package
leaves the codes out (they are 38 of its 41 MB): they are a function of the encoder and the LM-head rows, so the
first :func:`check_compatible` against the model (which every readout method calls) recomputes them with
:meth:`ReadoutSAE.store_codes`; until then reading them raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from sae_lens import SAE, SAEConfig, register_sae_class
from sae_lens.registry import SAE_CLASS_REGISTRY
from torch import nn

from tl_query_lens.errors import InputTypeError
from tl_query_lens.primitives import normalise_rows, topk_relu, topk_relu_codes

logger = logging.getLogger(__name__)


@dataclass
class ReadoutSAEConfig(SAEConfig):
    """Config of a readout SAE (``d_in`` = d_model, ``d_sae`` = width).

    Attributes:
        d_vocab: number of unembedding rows the dictionary was fitted to.
        k: TopK budget per row.
        input_scale: multiplies the code z; 1 unless ``fold_activation_norm_scaling_factor`` folded an input scale
            (the encoder only sees the direction of w − μ, so the scale cannot live in ``W_enc``).
    """

    d_vocab: int = 0
    k: int = 64
    input_scale: float = 1.0
    apply_b_dec_to_input: bool = True

    @classmethod
    def architecture(cls) -> str:
        return "readout"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_vocab <= 0:
            raise ValueError("ReadoutSAEConfig.d_vocab must be the model's vocabulary size (rows of the LM head).")
        if not 0 < self.k <= self.d_sae:
            raise ValueError(f"k must be in 1..d_sae={self.d_sae}, got {self.k}.")
        if not self.apply_b_dec_to_input:
            raise ValueError(
                "A readout SAE subtracts the row mean μ (= b_dec) from its input: keep apply_b_dec_to_input."
            )

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict()


class ReadoutSAE(SAE[ReadoutSAEConfig]):
    """Readout SAE; see the module docstring. Build one with :meth:`fit`, load one with ``SAE.load_from_disk``."""

    W_enc: nn.Parameter
    b_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    row_norms: torch.Tensor
    code_indices: torch.Tensor
    code_values: torch.Tensor

    def initialize_weights(self) -> None:
        cfg, kw = self.cfg, {"dtype": self.dtype, "device": self.device}
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, **kw))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, **kw))
        self.register_buffer("row_norms", torch.ones(cfg.d_vocab, **kw))
        self.register_buffer("code_indices", torch.zeros(cfg.d_vocab, cfg.k, dtype=torch.int64, device=self.device))
        self.register_buffer("code_values", torch.zeros(cfg.d_vocab, cfg.k, **kw))
        # The LM-head rows set by :func:`~tl_query_lens.readout.decompose.bind` (not saved; moved by ``.to``).
        self.register_buffer("bound_rows", None, persistent=False)
        self._residual_cache: tuple | None = None
        self.codes_pending = False  # True for a dictionary loaded without its codes (the shipped release)

    # ----------------------------------------------------------------------------------------------- SAE interface
    @property
    def mu(self) -> Float[torch.Tensor, " d_model"]:
        """The shared bias μ (mean unembedding row)."""
        return self.b_dec

    def normalized_codes(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_sae"]:
        """TopK_k(ReLU(x W_enc + b_enc)) for normalised rows x (the space the SAE is trained in)."""
        pre = self.hook_sae_acts_pre(x @ self.W_enc + self.b_enc)
        return topk_relu(pre, self.cfg.k)

    def encode(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_sae"]:
        """Row-space code z = a·TopK(ReLU(x̄ W_enc + b_enc)) of rows w, x̄ = (w − μ)/a, a = ‖w − μ‖."""
        centred = self.process_sae_in(x)
        norms = centred.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(centred.dtype).tiny)
        codes = self.normalized_codes(centred / norms)
        return self.hook_sae_acts_post(codes * (norms * self.cfg.input_scale))

    def decode(self, feature_acts: Float[torch.Tensor, "... d_sae"]) -> Float[torch.Tensor, "... d_model"]:
        """μ + z W_dec: the reconstructed row."""
        return self.hook_sae_recons(feature_acts @ self.W_dec + self.b_dec)

    # ``forward`` is SAELens' own: it adds the error term when ``use_error_term`` is set and fires hook_sae_error /
    # hook_sae_output (the readout SAE reads and writes the same space).

    @torch.no_grad()
    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """Fold a constant input scale s: afterwards ``encode(x) == original.encode(s·x)`` and
        ``decode(z) == original.decode(z) / s`` (SAELens' convention). The encoder sees only the direction of
        w − μ, so s goes into ``cfg.input_scale`` instead of ``W_enc``; μ, the decoder and the row norms are
        divided by s, so the stored codes stay exact for rows w_t/s (decompose against an unscaled LM head refuses
        the folded dictionary: its rows no longer match)."""
        s = float(scaling_factor)
        self.W_dec.data /= s
        self.b_dec.data /= s
        self.row_norms /= s
        self.cfg.input_scale *= s
        self.cfg.normalize_activations = "none"

    @torch.no_grad()
    def fold_and_get_W_dec_norm(self) -> torch.Tensor:
        """Decoder rows are unit-norm by construction, so folding is the identity; any other norms would change
        which k codes survive (as for SAELens' ``TopKSAE``), so they are refused."""
        norms = self.get_W_dec_norm()
        if (norms - 1).abs().max().item() > 1e-5:
            raise NotImplementedError(
                "fold_W_dec_norm would change which k features this readout SAE keeps (its decoder rows are not unit "
                "norm, e.g. after fold_activation_norm_scaling_factor): load it without fold_W_dec_norm=True."
            )
        return norms

    def process_state_dict_for_saving(self, state_dict: dict[str, Any]) -> None:
        super().process_state_dict_for_saving(state_dict)
        # SAELens' loaders cast every stored tensor to the requested dtype (bfloat16 is exact only up to 256,
        # float16 up to 2048): store the feature ids as base-256 digits, which every float dtype holds exactly.
        state_dict[ID_DIGITS_KEY] = ids_to_digits(state_dict.pop("code_indices"), self.cfg.d_sae)

    def process_state_dict_for_loading(self, state_dict: dict[str, Any]) -> None:
        super().process_state_dict_for_loading(state_dict)
        if CODE_KEYS.isdisjoint(state_dict):  # packed without codes: recomputed against the model's rows on bind
            self.codes_pending = True
            like = state_dict["row_norms"]  # the module may still be on the meta device here
            shape = (self.cfg.d_vocab, self.cfg.k)
            state_dict["code_indices"] = torch.zeros(shape, dtype=torch.int64, device=like.device)
            state_dict["code_values"] = torch.zeros(shape, dtype=like.dtype, device=like.device)
            return
        self.codes_pending = False
        if ID_DIGITS_KEY in state_dict:
            state_dict["code_indices"] = digits_to_ids(state_dict.pop(ID_DIGITS_KEY))
        elif "code_indices" in state_dict:  # saved before the digit format: exact only in float32 / float64
            ids = state_dict["code_indices"]
            if ids.is_floating_point() and self.cfg.d_sae - 1 > 2 / torch.finfo(ids.dtype).eps:
                raise ValueError(
                    f"This readout SAE was saved in an older format whose feature ids (up to {self.cfg.d_sae - 1}) "
                    f"{ids.dtype} cannot hold exactly: load it with dtype='float32', then .to(torch.{ids.dtype}) "
                    "(or save it again with this version to make low-precision loads safe)."
                )
            state_dict["code_indices"] = ids.round().long()

    # -------------------------------------------------------------------------------------------- stored codes
    def row_codes(self, tokens: Int[torch.Tensor, " n"] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored sparse codes (indices, values) of the given vocabulary rows (all rows by default)."""
        self.check_codes()
        if tokens is None:
            return self.code_indices, self.code_values
        tokens = self.check_tokens(tokens)
        return self.code_indices[tokens], self.code_values[tokens]

    def check_codes(self) -> None:
        """Raise while the codes of a dictionary loaded without them have not been recomputed."""
        if self.codes_pending:
            raise RuntimeError(
                "This readout SAE was loaded without its row codes (the shipped release recomputes them from the "
                "model): call tl_query_lens.readout.bind(model, sae) first, or any readout function with the model."
            )

    def check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, device=self.code_indices.device).long()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.d_vocab):
            raise IndexError(f"Token ids must be in 0..{self.cfg.d_vocab - 1} (this dictionary's vocabulary).")
        return tokens

    def reconstructed_rows(
        self, tokens: Int[torch.Tensor, " n"] | None = None, *, chunk: int = 4096
    ) -> Float[torch.Tensor, "n d_model"]:
        """ŵ_t = μ + Σ_i z_{t,i} d_i from the stored codes (densified in chunks of rows to bound memory)."""
        idx, val = self.row_codes(tokens)
        return (
            torch.cat([decode_sparse(i, v, self.W_dec) for i, v in zip(idx.split(chunk), val.split(chunk))])
            + self.b_dec
        )

    def _float64_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The cache holds ``rows`` itself, so ``is`` + version counters identify it (no reused data_ptr can alias).
        self.check_codes()
        versions = (rows._version, self.W_dec._version, self.b_dec._version, self.code_values._version)
        cached = self._residual_cache
        if cached is None or cached[0] is not rows or cached[1] != versions:
            with torch.no_grad():  # float64, so the identity holds to ~1e-12 whatever the score's size
                W_dec = self.W_dec.double()
                recon = torch.cat(
                    [
                        decode_sparse(i, v, W_dec)
                        for i, v in zip(self.code_indices.split(4096), self.code_values.split(4096))
                    ]
                )
                rows64 = rows.to(W_dec)
                cached = (rows, versions, rows64, rows64 - recon - self.b_dec.double())
            self._residual_cache = cached
        return cached[2], cached[3]

    @torch.no_grad()
    def store_codes(self, rows: Float[torch.Tensor, "d_vocab d_model"], *, batch_size: int = 4096) -> None:
        """(Re)compute μ-centred norms and the sparse codes of every row from the current encoder."""
        if rows.shape != (self.cfg.d_vocab, self.cfg.d_in):
            raise ValueError(f"Expected rows of shape {(self.cfg.d_vocab, self.cfg.d_in)}, got {tuple(rows.shape)}.")
        _, norms, x = normalise_rows(rows.to(self.W_enc), self.b_dec)
        self.row_norms.copy_(norms)
        for start in range(0, rows.shape[0], batch_size):
            pre = torch.relu(x[start : start + batch_size] @ self.W_enc + self.b_enc)
            idx, val = topk_relu_codes(pre, self.cfg.k)
            self.code_indices[start : start + batch_size] = idx
            self.code_values[start : start + batch_size] = val * norms[start : start + batch_size, None]
        self.codes_pending = False
        self._residual_cache = None

    # ------------------------------------------------------------------------------------------- construction
    @classmethod
    def fit(cls, model, tokens: torch.Tensor | None = None, **kwargs: Any) -> ReadoutSAE:
        """Fit a readout SAE to ``model``'s unembedding rows; see :func:`tl_query_lens.readout.fit.fit_readout`."""
        return _operation("fit")(model, tokens, **kwargs).sae

    def decompose(self, h, alpha, **kwargs):
        """Exact score decomposition; see :func:`tl_query_lens.readout.decompose.decompose`."""
        return _operation("decompose")(self, h, alpha, **kwargs)


# ``ReadoutSAE.fit`` / ``.decompose`` call functions of modules that import this one (fit.py builds ReadoutSAEs,
# decompose.py reads them). Those modules register the functions here when they are imported (the first name used
# from the readout package, or from tl_query_lens, imports both), so the dependency points one way: fit.py /
# decompose.py -> sae.py.
_OPERATIONS: dict[str, Callable[..., Any]] = {}


def register_operation(name: str, function: Callable[..., Any]) -> None:
    """Make ``function`` the implementation of the method ``ReadoutSAE.<name>``."""
    _OPERATIONS[name] = function


def _operation(name: str) -> Callable[..., Any]:
    if name not in _OPERATIONS:  # only when sae.py was imported alone, not through a name of its package
        raise RuntimeError(
            f"ReadoutSAE.{name} needs tl_query_lens.readout.{name}: import it (or `from tl_query_lens.readout import "
            "ReadoutSAE`, which does)."
        )
    return _OPERATIONS[name]


ID_DIGITS_KEY = "code_indices_base256"
CODE_KEYS = frozenset({"code_values", "code_indices", ID_DIGITS_KEY})  # left out of the shipped release


def ids_to_digits(ids: torch.Tensor, d_sae: int) -> torch.Tensor:
    """Integer ids [..] as little-endian base-256 digits [.., n] (uint8), n = digits needed for ``d_sae - 1``."""
    n_digits = max(1, (max(d_sae - 1, 1).bit_length() + 7) // 8)
    shifts = torch.arange(n_digits, device=ids.device) * 8
    return ((ids.long()[..., None] >> shifts) & 255).to(torch.uint8)


def digits_to_ids(digits: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`ids_to_digits`; accepts the digits in any dtype a loader cast them to (exact in all)."""
    shifts = torch.arange(digits.shape[-1], device=digits.device) * 8
    return (digits.round().long() << shifts).sum(-1)


def decode_sparse(indices: torch.Tensor, values: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """Σ_i z_i d_i for sparse codes (indices, values) [n, k]: scatter to dense [n, F], then one matmul."""
    dense = torch.zeros(indices.shape[0], W_dec.shape[0], dtype=W_dec.dtype, device=W_dec.device)
    return dense.scatter_(1, indices, values.to(W_dec.dtype)) @ W_dec


def unembedding_rows(model) -> Float[torch.Tensor, "d_vocab d_model"]:
    """The LM head's rows w_t (TL ``W_U`` is [d_model, d_vocab]; final-norm weights folded in by ``fold_ln``)."""
    return model.W_U.detach().T.float()


def check_compatible(sae: ReadoutSAE, model, *, atol: float = 1e-3) -> None:
    """Raise unless ``sae`` was fitted to ``model``'s unembedding (widths, vocabulary, and row norms a_t agree).

    The readout methods call it first, so it also names the fix when a caller passed the SAE where the model goes.
    """
    if isinstance(model, ReadoutSAE):
        raise InputTypeError(
            "The readout SAE was passed where the model goes: every readout function takes the model first, "
            "then the readout SAE, e.g. evaluate_readout(model, sae, states) or bind(model, sae)."
        )
    d_model, d_vocab = model.cfg.d_model, model.cfg.d_vocab
    if sae.cfg.d_in != d_model:
        raise ValueError(
            f"This readout SAE has d_in={sae.cfg.d_in} but the model has d_model={d_model}: it was "
            f"fitted to another model; fit one with ReadoutSAE.fit(model) or `tlql readout fit`."
        )
    if sae.cfg.d_vocab != d_vocab:
        raise ValueError(
            f"Vocabulary mismatch: the readout SAE has {sae.cfg.d_vocab} rows, the model's LM head "
            f"{d_vocab}; fit one for this model with ReadoutSAE.fit(model) or `tlql readout fit`."
        )
    rows = unembedding_rows(model).to(sae.b_dec)
    norms = (rows - sae.b_dec).norm(dim=-1)
    err = (norms - sae.row_norms).abs().max().item()
    if err > atol * max(1.0, sae.row_norms.abs().max().item()):
        raise ValueError(
            f"The model's LM-head rows differ from the ones this readout SAE was fitted to (max row-norm "
            f"difference {err:.3g}); load the same model (same fold_ln settings) or refit."
        )
    if sae.codes_pending:  # a shipped dictionary: its codes are the encoder's TopK codes of these rows
        sae.store_codes(rows.to(sae.W_enc))


if "readout" not in SAE_CLASS_REGISTRY:
    register_sae_class("readout", ReadoutSAE, ReadoutSAEConfig)
