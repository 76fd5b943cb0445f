"""The measurements behind docs/reproduction.md and docs/ffkv_comparison.md, each at two sizes.

An experiment has the shape of every command (:mod:`tl_query_lens.command`): a config
(:mod:`tl_query_lens.reproduce.experiment_config`: its defaults the size the docs document, its ``quick()`` the
reduced size of ``tlql reproduce --quick``) and ``run(model, cfg)``, one call of the library's own API on the shipped
dictionaries that returns a result object. The rows of :mod:`tl_query_lens.reproduce.rows` read their figure from that
object's presentation interface (``scalars()`` / ``tables()``), never from a column list of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sae_lens import SAE

from tl_query_lens.certify.config import ProtocolCertifyConfig
from tl_query_lens.certify.protocol import ProtocolCertification, certify_protocol, forward_batches
from tl_query_lens.corpus import load_corpus
from tl_query_lens.dictionaries.compare import DictionaryComparison, compare_dictionaries
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.query_lens.config import NEUTRAL_PROMPTS, Table1Config
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.table1 import evaluate_table1
from tl_query_lens.ranges import parse_layers
from tl_query_lens.readout import collect_states
from tl_query_lens.readout.config import PaperReadoutConfig
from tl_query_lens.readout.protocols.paper import PaperReadoutDiagnostics, readout_diagnostics_paper
from tl_query_lens.reproduce.experiment_config import (
    CertifyBroadConfig,
    CertifyBroadFFKVConfig,
    CertifyDepthConfig,
    CertifyFFKVConfig,
    FFKVComparisonConfig,
    ReadoutPaperConfig,
    Table1BroadConfig,
    Table1ExperimentConfig,
)
from tl_query_lens.results import SavableResult
from tl_query_lens.sources import load_dictionary, load_sources, parse_sources

Size = Literal["quick", "full"]
SUITE = "tlql-saes-smollm2-135m"
READOUT = "tlql-readout-smollm2-135m"
SUITE_LAYERS = (6, 12, 18, 24)


@dataclass(frozen=True)
class Experiment:
    """One measurement, shaped as a command: its config class and ``run(model, cfg) -> result``.

    Attributes:
        name: folder name of its saved result. what: one line for the progress output.
        config: its config class: ``config()`` is the documented (full) size, ``config.quick()`` the quick one;
            its ``SIZES`` say what each means, in words (written into the table's provenance).
        run: the measurement. result_cls: how its saved result is read back (resume).
        needs: optional corpora it reads (``"broad"``): where one is not installed the experiment is skipped with
            the command that installs it, and its rows are reported as not measured.
        forward_tokens: its cost model per size, in tokens through the model (times the seconds per token of the
            run's first forward batch, it gives ``reproduce``'s estimate; see :func:`forward_tokens`).
    """

    name: str
    what: str
    config: Any
    run: Callable[[Any, Any], SavableResult]
    result_cls: type[SavableResult]
    needs: tuple[str, ...] = ()
    forward_tokens: dict[str, int] = field(default_factory=dict)

    def preset(self, size: Size) -> Any:
        """The config of ``size``: ``config.quick()`` or ``config()``."""
        return self.config.quick() if size == "quick" else self.config()

    @property
    def sizes(self) -> dict[str, str]:
        """What ``quick`` and ``full`` mean, in words."""
        return dict(self.config.SIZES)


# The cost models, in tokens through the model. A certificate: its forward batches (``forward_batches``, one window a
# batch) of 32 tokens; the paper's full N is every eligible document (409 in the embedded corpus). Table 1: per layer
# the max-activating pass, and per feature its steering (a generated token counted as one pass of a 16-token prompt)
# and two operator tangents (each counted as one pass of the 64 operator tokens). FF-KV comparison: a clean and a
# spliced pass per dictionary. Readout: the final-layer states (its diagnostics run no forward pass). These are
# approximations: ``reproduce`` rescales what is left by the measured / estimated time of the experiments done.
PAPER_N = 409
BROAD_SIZES = {"full": (512, 5000), "quick": (128, 128)}  # (n_cal, N) of CertifyBroadConfig and its quick()


def _certify_tokens(n_cal: int, n_eval: int, n_proxies: int) -> int:
    return forward_batches(n_cal, n_eval, 1, n_proxies) * 32


def _table1_tokens(layers: int, per_layer: int, n_seqs: int, n_prompts: int, n_generate: int) -> int:
    return layers * (n_seqs * 32 + per_layer * (n_prompts * n_generate * 16 + 2 * 64))


def _suite(model, sae_ids: list[str]) -> dict[str, Any]:
    return {sid: load_dictionary(f"{SUITE}:{sid}", model) for sid in sae_ids}


def _residual_id(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def _layers(cfg: Any) -> tuple[int, ...]:
    return tuple(parse_layers(cfg.run.layers, None))


def certify_ffkv(model, cfg: CertifyFFKVConfig) -> SavableResult:
    """Paper protocol, FF-KV TopK-64 of layer 24, with its feature-shuffled twin (reproduction §1, first rows)."""
    certify = ProtocolCertifyConfig(protocol="paper", n_cal=cfg.n_cal, n_eval=cfg.n_eval, shuffle=True)
    dictionaries = {f"ffkv L{layer}": FFKV.from_model(model, layer, "topk", cfg.k) for layer in _layers(cfg)}
    return certify_protocol(model, dictionaries, cfg.run.corpus, cfg=certify)


def certify_depth(model, cfg: CertifyDepthConfig) -> SavableResult:
    """Paper protocol on the residual SAEs of layers 6/12/18/24 with a 512-window pool (reproduction §1, depth)."""
    layers = _layers(cfg)
    saes = {
        f"sae L{layer}": sae for layer, sae in zip(layers, _suite(model, [_residual_id(x) for x in layers]).values())
    }
    certify = ProtocolCertifyConfig(protocol="paper", n_cal=cfg.n_cal, n_eval=cfg.n_eval, exclude_first_positions=1)
    return certify_protocol(model, saes, cfg.run.corpus, cfg=certify)


def certify_sources(
    model, spec: str, corpus: Any, cfg: ProtocolCertifyConfig, layers: tuple[int, ...] = SUITE_LAYERS
) -> ProtocolCertification:
    """``certify_protocol`` on every dictionary of a ``--dictionary`` spec (FF-KV at ``layers``), labelled as the
    CLI labels them (``"sae L6 blocks.6.hook_resid_post"``, ``"ffkv L6"``)."""
    loaded = load_sources(parse_sources(spec), model, layers)
    return certify_protocol(model, {d.label: d.sae for d in loaded}, corpus, cfg=cfg)


def broad_family(family: str, layers: tuple[int, ...] = SUITE_LAYERS) -> str:
    """§4.3's dictionary families as ``--dictionary`` specs: ``"saes"`` the suite's residual SAEs at ``layers``,
    ``"ffkv"`` FF-KV (spliced through TopK-64 like every proxy of the paper protocol)."""
    return ",".join(f"{SUITE}:{_residual_id(x)}" for x in layers) if family == "saes" else "ffkv"


#: §4.3's two families at the suite's layers (``benchmarks/certify_large_n.py`` certifies the same specs).
BROAD_FAMILIES = {family: broad_family(family) for family in ("saes", "ffkv")}


def certify_broad(model, cfg: CertifyBroadConfig) -> SavableResult:
    """Paper protocol on the 'broad' corpus for one family of layers 6/12/18/24 (reproduction §4.3): full is the
    ``<family>-N5000-cal512`` cell of ``benchmarks/certify_large_n.py`` (the same call)."""
    certify = ProtocolCertifyConfig(
        protocol="paper",
        n_cal=cfg.n_cal,
        n_eval=cfg.n_eval,
        exclude_first_positions=1,
        checkpoint_dir=str(Path(cfg.run.out) / "partial"),  # a stopped run resumes after its last saved window
    )
    layers = _layers(cfg)
    return certify_sources(model, broad_family(cfg.family, layers), cfg.run.corpus, certify, layers)


def readout_paper(model, cfg: ReadoutPaperConfig) -> SavableResult:
    """The authors' readout diagnostics on final-layer states with the shipped ``small`` readout SAE (§2)."""
    sae = SAE.from_pretrained(READOUT, cfg.sae_id, device=str(model.cfg.device))
    run = cfg.run
    tokens = load_corpus(run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="evaluation")
    states = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    paper = PaperReadoutConfig() if cfg.max_states is None else PaperReadoutConfig(max_states=cfg.max_states)
    return readout_diagnostics_paper(model, sae, states, cfg=paper)


def table1(model, cfg: Table1ExperimentConfig) -> SavableResult:
    """Query Lens Table 1 under the paper's protocol on the shipped residual SAEs' features (§3); with
    :class:`~tl_query_lens.reproduce.experiment_config.Table1BroadConfig` the max-activating contexts are searched
    in 'broad' prose instead of docstrings (§4.2, the corpus-kind factor; its features are drawn among those active
    in that prose)."""
    layers = _layers(cfg)
    saes: dict[int | str, Any] = dict(zip(layers, _suite(model, [_residual_id(x) for x in layers]).values()))
    workdir = Path(cfg.run.out)
    table1_cfg = Table1Config(
        protocol="paper",
        features_per_layer=cfg.features_per_layer,
        exclude_first_positions=1,
        prompts=tuple(NEUTRAL_PROMPTS[: cfg.n_prompts]),
        n_generate=cfg.n_generate,
        cache_dir=str(workdir / "operators"),
        checkpoint_dir=str(workdir / "parts"),  # a stopped run resumes layer by layer
    )
    op_tokens = load_corpus("stdlib", model, n_seqs=2, seq_len=32, split="train")
    ev_tokens = load_corpus(cfg.run.corpus, model, n_seqs=cfg.run.n_seqs, seq_len=cfg.run.seq_len, split="evaluation")
    return evaluate_table1(model, saes, op_tokens, ev_tokens, cfg=table1_cfg)


def ffkv_comparison(model, cfg: FFKVComparisonConfig) -> SavableResult:
    """The FF-KV paper's comparison table: FF-KV variants, the suite's SAE and transcoder, a random model (§ FF-KV)."""
    dictionaries: dict[str, Any] = {}
    for layer in _layers(cfg):
        dictionaries[f"L{layer} FF-KV vanilla"] = FFKV.from_model(model, layer, "vanilla")
        dictionaries[f"L{layer} FF-KV TopK-{cfg.k}"] = FFKV.from_model(model, layer, "topk", cfg.k)
        suite = _suite(model, [_residual_id(layer), f"blocks.{layer}.transcoder"])
        dictionaries[f"L{layer} SAE"], dictionaries[f"L{layer} transcoder"] = suite.values()
    run = cfg.run
    tokens = load_corpus(run.corpus, model, n_seqs=run.n_seqs, seq_len=run.seq_len, split="evaluation")
    return compare_dictionaries(model, dictionaries, tokens, absorption=None)


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "certify_ffkv",
            "certification, paper protocol, FF-KV TopK-64 L24 + shuffle",
            CertifyFFKVConfig,
            certify_ffkv,
            ProtocolCertification,
            forward_tokens={"full": _certify_tokens(128, PAPER_N, 2), "quick": _certify_tokens(128, 128, 2)},
        ),
        Experiment(
            "certify_depth",
            "certification, paper protocol, residual SAEs 6/12/18/24",
            CertifyDepthConfig,
            certify_depth,
            ProtocolCertification,
            forward_tokens={"full": _certify_tokens(512, PAPER_N, 4), "quick": _certify_tokens(256, 128, 4)},
        ),
        Experiment(
            "certify_broad_saes",
            "certification, paper protocol, 'broad' corpus, residual SAEs 6/12/18/24",
            CertifyBroadConfig,
            certify_broad,
            ProtocolCertification,
            needs=("broad",),
            forward_tokens={size: _certify_tokens(n_cal, n, 4) for size, (n_cal, n) in BROAD_SIZES.items()},
        ),
        Experiment(
            "certify_broad_ffkv",
            "certification, paper protocol, 'broad' corpus, FF-KV TopK-64 6/12/18/24",
            CertifyBroadFFKVConfig,
            certify_broad,
            ProtocolCertification,
            needs=("broad",),
            forward_tokens={size: _certify_tokens(n_cal, n, 4) for size, (n_cal, n) in BROAD_SIZES.items()},
        ),
        Experiment(
            "readout_paper",
            "readout diagnostics, paper protocol, shipped 'small' readout SAE",
            ReadoutPaperConfig,
            readout_paper,
            PaperReadoutDiagnostics,
            forward_tokens={"full": 32 * 17, "quick": 16 * 17},
        ),
        Experiment(
            "table1_saes",
            "Query Lens Table 1, paper protocol, residual-SAE features",
            Table1ExperimentConfig,
            table1,
            SignatureEvaluation,
            forward_tokens={"full": _table1_tokens(4, 13, 128, 2, 10), "quick": _table1_tokens(2, 6, 48, 1, 5)},
        ),
        Experiment(
            "table1_broad",
            "Query Lens Table 1, paper protocol, residual-SAE features, max-activating contexts from 'broad' prose",
            Table1BroadConfig,
            table1,
            SignatureEvaluation,
            needs=("broad",),
            forward_tokens={"full": _table1_tokens(4, 13, 128, 2, 10), "quick": _table1_tokens(2, 6, 48, 1, 5)},
        ),
        Experiment(
            "ffkv_comparison",
            "FF-KV comparison: FF-KV vs SAE vs transcoder",
            FFKVComparisonConfig,
            ffkv_comparison,
            DictionaryComparison,
            forward_tokens={"full": 4 * 4 * 2 * 32 * 64, "quick": 1 * 4 * 2 * 8 * 64},
        ),
    )
}
