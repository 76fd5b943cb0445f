"""What ``build_atlas`` builds: the dictionaries, the corpus pass, the page contents and the output folder."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tl_query_lens.config import RunConfig, Split, check_ranges

QUICK_LAYER = 20  # the one FF-KV layer of the quick atlas
#: The bot user of Neuronpedia's database seed (``apps/webapp/prisma/seed.ts``), present on every fresh instance.
BOT_CREATOR = "clkht01d40000jv08hvalcvly"
#: The visibilities of a Neuronpedia release, model, source set and source.
VISIBILITIES = ("PUBLIC", "UNLISTED", "PRIVATE")


@dataclass
class AtlasConfig:
    """Sizes and contents of a feature atlas (``tlql atlas``; :func:`~tl_query_lens.atlas.build_atlas`).

    Attributes:
        out: folder of the static site (index.html opens from file://); a rerun resumes in it.
        dictionary: dictionaries, comma-separated: 'default' (the FF-KV neurons of every layer of --layers, the
            shipped suite SAEs and transcoders and the readout SAE that are available here), 'ffkv',
            'ffkv:<layer>[:vanilla|topk|normalized[:<k>]]', an SAE folder, '<release>:<sae_id>' or
            '<hf-org>/<repo>:<sae_id>'.
        layers: layers of the plain 'ffkv' and 'default' entries, e.g. '12', '0-29' or 'all'.
        features: feature ids built per dictionary, e.g. '0-255' (None: every feature).
        corpus: corpus of the max-activating contexts and the operators ('embedded', 'stdlib', a file or folder).
        split: split of ``corpus`` the contexts are drawn from ('train', 'calibration', 'evaluation'). The default,
            'train', is the only split of the embedded corpus that holds >= 100k tokens (155k; evaluation: 49k).
        seed: seed of the corpus windows and of the quantile-band samples.
        n_tokens: corpus tokens of the single forward pass shared by every dictionary (>= 100k for the full atlas).
        seq_len: tokens per corpus window (one context).
        batch_size: windows per forward pass.
        exclude_first_positions: leading positions of every window left out of all statistics (the attention sink).
        n_top: max-activating contexts per feature.
        n_bands: quantile bands of the per-context maximum (over the contexts where the feature fires).
        band_examples: contexts shown per band.
        band_sample: contexts sampled uniformly per feature (among those where it fires) to fill the bands.
        context_before / context_after: tokens shown before / after the max token of a context.
        k_tokens: tokens per signature list (top and bottom).
        signatures: compute Query Lens and logit-lens signatures (off: contexts and statistics only).
        operator_seqs / operator_seq_len: corpus of the Query Lens operators (windows x tokens).
        n_links: linked features per transcoder feature / MLP neuron, and readout tokens per readout feature.
        shard_size: features per data file; the unit of resuming and of splitting work between torchrun ranks.
        attach: saved results shown on a dictionary page, '<dictionary label>=<result folder>' (a certificate, an
            absorption result or any saved result), comma-separated.
        exports: also write Neuronpedia's bulk-import layout and circuit-tracer feature cards.
        neuronpedia_creator: Neuronpedia user id on every exported row (the default: the bot user a fresh
            Neuronpedia instance's seed creates).
        neuronpedia_visibility: visibility of the exported release, model, source set and source ('PUBLIC',
            'UNLISTED' or 'PRIVATE').
        operator_cache: folder where the Query Lens operators are kept (None: ``<out>/operators``). A later build on
            the same operator corpus, an added dictionary included, reads the operators of its hooks from there
            instead of sweeping the model again.
        quick: a first look in a minute or two: one FF-KV layer, 256 features, a small corpus (options given
            explicitly still win).
    """

    out: Path = Path("results/atlas")
    dictionary: tuple[str, ...] = ("default",)
    layers: str = "all"
    features: str | None = None
    corpus: str = "embedded"
    split: Split = "train"
    seed: int = 0
    n_tokens: int = 102_400
    seq_len: int = 64
    batch_size: int = 16
    exclude_first_positions: int = 1
    n_top: int = 20
    n_bands: int = 4
    band_examples: int = 3
    band_sample: int = 16
    context_before: int = 12
    context_after: int = 4
    k_tokens: int = 10
    signatures: bool = True
    operator_seqs: int = 8
    operator_seq_len: int = 32
    n_links: int = 5
    shard_size: int = 256
    attach: tuple[str, ...] = ()
    exports: bool = True
    neuronpedia_creator: str = BOT_CREATOR
    neuronpedia_visibility: str = "PUBLIC"
    operator_cache: Path | None = None
    quick: bool = False

    RANGES: ClassVar[dict[str, str]] = {
        "seed": "[0, 4294967295]",
        "n_tokens": "[1, inf)",
        "seq_len": "[2, inf)",
        "batch_size": "[1, inf)",
        "exclude_first_positions": "[0, inf)",
        "n_top": "[1, inf)",
        "n_bands": "[1, inf)",
        "band_examples": "[1, inf)",
        "band_sample": "[1, inf)",
        "context_before": "[0, inf)",
        "context_after": "[0, inf)",
        "k_tokens": "[1, inf)",
        "operator_seqs": "[1, inf)",
        "operator_seq_len": "[2, inf)",
        "n_links": "[1, inf)",
        "shard_size": "[1, inf)",
    }

    def __post_init__(self) -> None:
        check_ranges(self)
        self.out = Path(self.out)
        if self.operator_cache is not None:
            self.operator_cache = Path(self.operator_cache)
        if isinstance(self.dictionary, str):
            self.dictionary = tuple(s.strip() for s in self.dictionary.split(",") if s.strip())
        if isinstance(self.attach, str):
            self.attach = tuple(s.strip() for s in self.attach.split(",") if s.strip())
        positive = (
            "n_tokens",
            "seq_len",
            "batch_size",
            "n_top",
            "n_bands",
            "band_examples",
            "band_sample",
            "k_tokens",
            "operator_seqs",
            "operator_seq_len",
            "n_links",
            "shard_size",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("context_before", "context_after", "exclude_first_positions", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if self.n_tokens < self.seq_len:
            raise ValueError(f"n_tokens={self.n_tokens} is less than one window of seq_len={self.seq_len}.")
        if self.exclude_first_positions >= self.seq_len:
            raise ValueError(f"exclude_first_positions must be below seq_len={self.seq_len}.")
        if self.split not in ("train", "calibration", "evaluation"):
            raise ValueError(f"split must be 'train', 'calibration' or 'evaluation', got {self.split!r}.")
        if self.neuronpedia_visibility not in VISIBILITIES:
            raise ValueError(
                f"neuronpedia_visibility must be one of {', '.join(VISIBILITIES)}, got {self.neuronpedia_visibility!r}."
            )
        if not self.neuronpedia_creator.strip():
            raise ValueError("neuronpedia_creator is empty; give a Neuronpedia user id (or leave the default).")
        if not self.dictionary:
            raise ValueError("dictionary is empty; give 'default' or dictionary specs.")
        for item in self.attach:
            if "=" not in item:
                raise ValueError(f"attach entry {item!r} is not '<dictionary label>=<result folder>'.")

    @property
    def n_seqs(self) -> int:
        """Corpus windows of the forward pass."""
        return self.n_tokens // self.seq_len

    @classmethod
    def preset_quick(cls, **given) -> AtlasConfig:
        """The quick atlas: one FF-KV layer, 256 features, 8k corpus tokens, a 1 x 16 operator corpus."""
        base = {
            "dictionary": (f"ffkv:{QUICK_LAYER}",),
            "features": "0-255",
            "n_tokens": 8192,
            "operator_seqs": 1,
            "operator_seq_len": 16,
            "shard_size": 128,
            "quick": True,
        }
        return cls(**{**base, **given})

    def fingerprint_fields(self) -> dict:
        """The fields a finished shard depends on (a resumed build reuses a shard only when they match)."""
        skip = {"out", "dictionary", "layers", "features", "attach", "exports", "operator_cache", "quick", "shard_size"}
        skip |= {"neuronpedia_creator", "neuronpedia_visibility"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}


@dataclass
class AtlasCommandConfig:
    """``tlql atlas``: every feature of the chosen dictionaries as a static site in ``--out`` (docs/atlas.md).

    Attributes:
        run: model, device and W&B; its ``out`` is the site's folder (``atlas.out`` follows it), and the corpus,
            seed, layers, features and dictionaries are the atlas's own options.
        atlas: sizes and contents of the atlas.
    """

    run: RunConfig = field(default_factory=lambda: run_of(AtlasConfig()))
    atlas: AtlasConfig = field(default_factory=AtlasConfig)

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "device", "wandb", "wandb_project")
    NOT_OPTIONS: ClassVar[tuple[str, ...]] = ("atlas.quick",)  # set by the preset: --quick

    @classmethod
    def quick(cls) -> AtlasCommandConfig:
        """A first look in a minute or two: one FF-KV layer, 256 features, a small corpus (options given explicitly
        still win)."""
        atlas = AtlasConfig.preset_quick()
        return cls(run=run_of(atlas), atlas=atlas)


def run_of(atlas: AtlasConfig) -> RunConfig:
    """The :class:`RunConfig` that names what ``atlas`` builds from (the command line feeds both from one option)."""
    names = ("corpus", "seed", "seq_len", "layers", "features", "dictionary")
    return RunConfig(out=str(atlas.out), **{name: getattr(atlas, name) for name in names})
