"""The measurements behind docs/reproduction.md and docs/ffkv_comparison.md, each at two sizes.

An experiment is one call of the library's own API (the same function the CLI calls) on the shipped dictionaries;
it returns a result object, and the rows of :mod:`tl_query_lens.reproduce.rows` read their figure from that object's
presentation interface (``scalars()`` / ``tables()``), never from a column list of their own. ``full`` is the size
the docs document; ``quick`` a reduced version of the same measurement for ``tlql reproduce --quick``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sae_lens import SAE

from tl_query_lens.certify.protocol import (
    ProtocolCertification,
    ProtocolCertifyConfig,
    certify_protocol,
    forward_batches,
)
from tl_query_lens.corpus import load_corpus
from tl_query_lens.dictionaries.compare import DictionaryComparison, compare_dictionaries
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.query_lens.evaluation import SignatureEvaluation
from tl_query_lens.query_lens.steering import NEUTRAL_PROMPTS
from tl_query_lens.query_lens.table1 import Table1Config, evaluate_table1
from tl_query_lens.readout import collect_states
from tl_query_lens.readout.protocols.paper import PaperReadoutConfig, PaperReadoutDiagnostics, readout_diagnostics_paper
from tl_query_lens.results import SavableResult
from tl_query_lens.sources import load_dictionary, load_sources, parse_sources

Size = Literal["quick", "full"]
SUITE = "tlql-saes-smollm2-135m"
READOUT = "tlql-readout-smollm2-135m"
SUITE_LAYERS = (6, 12, 18, 24)


@dataclass(frozen=True)
class Experiment:
    """One measurement: ``run(model, size, workdir) -> result`` and the result class that loads it back.

    Attributes:
        name: folder name of its saved result. what: one line for the progress output.
        run: the measurement. result_cls: how its saved result is read back (resume).
        sizes: what ``quick`` and ``full`` mean, in words (written into the table's provenance).
        needs: optional corpora it reads (``"broad"``): where one is not installed the experiment is skipped with
            the command that installs it, and its rows are reported as not measured.
        forward_tokens: its cost model per size, in tokens through the model (times the seconds per token of the
            run's first forward batch, it gives ``reproduce``'s estimate; see :func:`forward_tokens`).
    """

    name: str
    what: str
    run: Callable[[Any, Size, Path], SavableResult]
    result_cls: type[SavableResult]
    sizes: dict[str, str]
    needs: tuple[str, ...] = ()
    forward_tokens: dict[str, int] = field(default_factory=dict)


# The cost models, in tokens through the model. A certificate: its forward batches (``forward_batches``, one window a
# batch) of 32 tokens; the paper's full N is every eligible document (409 in the embedded corpus). Table 1: per layer
# the max-activating pass, and per feature its steering (a generated token counted as one pass of a 16-token prompt)
# and two operator tangents (each counted as one pass of the 64 operator tokens). FF-KV comparison: a clean and a
# spliced pass per dictionary. Readout: the final-layer states (its diagnostics run no forward pass). These are
# approximations: ``reproduce`` rescales what is left by the measured / estimated time of the experiments done.
PAPER_N = 409


def _certify_tokens(n_cal: int, n_eval: int, n_proxies: int) -> int:
    return forward_batches(n_cal, n_eval, 1, n_proxies) * 32


def _table1_tokens(layers: int, per_layer: int, n_seqs: int, n_prompts: int, n_generate: int) -> int:
    return layers * (n_seqs * 32 + per_layer * (n_prompts * n_generate * 16 + 2 * 64))


def _suite(model, sae_ids: list[str]) -> dict[str, Any]:
    return {sid: load_dictionary(f"{SUITE}:{sid}", model) for sid in sae_ids}


def _residual_id(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def certify_ffkv(model, size: Size, workdir: Path) -> SavableResult:
    """Paper protocol, FF-KV TopK-64 of layer 24, with its feature-shuffled twin (reproduction §1, first rows)."""
    n_cal, n_eval = (128, None) if size == "full" else (128, 128)
    cfg = ProtocolCertifyConfig(protocol="paper", n_cal=n_cal, n_eval=n_eval, shuffle=True)
    return certify_protocol(model, {"ffkv L24": FFKV.from_model(model, 24, "topk", 64)}, "embedded", cfg=cfg)


def certify_depth(model, size: Size, workdir: Path) -> SavableResult:
    """Paper protocol on the residual SAEs of layers 6/12/18/24 with a 512-window pool (reproduction §1, depth)."""
    n_cal, n_eval = (512, None) if size == "full" else (256, 128)
    saes = {
        f"sae L{layer}": sae
        for layer, sae in zip(SUITE_LAYERS, _suite(model, [_residual_id(x) for x in SUITE_LAYERS]).values())
    }
    cfg = ProtocolCertifyConfig(protocol="paper", n_cal=n_cal, n_eval=n_eval, exclude_first_positions=1)
    return certify_protocol(model, saes, "embedded", cfg=cfg)


# §4.3: the two dictionary families certified on the 'broad' corpus, as ``--dictionary`` specs (FF-KV is spliced
# through TopK-64 like every proxy of the paper protocol).
BROAD_FAMILIES = {"saes": ",".join(f"{SUITE}:{_residual_id(x)}" for x in SUITE_LAYERS), "ffkv": "ffkv"}
BROAD_SIZES = {"full": (512, 5000), "quick": (128, 128)}  # (n_cal, N)


def certify_sources(
    model, spec: str, corpus: Any, cfg: ProtocolCertifyConfig, layers: tuple[int, ...] = SUITE_LAYERS
) -> ProtocolCertification:
    """``certify_protocol`` on every dictionary of a ``--dictionary`` spec (FF-KV at ``layers``), labelled as the
    CLI labels them (``"sae L6 blocks.6.hook_resid_post"``, ``"ffkv L6"``)."""
    loaded = load_sources(parse_sources(spec), model, layers)
    return certify_protocol(model, {d.label: d.sae for d in loaded}, corpus, cfg=cfg)


def certify_broad(family: str) -> Callable[[Any, Size, Path], SavableResult]:
    """Paper protocol on the 'broad' corpus for one family of layers 6/12/18/24 (reproduction §4.3): full is the
    ``<family>-N5000-cal512`` cell of ``benchmarks/certify_large_n.py`` (the same call)."""

    def run(model, size: Size, workdir: Path) -> SavableResult:
        n_cal, n_eval = BROAD_SIZES[size]
        cfg = ProtocolCertifyConfig(
            protocol="paper",
            n_cal=n_cal,
            n_eval=n_eval,
            exclude_first_positions=1,
            checkpoint_dir=str(workdir / "partial"),  # a stopped run resumes after its last saved window
        )
        return certify_sources(model, BROAD_FAMILIES[family], "broad", cfg)

    return run


def readout_paper(model, size: Size, workdir: Path) -> SavableResult:
    """The authors' readout diagnostics on final-layer states with the shipped ``small`` readout SAE (§2)."""
    sae = SAE.from_pretrained(READOUT, "small", device=str(model.cfg.device))
    n_seqs = 32 if size == "full" else 16
    tokens = load_corpus("stdlib", model, n_seqs=n_seqs, seq_len=17, split="evaluation")
    states = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    cfg = PaperReadoutConfig() if size == "full" else PaperReadoutConfig(max_states=64)
    return readout_diagnostics_paper(model, sae, states, cfg=cfg)


def table1_saes(model, size: Size, workdir: Path) -> SavableResult:
    """Query Lens Table 1 under the paper's protocol on the shipped residual SAEs' features (§3)."""
    return _table1(model, size, workdir, "stdlib")


def table1_broad(model, size: Size, workdir: Path) -> SavableResult:
    """Table 1 as :func:`table1_saes`, with the max-activating contexts searched in 'broad' prose instead of
    docstrings (§4.2, the corpus-kind factor; its features are drawn among those active in that prose)."""
    return _table1(model, size, workdir, "broad")


def _table1(model, size: Size, workdir: Path, maxact_corpus: str) -> SavableResult:
    layers = SUITE_LAYERS if size == "full" else (12, 24)
    saes: dict[int | str, Any] = dict(zip(layers, _suite(model, [_residual_id(x) for x in layers]).values()))
    per_layer, n_seqs, n_prompts, n_generate = (13, 128, 2, 10) if size == "full" else (6, 48, 1, 5)
    cfg = Table1Config(
        protocol="paper",
        features_per_layer=per_layer,
        exclude_first_positions=1,
        prompts=tuple(NEUTRAL_PROMPTS[:n_prompts]),
        n_generate=n_generate,
        cache_dir=str(workdir / "operators"),
        checkpoint_dir=str(workdir / "parts"),  # a stopped run resumes layer by layer
    )
    op_tokens = load_corpus("stdlib", model, n_seqs=2, seq_len=32, split="train")
    ev_tokens = load_corpus(maxact_corpus, model, n_seqs=n_seqs, seq_len=32, split="evaluation")
    return evaluate_table1(model, saes, op_tokens, ev_tokens, cfg=cfg)


def ffkv_comparison(model, size: Size, workdir: Path) -> SavableResult:
    """The FF-KV paper's comparison table: FF-KV variants, the suite's SAE and transcoder, a random model (§ FF-KV)."""
    layers = SUITE_LAYERS if size == "full" else (24,)
    n_seqs = 32 if size == "full" else 8
    dictionaries: dict[str, Any] = {}
    for layer in layers:
        dictionaries[f"L{layer} FF-KV vanilla"] = FFKV.from_model(model, layer, "vanilla")
        dictionaries[f"L{layer} FF-KV TopK-32"] = FFKV.from_model(model, layer, "topk", 32)
        suite = _suite(model, [_residual_id(layer), f"blocks.{layer}.transcoder"])
        dictionaries[f"L{layer} SAE"], dictionaries[f"L{layer} transcoder"] = suite.values()
    tokens = load_corpus("stdlib", model, n_seqs=n_seqs, seq_len=64, split="evaluation")
    return compare_dictionaries(model, dictionaries, tokens, absorption=None)


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "certify_ffkv",
            "certification, paper protocol, FF-KV TopK-64 L24 + shuffle",
            certify_ffkv,
            ProtocolCertification,
            {"full": "n_cal 128, one window per evaluation document (N = 409)", "quick": "n_cal 128, N = 128"},
            forward_tokens={"full": _certify_tokens(128, PAPER_N, 2), "quick": _certify_tokens(128, 128, 2)},
        ),
        Experiment(
            "certify_depth",
            "certification, paper protocol, residual SAEs 6/12/18/24",
            certify_depth,
            ProtocolCertification,
            {"full": "n_cal 512, N = 409", "quick": "n_cal 256, N = 128"},
            forward_tokens={"full": _certify_tokens(512, PAPER_N, 4), "quick": _certify_tokens(256, 128, 4)},
        ),
        *[
            Experiment(
                f"certify_broad_{family}",
                f"certification, paper protocol, 'broad' corpus, {what} 6/12/18/24",
                certify_broad(family),
                ProtocolCertification,
                {
                    "full": "'broad' corpus, n_cal 512, N = 5,000 documents",
                    "quick": "'broad' corpus, n_cal 128, N = 128 documents",
                },
                needs=("broad",),
                forward_tokens={size: _certify_tokens(n_cal, n, 4) for size, (n_cal, n) in BROAD_SIZES.items()},
            )
            for family, what in (("saes", "residual SAEs"), ("ffkv", "FF-KV TopK-64"))
        ],
        Experiment(
            "readout_paper",
            "readout diagnostics, paper protocol, shipped 'small' readout SAE",
            readout_paper,
            PaperReadoutDiagnostics,
            {"full": "32 x 17 final-layer states, 256 ablation states", "quick": "16 x 17 states, 64 ablation states"},
            forward_tokens={"full": 32 * 17, "quick": 16 * 17},
        ),
        Experiment(
            "table1_saes",
            "Query Lens Table 1, paper protocol, residual-SAE features",
            table1_saes,
            SignatureEvaluation,
            {
                "full": "layers 6/12/18/24 x 13 features, 128 x 32 tokens, 2 prompts x 10 tokens, 64 operator tokens",
                "quick": "layers 12/24 x 6 features, 48 x 32 tokens, 1 prompt x 5 tokens, 64 operator tokens",
            },
            forward_tokens={"full": _table1_tokens(4, 13, 128, 2, 10), "quick": _table1_tokens(2, 6, 48, 1, 5)},
        ),
        Experiment(
            "table1_broad",
            "Query Lens Table 1, paper protocol, residual-SAE features, max-activating contexts from 'broad' prose",
            table1_broad,
            SignatureEvaluation,
            {
                "full": "as table1_saes, the 128 x 32 max-activating tokens from the 'broad' corpus",
                "quick": "as table1_saes quick, the 48 x 32 max-activating tokens from the 'broad' corpus",
            },
            needs=("broad",),
            forward_tokens={"full": _table1_tokens(4, 13, 128, 2, 10), "quick": _table1_tokens(2, 6, 48, 1, 5)},
        ),
        Experiment(
            "ffkv_comparison",
            "FF-KV comparison: FF-KV vs SAE vs transcoder",
            ffkv_comparison,
            DictionaryComparison,
            {"full": "layers 6/12/18/24, 32 x 64 tokens, no absorption", "quick": "layer 24, 8 x 64 tokens"},
            forward_tokens={"full": 4 * 4 * 2 * 32 * 64, "quick": 1 * 4 * 2 * 8 * 64},
        ),
    )
}
