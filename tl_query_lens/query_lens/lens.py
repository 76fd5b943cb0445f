"""QueryLens: key and value signatures of every feature of a dictionary by matmuls over corpus operators (docs/design.md §5).

Add to a TransformerLens script::

    lens = QueryLens(model, tokens)
    sig = lens.value_signatures(sae, k=25)          # or lens.key_signatures(sae)
    print(sig.top_strings[0])

Formulas (docs/design.md §5, arXiv 2606.07617 §3):

* LL_VALUE ``W_U·LN_f(v)``; LL_KEY ``E·k`` (raw).
* QL_VALUE full ``s = W_U·LN_f(M_l v) + b_U``, ``M_l`` the value operator of the dictionary's value hook.
* QL_VALUE first-order ``s = W_U·LN_f(v + Σ_m J̄_m v)`` over the modules m downstream of the value hook (for
  ``blocks.l.hook_resid_post``: attention and MLP of every block k > l; ``hook_resid_mid``: MLP of l, then k > l;
  ``hook_resid_pre``: attention and MLP of l, then k > l).
* QL_KEY ``ḡ = N_lᵀ k``, ``s_t = ⟨ḡ, (e_t − c)/‖e_t − c‖⟩``, c the mean embedding of the valid corpus tokens.
* Post-norm FF-KV (Gemma-2 ``ln2_post``): ``v`` is no fixed direction, so the tangent ``t_i`` of the feature's
  activation at ``blocks.l.mlp.hook_post`` is pushed instead — full ``M_src t_i``; first-order ``u + Σ_m J̄_m u`` with
  the direct term ``u = D t_i``, ``D`` the corpus-mean Jacobian of ``hook_mlp_out`` w.r.t. ``hook_post``; LL_VALUE
  ``W_U·LN_f(v ⊙ w_post)`` (docs/query_lens.md, "Post-norm blocks").

``LN_f`` is ``model.ln_final`` applied to the direction itself (not linearised): v/rms(v) (times w, with eps) for RMS,
centre-and-scale (times w, plus b) for LayerNorm.

Per-module shares (first-order only): with ``u = v + Σ_m c_m``, ``c_m = J̄_m v``, LN_f(u) = w ⊙ P(u)/σ(u) + b (P centres
for LayerNorm, identity for RMS; σ(u) its scale), so the logit vector splits exactly into
``W_U b + Σ_terms W_U (w ⊙ P(c)/σ(u))`` over the terms direct (``c = v``) and each module. A term's share is its summed
contribution over the feature's top-k tokens divided by the summed feature-dependent score (all terms) over the same
tokens; shares sum to 1 and may be negative (a module that works against the signature).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens.components import LayerNorm, LayerNormPre

from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import corpus_fingerprint
from tl_query_lens.dictionaries.key_value import KeyValueView, as_key_value
from tl_query_lens.hooks import downstream_modules, hook_layer
from tl_query_lens.operators import OperatorSet, key_operators, module_operators, value_operators
from tl_query_lens.operators.engine import basis_fingerprint, check_tokens, check_value_source
from tl_query_lens.operators.store import OPERATOR_HINT, check_operator
from tl_query_lens.query_lens.config import BASES, SIGNATURE_METHODS, Basis, QueryLensConfig
from tl_query_lens.query_lens.result import Signatures, centred_embeddings, readout_scores
from tl_query_lens.tensor_checks import check_outputs

logger = logging.getLogger(__name__)

ValueMethod = Literal["full", "first_order", "logit_lens"]
KeyMethod = Literal["full", "logit_lens"]


class QueryLens:
    """Key and value signatures for any dictionary ``as_key_value`` accepts, on a fixed corpus.

    Operators are computed lazily by the engine (one sweep per request, all missing hooks at once; call
    :meth:`precompute` to batch many layers into one sweep) and kept in memory (and in ``cache_dir`` if given).

    Args:
        model: the clean TransformerLens model (no SAEs spliced in).
        tokens: ``[batch, pos]`` corpus the operators are averaged over.
        cfg / overrides: a :class:`QueryLensConfig`; keyword overrides replace single fields, those of its
            ``engine`` included (``QueryLens(model, tokens, skip_positions=1, progress=False)``,
            ``sweep_dtype=torch.bfloat16``: operator sweeps on a bf16 copy of the model, fp32 accumulation; with
            ``sweep_autocast=True`` under bf16 autocast on the model itself).
    """

    def __init__(
        self,
        model: HookedTransformer,
        tokens: Int[torch.Tensor, "batch pos"],
        cfg: QueryLensConfig | None = None,
        **overrides: Any,
    ) -> None:
        cfg = resolve_config(QueryLensConfig, cfg, overrides)
        self.cfg = cfg
        self.basis = cfg.basis
        self.model = model
        self.tokens = check_tokens(model, tokens, cfg.engine.skip_positions)
        self.skip_positions = cfg.engine.skip_positions
        self.feature_chunk = cfg.feature_chunk
        self.engine = cfg.engine
        self._pushed: dict[tuple[str, Any, str], torch.Tensor] = {}  # (kind, hook, basis fingerprint) → products
        self._value: dict[str | tuple[str, str], torch.Tensor] = {}  # hook, or (source, destination)
        self._key: dict[str, torch.Tensor] = {}
        self._module: dict[str, torch.Tensor] = {}
        self.fingerprint = corpus_fingerprint(self.tokens)
        self.n_tokens = int(self.tokens[:, self.skip_positions :].numel())

    # ----- operators ----------------------------------------------------------------------------------------------
    def precompute(
        self,
        dictionaries: Sequence[Any] = (),
        *,
        value_methods: Collection[str] = ("full",),
        key_methods: Collection[str] = ("full",),
        value_hooks: Sequence[str] = (),
        key_hooks: Sequence[str] = (),
        module_layers: Sequence[int] = (),
    ) -> None:
        """Compute every missing operator the given dictionaries (and/or hooks) need, one engine sweep per kind.

        Args:
            dictionaries: anything :func:`~tl_query_lens.as_key_value` accepts; their hooks decide the operators.
            value_methods / key_methods: the signature methods that will be asked for (``"logit_lens"`` needs no
                operator, ``"full"`` the value / key operator, ``"first_order"`` the downstream module operators).
            value_hooks / key_hooks / module_layers: operators by hook name / block, for dictionaries-free use.

        A method a dictionary does not allow (a value operator or module shares from ``ln_final.hook_normalized``,
        where a readout SAE reads) is passed over here; asking for its signatures raises with the reason.
        """
        value_hooks, key_hooks, module_layers = list(value_hooks), list(key_hooks), list(module_layers)
        direct: dict[str, str] = {}  # post-norm sources → their write hook (the first-order direct term)
        for dictionary in dictionaries:
            view = as_key_value(dictionary, self.model)
            source = view.value_source or view.value_hook
            if "full" in value_methods and _allowed(check_value_source, source):
                value_hooks.append(source)
            n_layers = self.model.cfg.n_layers
            if "first_order" in value_methods and _allowed(downstream_modules, view.value_hook, n_layers):
                module_layers += [hook_layer(n) for n in downstream_modules(view.value_hook, n_layers)]  # type: ignore[misc]
                if view.value_source is not None:
                    direct[view.value_source] = view.write_hook
            if "full" in key_methods:
                key_hooks.append(view.read_hook)
        missing = [h for h in dict.fromkeys(value_hooks) if h not in self._value]
        if missing:
            self._store(self._value, value_operators(self.model, self.tokens, missing, engine=self.engine))
        for source, to in direct.items():
            self.value_operator(source, to=to)
        missing = [h for h in dict.fromkeys(key_hooks) if h not in self._key]
        if missing:
            self._store(self._key, key_operators(self.model, self.tokens, missing, engine=self.engine))
        layers = sorted({int(k) for k in module_layers if f"blocks.{int(k)}.attn" not in self._module})
        if layers:
            self._store(self._module, module_operators(self.model, self.tokens, layers, engine=self.engine))

    @staticmethod
    def _store(target: dict[Any, torch.Tensor], operators: OperatorSet) -> None:
        for name in operators:
            target[name] = operators[name]  # the mean; raises on NaN/inf

    def value_operator(self, hook: str, *, to: str | None = None) -> Float[torch.Tensor, "d_model d_src"]:
        """The value operator from ``hook`` into the final residual, or into the hook ``to`` (e.g. the write hook of
        a post-norm FF-KV, for its first-order direct term); stored under ``(hook, to)``."""
        if to is None:
            self.precompute(value_hooks=[hook])
            return self._value[hook]
        key = (hook, to)
        if key not in self._value:
            self._value[key] = value_operators(self.model, self.tokens, [hook], destination=to, engine=self.engine)[
                hook
            ]
        return self._value[key]

    def key_operator(self, hook: str) -> Float[torch.Tensor, "d_in d_model"]:
        self.precompute(key_hooks=[hook])
        return self._key[hook]

    def module_operator(self, name: str) -> Float[torch.Tensor, "d_model d_model"]:
        layer = hook_layer(name)
        if layer is None or name.rsplit(".", 1)[-1] not in ("attn", "mlp"):
            raise KeyError(f"Module operators are named blocks.k.attn / blocks.k.mlp, not {name!r}.")
        self.precompute(module_layers=[layer])
        return self._module[name]

    @torch.no_grad()
    def corpus_center(self) -> Float[torch.Tensor, " d_model"]:
        """Mean token embedding c over the valid corpus tokens (QL_KEY)."""
        W_E = self.model.W_E
        return W_E[self.tokens[:, self.skip_positions :].reshape(-1).to(W_E.device)].float().mean(0)

    # ----- signatures ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def value_directions(
        self,
        dictionary: Any,
        features: int | Sequence[int] | torch.Tensor | None = None,
        *,
        method: ValueMethod = "full",
        basis: Basis | None = None,
    ) -> Float[torch.Tensor, "n d_model"]:
        """Each feature's residual direction before LN_f — ``M_l v`` (full), ``v + Σ_m J̄_m v`` (first_order) or ``v``
        (logit_lens) — fp32, on the model's device. Post-norm FF-KV (Gemma-2): the activation tangent pushed from
        ``mlp.hook_post`` instead of ``v`` (see :meth:`_source_terms`)."""
        view, ids = self._view(dictionary, features, 1)
        return self._value_terms(view, ids, method, basis)[0]

    @torch.no_grad()
    def key_gradients(
        self, dictionary: Any, features: int | Sequence[int] | torch.Tensor | None = None, *, basis: Basis | None = None
    ) -> Float[torch.Tensor, "n d_model"]:
        """``ḡ = N_lᵀ k`` of each feature (QL_KEY before the embedding readout), fp32, on the model's device."""
        view, ids = self._view(dictionary, features, 1)
        keys = view.keys[ids].to(self.model.cfg.device, torch.float32)
        # The full key operator costs d_model tangents (from hook_embed), the feature basis one cotangent per key.
        if self._feature_basis(len(ids), self.model.cfg.d_model, view.read_hook in self._key, basis):
            gradients = self._push("key", view.read_hook, keys)  # K N: the keys pulled back directly
        else:
            gradients = keys @ self.key_operator(view.read_hook)  # one row per feature
        check_operator(gradients, "key gradients")
        return gradients

    @torch.no_grad()
    def value_signatures(
        self,
        dictionary: Any,
        features: int | Sequence[int] | torch.Tensor | None = None,
        *,
        k: int = 25,
        method: ValueMethod = "full",
        basis: Basis | None = None,
    ) -> Signatures:
        """What each feature promotes: top/bottom-k tokens of its value signature (docs/design.md §5)."""
        view, ids = self._view(dictionary, features, k)
        raw, terms, names = self._value_terms(view, ids, method, basis)
        directions = self._final_norm(raw)
        check_operator(directions, "value directions")
        result = self._rank(
            directions,
            ids,
            view,
            side="value",
            method=method,
            k=k,
            readout="unembed",
            add_bias=method == "full",
            center=None,
        )
        if terms is not None:
            result.module_names = names
            result.module_contributions = self._contributions(raw, terms, result.top_ids).cpu()
            result.module_shares = result.module_contributions / result.module_contributions.sum(1, keepdim=True)
        return check_outputs(result, "value_signatures", hint=OPERATOR_HINT)

    @torch.no_grad()
    def key_signatures(
        self,
        dictionary: Any,
        features: int | Sequence[int] | torch.Tensor | None = None,
        *,
        k: int = 25,
        method: KeyMethod = "full",
        basis: Basis | None = None,
    ) -> Signatures:
        """What activates each feature: top/bottom-k tokens of its key signature (docs/design.md §5)."""
        view, ids = self._view(dictionary, features, k)
        if method == "logit_lens":
            keys = view.keys[ids].to(self.model.cfg.device, torch.float32)
            if view.d_in != self.model.cfg.d_model:
                raise ValueError(
                    f"LL_KEY (E·k) needs keys in the residual basis (d_model={self.model.cfg.d_model}); "
                    f"{view.read_hook} has width {view.d_in}. Use method='full'."
                )
            return check_outputs(
                self._rank(
                    keys, ids, view, side="key", method=method, k=k, readout="embed", add_bias=False, center=None
                ),
                "key_signatures",
                hint=OPERATOR_HINT,
            )
        if method != "full":
            raise ValueError(f"method must be 'full' or 'logit_lens', not {method!r}.")
        gradients = self.key_gradients(view, ids, basis=basis)  # ḡ = N_lᵀ k, one row per feature
        return check_outputs(
            self._rank(
                gradients,
                ids,
                view,
                side="key",
                method=method,
                k=k,
                readout="embed_centred",
                add_bias=False,
                center=self.corpus_center(),
            ),
            "key_signatures",
            hint=OPERATOR_HINT,
        )

    def signature_set(
        self,
        dictionary: Any,
        features: int | Sequence[int] | torch.Tensor | None = None,
        *,
        k: int = 25,
        methods: Sequence[str] = tuple(SIGNATURE_METHODS),
    ) -> dict[str, Signatures]:
        """Signatures of the same features by several methods, named as in the paper's Table 1 (``LL_KEY``,
        ``LL_VALUE``, ``QL_KEY``, ``QL_VALUE``, ``QL_VALUE_1st``; see :data:`SIGNATURE_METHODS`)."""
        unknown = [m for m in methods if m not in SIGNATURE_METHODS]
        if unknown:
            raise ValueError(f"Unknown signature methods {unknown}; choose from {list(SIGNATURE_METHODS)}.")
        out = {}
        for name in methods:
            side, method = SIGNATURE_METHODS[name]
            signatures = self.value_signatures if side == "value" else self.key_signatures
            out[name] = signatures(dictionary, features, k=k, method=method)  # type: ignore[arg-type]
        return out

    # ----- internals ----------------------------------------------------------------------------------------------
    def _view(self, dictionary: Any, features, k: int) -> tuple[KeyValueView, torch.Tensor]:
        view = as_key_value(dictionary, self.model)
        ids = view.feature_ids(features)
        if not 1 <= k <= self.model.cfg.d_vocab:
            raise ValueError(f"k must be in 1..d_vocab={self.model.cfg.d_vocab}, got {k}.")
        return view, ids

    def _feature_basis(self, n: int, d: int, held: bool, basis: Basis | None) -> bool:
        """Whether a request of n features uses the feature basis (see the class docstring)."""
        choice = self.basis if basis is None else basis
        if choice not in BASES:
            raise ValueError(f"basis must be one of {BASES}, not {choice!r}.")
        if choice != "auto":
            return choice == "features"
        return not held and n < d  # cost ∝ basis size × the same chain of blocks

    def _push(self, kind: str, hook: str | tuple[str, str], directions: torch.Tensor) -> torch.Tensor:
        """Engine products on the feature basis ``directions`` (cached per feature set): ``[n, d]`` rows ``M v_i``
        (value; ``hook`` may be ``(src, dst)`` for the operator into ``dst``), ``N_dstᵀ k_i`` (key); for
        ``kind="module"`` ``hook`` is a comma-joined list of layers and the result is stored per module under
        ``blocks.k.attn`` / ``blocks.k.mlp``."""
        key = (kind, hook, basis_fingerprint(directions))
        if key not in self._pushed:
            if kind == "value":
                source, to = (hook, None) if isinstance(hook, str) else hook  # (src, dst): into dst
                ops = value_operators(
                    self.model, self.tokens, [source], basis=directions, destination=to, engine=self.engine
                )
                self._pushed[key] = ops[source].T
            elif kind == "key":
                assert isinstance(hook, str)
                self._pushed[key] = key_operators(
                    self.model, self.tokens, [hook], basis=directions, engine=self.engine
                )[hook]
            else:
                assert isinstance(hook, str)
                layers = [int(k) for k in hook.split(",")]
                ops = module_operators(self.model, self.tokens, layers, basis=directions, engine=self.engine)
                for name in ops:
                    self._pushed[("module", name, key[2])] = ops[name].T
                self._pushed[key] = directions
        return self._pushed[key]

    def _value_terms(
        self, view: KeyValueView, ids: torch.Tensor, method: str, basis: Basis | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[str] | None]:
        """``(raw direction, first-order terms or None, their names or None)``, fp32 on the model's device.

        A dictionary whose values pass through a per-token norm (``view.value_source``: post-norm FF-KV, hook_z SAEs of
        post-norm blocks) is pushed from its source hook instead: see :meth:`_source_terms`.
        """
        if not view.fixed_values and view.value_source is None:
            raise ValueError(
                f"The values of this dictionary pass through a per-token norm before {view.write_hook}, and its view "
                "names no hook before that norm (KeyValueView.value_source), so they have no fixed residual direction "
                "for value signatures; key signatures work. Set value_source, source_rows and post_norm_weight (for "
                "LL_VALUE) on the view, or use an SAE on hook_attn_out / hook_mlp_out."
            )
        if method not in ("full", "first_order", "logit_lens"):
            raise ValueError(f"method must be 'full', 'first_order' or 'logit_lens', not {method!r}.")
        device = self.model.cfg.device
        if method == "logit_lens":
            return view.static_values(ids).to(device), None, None
        if view.value_source is not None:
            return self._source_terms(view, ids, method, basis)
        values = view.values[ids].to(device, torch.float32)
        hook = view.value_hook
        if method == "full":
            return self._pushed_to(hook, values, basis), None, None  # M_l v
        return self._first_order(hook, values, basis)

    def _source_terms(
        self, view: KeyValueView, ids: torch.Tensor, method: str, basis: Basis | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[str] | None]:
        """Value terms of features whose write passes through a per-token norm (post-norm blocks), corpus-mean.

        The tangent ``t_i`` of feature i's activation at ``view.value_source`` (``blocks.l.mlp.hook_post`` for FF-KV,
        ``blocks.l.attn.hook_z`` for a hook_z SAE) flows through ``W_out`` / ``W_O``, the norm (``ln2_post`` /
        ``ln1_post``) and everything downstream, every piece linearised at each clean corpus token. full: ``M_src t_i``
        (the value operator of the source hook). first_order: the direct term ``u_i = D t_i`` with ``D`` the
        corpus-mean Jacobian of the write hook (``hook_mlp_out`` / ``hook_attn_out``) w.r.t. the source,
        i.e. the norm linearised per token and averaged, then ``u_i + Σ_m J̄_m u_i`` over the modules downstream of
        the value hook, exactly as for a fixed value ``v = u_i``.
        """
        tangents = view.source_tangents(ids).to(self.model.cfg.device)
        assert view.value_source is not None  # called for post-norm views only
        if method == "full":
            return self._pushed_to(view.value_source, tangents, basis, d=self.model.cfg.d_model), None, None
        direct = self._pushed_to(view.value_source, tangents, basis, d=self.model.cfg.d_model, to=view.write_hook)
        return self._first_order(view.value_hook, direct, basis)

    def _pushed_to(
        self, hook: str, vectors: torch.Tensor, basis: Basis | None, *, d: int | None = None, to: str | None = None
    ) -> Float[torch.Tensor, "n d_model"]:
        """Rows ``O v_i``: the value operator from ``hook`` (into ``to``; None = the final residual) applied to
        ``vectors``, by the full operator or the feature basis (``d``: the identity basis' cost, default the width)."""
        d = vectors.shape[1] if d is None else d
        key = hook if to is None else (hook, to)
        if self._feature_basis(len(vectors), d, key in self._value, basis):
            return self._push("value", key, vectors)  # pushed directly
        return vectors @ self.value_operator(hook, to=to).T

    def _first_order(
        self, hook: str, values: torch.Tensor, basis: Basis | None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[str]]:
        """``v + Σ_m J̄_m v`` over the modules downstream of the residual hook ``hook``, with its terms."""
        names = downstream_modules(hook, self.model.cfg.n_layers)
        layers = sorted({hook_layer(n) for n in names})  # type: ignore[type-var]
        if names and self._feature_basis(len(values), values.shape[1], all(n in self._module for n in names), basis):
            fingerprint = basis_fingerprint(values)
            self._push("module", ",".join(map(str, layers)), values)
            terms = [values] + [self._pushed[("module", n, fingerprint)] for n in names]
        else:
            self.precompute(module_layers=layers)  # type: ignore[arg-type]
            terms = [values] + [values @ self._module[n].T for n in names]  # v, J̄_m v
        return torch.stack(terms).sum(0), terms, ["direct", *names]

    def _final_norm(self, raw: Float[torch.Tensor, "n d_model"]) -> Float[torch.Tensor, "n d_model"]:
        """LN_f applied to each direction itself (the module, eps and weights included; not linearised)."""
        return self.model.ln_final(raw.to(self.model.cfg.dtype)[None])[0].float()

    @staticmethod
    def _signature_hook(view: KeyValueView, side: str, method: str) -> str:
        """Where the scored directions start: the read hook (keys), the value hook, or — for post-norm blocks'
        corpus methods — the source hook the activation tangent is pushed from."""
        if side != "value":
            return view.read_hook
        return view.value_source if view.value_source and method != "logit_lens" else view.value_hook

    def _norm_parts(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """``(1/σ(u) [n,1], w [d], centre?)`` with LN_f(u) = w ⊙ P(u)/σ(u) + b."""
        norm: Any = self.model.ln_final
        centre = isinstance(norm, (LayerNorm, LayerNormPre))
        centred = raw - raw.mean(-1, keepdim=True) if centre else raw
        inv_scale = (centred.pow(2).mean(-1, keepdim=True) + norm.eps).rsqrt()
        weight = getattr(norm, "w", None)
        weight = torch.ones(raw.shape[-1], device=raw.device) if weight is None else weight.detach().float()
        return inv_scale, weight, centre

    def _contributions(
        self, raw: torch.Tensor, terms: list[torch.Tensor], top_ids: torch.Tensor
    ) -> Float[torch.Tensor, "n n_terms"]:
        """Each term's logit contribution ``W_U[:, t]·(w ⊙ P(c)/σ(u))`` summed over the feature's top-k tokens."""
        inv_scale, weight, centre = self._norm_parts(raw)
        W_U = self.model.W_U.float()
        top_ids = top_ids.to(W_U.device)
        contributions = []
        for term in terms:
            term = term - term.mean(-1, keepdim=True) if centre else term
            linear = term * inv_scale * weight  # w ⊙ P(c)/σ(u)
            picked = [
                torch.einsum(
                    "nd,dnk->n", linear[s : s + self.feature_chunk], W_U[:, top_ids[s : s + self.feature_chunk]]
                )  # Σ over top-k of W_U[:, t]·linear
                for s in range(0, len(top_ids), self.feature_chunk)
            ]
            contributions.append(torch.cat(picked))
        return torch.stack(contributions, dim=1)

    def _rank(
        self,
        directions: torch.Tensor,
        ids: torch.Tensor,
        view: KeyValueView,
        *,
        side: str,
        method: str,
        k: int,
        readout: str,
        add_bias: bool,
        center: torch.Tensor | None,
    ) -> Signatures:
        """Top/bottom-k of every direction's vocabulary scores, chunked over features (never F × V at once)."""
        model = self.model
        basis = None
        if readout == "embed_centred":
            basis = centred_embeddings(model, center)  # type: ignore[arg-type]  # reuse across chunks
        tops, top_scores, bottoms, bottom_scores = [], [], [], []
        starts = range(0, len(ids), self.feature_chunk)
        for start in tqdm(starts, desc=f"{side} signatures", disable=len(starts) < 4 or not self.engine.progress):
            chunk = directions[start : start + self.feature_chunk]
            if basis is not None:
                scores = chunk.to(basis) @ basis.T
            else:
                scores = readout_scores(model, chunk, readout, add_bias, center)
            high = scores.topk(k, dim=-1)
            low = scores.topk(k, dim=-1, largest=False)
            tops.append(high.indices)
            top_scores.append(high.values.float())
            bottoms.append(low.indices)
            bottom_scores.append(low.values.float())
        top_ids, bottom_ids = torch.cat(tops).cpu(), torch.cat(bottoms).cpu()
        result = Signatures(
            side=side,
            method=method,
            hook=self._signature_hook(view, side, method),
            feature_ids=ids.clone(),
            top_ids=top_ids,
            top_scores=torch.cat(top_scores).cpu(),
            bottom_ids=bottom_ids,
            bottom_scores=torch.cat(bottom_scores).cpu(),
            directions=directions.float().cpu(),
            readout=readout,
            add_bias=add_bias,
            center=None if center is None else center.float().cpu(),
            top_strings=self._strings(top_ids),
            bottom_strings=self._strings(bottom_ids),
            model_name=str(model.cfg.model_name),
            corpus_fingerprint=self.fingerprint,
            n_tokens=self.n_tokens,
            skip_positions=self.skip_positions,
        )
        return result.attach(model)

    def _strings(self, ids: torch.Tensor) -> list[list[str]] | None:
        tokenizer = getattr(self.model, "tokenizer", None)
        if tokenizer is None:
            return None
        flat = tokenizer.batch_decode([[i] for i in ids.reshape(-1).tolist()])
        width = ids.shape[1]
        return [flat[r * width : (r + 1) * width] for r in range(ids.shape[0])]


def _allowed(check, *args) -> bool:
    """Whether ``check(*args)`` passes (it raises ValueError for a hook the method does not allow)."""
    try:
        check(*args)
    except ValueError:
        return False
    return True
