"""Layer sweeps and the feature-shuffle ablation, sharing one clean pass (docs/design.md §7)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Int
from sae_lens import SAE
from transformer_lens import HookedTransformer

from tl_query_lens.certify.certify import Certificate, certify_many
from tl_query_lens.certify.config import CertifyConfig
from tl_query_lens.certify.losses import PassTimes, Splice
from tl_query_lens.certify.plots import bound_vs_n_figure, gap_distribution_figure
from tl_query_lens.config import resolve_config
from tl_query_lens.errors import UnknownNameError
from tl_query_lens.paths import result_name
from tl_query_lens.presentation import Table, numeric_fields
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)


def shuffle_permutation(d_sae: int, seed: int) -> Int[torch.Tensor, " d_sae"]:
    """One global seeded bijection π of feature ids (the proxy decodes code π(i) with value i)."""
    return torch.randperm(d_sae, generator=torch.Generator().manual_seed(seed))


@dataclass
class LayerSweep(SavableResult):
    """Certificates per layer, and per layer for the shuffled proxy when the ablation was asked for.

    Attributes:
        certificates: label (a layer, or any name) → certificate of the real proxy.
        shuffled: label → certificate of the feature-shuffled proxy (empty without the ablation).
        seed: the shuffle seed.
        times: seconds spent in each part of the shared pass.
    """

    certificates: dict[int | str, Certificate]
    shuffled: dict[int | str, Certificate] = field(default_factory=dict)
    seed: int | None = None
    times: PassTimes = field(default_factory=PassTimes)

    COLUMN_TYPES: ClassVar[dict[str, type]] = {
        "label": str,
        "hook": str,
        "proxy": str,
        "N": int,
        "P": int,
        "m": int,
        "R_hat": float,
        "eps_hat": float,
        "eta_hat": float,
        "bound": float,
        "bound_occam": float,
        "baseline_bits": float,
        "nontrivial": bool,
        "N_star": float,
        "N_star_observed": bool,
        "kl_bits": float,
        "top1_agreement": float,
        "mean_gap_bits": float,
    }
    COLUMNS = tuple(COLUMN_TYPES)

    def rows(self) -> list[list]:
        """One row per (layer, real|shuffled) proxy, columns :attr:`COLUMNS`."""
        rows = []
        for kind, certs in (("real", self.certificates), ("shuffled", self.shuffled)):
            for label, c in certs.items():
                rows.append(
                    [
                        label,
                        c.config.get("write_hook", ""),
                        kind,
                        c.N,
                        c.P,
                        c.m,
                        c.R_hat,
                        c.eps_hat,
                        c.eta_hat,
                        c.bound,
                        c.bound_occam,
                        c.baseline_bits,
                        c.nontrivial,
                        c.N_star,
                        c.N_star_observed,
                        c.kl_bits,
                        c.top1_agreement,
                        c.gap.double().mean().item(),
                    ]
                )
        return rows

    def _subfolder(self, name: str, key=None) -> str:
        """One folder per certificate: ``layer{L}`` / ``{label}``, and ``…_shuffled`` for the shuffled proxies."""
        if key is None:
            return name
        folder = f"layer{key}" if isinstance(key, int) else result_name(key)  # one folder per label
        return f"{folder}_shuffled" if name == "shuffled" else folder

    title: ClassVar[str] = "Certificates per layer"

    def scalars(self) -> dict[str, float]:
        """``{label}/bound``, ``/bound_occam``, ``/N_star`` per proxy (``shuffled/{label}/…`` too), and the pass times."""
        out: dict[str, float] = {}
        for prefix, certs in (("", self.certificates), ("shuffled/", self.shuffled)):
            for label, c in certs.items():
                out.update(numeric_fields(c, ("bound", "bound_occam", "N_star"), prefix=f"{prefix}{label}/"))
        times = {"clean_s": self.times.clean, "proxy_s": self.times.proxy, "restricted_s": self.times.restricted}
        return out | {f"times/{k}": float(v) for k, v in (times | {"pool_s": self.times.pool}).items()}

    def tables(self) -> dict[str, Table]:
        """``certificates``: one row per (label, real|shuffled) proxy."""
        return {"certificates": Table.build(self.COLUMN_TYPES, ([str(r[0]), *r[1:]] for r in self.rows()))}

    def figures(self) -> dict[str, Any]:
        """Bound and Occam bound vs N per label; with the ablation, the gap distributions and the shuffled bounds."""
        real = {str(k): c for k, c in self.certificates.items()}
        figures = {
            "bound_vs_N": bound_vs_n_figure(real),
            "bound_occam_vs_N": bound_vs_n_figure(real, occam=True, title="Occam bound vs N"),
        }
        if self.shuffled:
            shuffled = {str(k): c for k, c in self.shuffled.items()}
            figures["gap_real_vs_shuffled"] = gap_distribution_figure(real, shuffled)
            figures["bound_vs_N_shuffled"] = bound_vs_n_figure(shuffled, title="Shuffled proxies: bound vs N")
        return figures


def certify_layers(
    model: HookedTransformer,
    saes_by_layer: dict[int | str, SAE],
    calibration_tokens: Int[torch.Tensor, "batch pos"],
    evaluation_tokens: Int[torch.Tensor, "batch pos"],
    *,
    shuffle: bool | Collection[int | str] = False,
    seed: int = 0,
    cfg: CertifyConfig | None = None,
    **overrides: Any,
) -> LayerSweep:
    """Certify one dictionary per layer; all proxies (and shuffled twins) share one clean evaluation pass.

    Args:
        saes_by_layer: label → dictionary; labels are usually layers (the dictionary's own hooks decide where it
            splices; the key only labels the row).
        shuffle: also certify each proxy (True) or the proxies with these labels under one seeded permutation of
            feature ids (:func:`shuffle_ablation`).
        seed: the permutation seed.
        cfg / overrides: the :class:`~tl_query_lens.certify.config.CertifyConfig` of every certificate, as in
            :func:`~tl_query_lens.certify.certify.certify`. With ``pool_sizes``, ``certificates`` also holds
            ``"<label> n_cal=<n>"``: the proxy with the pool of the first n calibration windows (same passes).
    """
    cfg = resolve_config(CertifyConfig, cfg, overrides)
    splices: dict[Hashable, Splice] = {
        (label, False): Splice(sae, rule=cfg.rule, k=cfg.k) for label, sae in saes_by_layer.items()
    }
    if shuffle is not False:
        unknown = set() if shuffle is True else set(shuffle) - set(saes_by_layer)
        if unknown:
            raise UnknownNameError(
                f"shuffle names labels {sorted(map(str, unknown))} that are not among the proxies "
                f"{sorted(map(str, saes_by_layer))} (CLI: --shuffle 'ffkv L24,sae L24 <folder>')."
            )
        for label, sae in saes_by_layer.items():
            if shuffle is not True and label not in shuffle:
                continue
            perm = shuffle_permutation(splices[(label, False)].d_sae, seed)
            splices[(label, True)] = Splice(sae, rule=cfg.rule, k=cfg.k, permutation=perm)
    times = PassTimes()
    certs = certify_many(model, splices, calibration_tokens, evaluation_tokens, cfg, times=times)
    curve: dict[int | str, Certificate] = {  # the pool-size curve (cfg.pool_sizes): label "<label> n_cal=<n>"
        f"{label} n_cal={n}": certs[((label, False), n)] for label in saes_by_layer for n in cfg.pool_sizes
    }
    return LayerSweep(
        certificates={label: certs[(label, False)] for label in saes_by_layer} | curve,
        shuffled={label: certs[(label, True)] for label in saes_by_layer if (label, True) in certs},
        seed=seed if shuffle is not False else None,
        times=times,
    )


@dataclass
class ShuffleAblation(SavableResult):
    """Real vs feature-shuffled proxy of one dictionary.

    Attributes:
        real / shuffled: the two certificates (same P: π is a bijection).
        seed: the permutation seed.
        mean_gap_shift_bits: mean(ℓ(S_π∘M) − ℓ(M)) − mean(ℓ(S∘M) − ℓ(M)).
    """

    real: Certificate
    shuffled: Certificate
    seed: int

    @property
    def mean_gap_shift_bits(self) -> float:
        return (self.shuffled.gap.double().mean() - self.real.gap.double().mean()).item()

    title: ClassVar[str] = "Feature-shuffle ablation"

    def scalars(self) -> dict[str, float]:
        """The mean gap shift, and each certificate's scalars under ``real/`` and ``shuffled/``."""
        out = {"mean_gap_shift_bits": self.mean_gap_shift_bits}
        for name, cert in (("real", self.real), ("shuffled", self.shuffled)):
            out.update({f"{name}/{k}": v for k, v in cert.scalars().items()})
        return out

    def tables(self) -> dict[str, Table]:
        """``certificates``: the real and the shuffled proxy, the columns of :class:`LayerSweep`."""
        sweep = LayerSweep({"proxy": self.real}, {"proxy": self.shuffled}, seed=self.seed)
        return sweep.tables()

    def figures(self) -> dict[str, Any]:
        """``gap_real_vs_shuffled``: the per-sequence gap distributions."""
        return {"gap_real_vs_shuffled": gap_distribution_figure({"proxy": self.real}, {"proxy": self.shuffled})}


def shuffle_ablation(
    model: HookedTransformer,
    sae: SAE,
    calibration_tokens: Int[torch.Tensor, "batch pos"],
    evaluation_tokens: Int[torch.Tensor, "batch pos"],
    *,
    seed: int = 0,
    cfg: CertifyConfig | None = None,
    **overrides: Any,
) -> ShuffleAblation:
    """Certify ``sae`` and its feature-shuffled twin: one global seeded bijection π of feature ids applied to the
    codes (the proxy decodes code π(i) with value i; code values and decoder rows kept, so P and the per-token
    sparsity are kept). ``cfg`` / ``overrides`` as in :func:`~tl_query_lens.certify.certify.certify`."""
    sweep = certify_layers(
        model, {0: sae}, calibration_tokens, evaluation_tokens, shuffle=True, seed=seed, cfg=cfg, **overrides
    )
    return ShuffleAblation(real=sweep.certificates[0], shuffled=sweep.shuffled[0], seed=seed)
