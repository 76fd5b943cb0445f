"""Configs of the certification commands (``tlql certify``): what the command line builds before the model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tl_query_lens.certify.protocol import ProtocolCertifyConfig
from tl_query_lens.config import RunConfig


@dataclass
class CertifyCommandConfig:
    """``tlql certify``: certificates of FF-KV or saved dictionaries per layer, under this project's protocol
    (``tlql``: a fixed pool, the shuffle ablation, plots) or the paper's (docs/certification.md).

    Attributes:
        run: model, corpus, layers, dictionaries, output and W&B (the window length is ``protocol.seq_len``).
        protocol: the certification's options, the protocol included.
    """

    run: RunConfig = field(
        default_factory=lambda: RunConfig(out="results/certify", layers="0,6,12,18,24,29", seq_len=32)
    )
    protocol: ProtocolCertifyConfig = field(default_factory=lambda: ProtocolCertifyConfig(protocol="tlql"))

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = (
        "model", "corpus", "device", "seed", "layers", "dictionary", "out", "wandb", "wandb_project",
    )  # fmt: skip
    SHOWN: ClassVar[dict[str, str]] = {"checkpoint_dir": "<--out>/partial"}
