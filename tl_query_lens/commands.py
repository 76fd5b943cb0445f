"""Every ``tlql`` command, one :class:`~tl_query_lens.command.Command` each (a config and a ``run``)."""

from __future__ import annotations

from tl_query_lens.command import Command

__all__ = ["COMMANDS", "GROUPS"]

#: One line of help per command group (``tlql readout fit``: group ``readout``).
GROUPS: dict[str, str] = {
    "readout": "readout SAEs: fit, decompose a score, evaluate against baselines",
    "saes": "trained SAEs / transcoders of the model and their comparison",
}

COMMANDS: tuple[Command, ...] = (
    Command(
        "ffkv",
        "summarise FF-KV dictionaries (alive rate, L0, EV, CE change)",
        config="tl_query_lens.dictionaries.config:FFKVCommandConfig",
        run="tl_query_lens.dictionaries.splice:run_ffkv",
        check="tl_query_lens.dictionaries.splice:check_ffkv",
    ),
    Command(
        "ql-channels",
        "subspace channels: low-rank fits of module responses",
        config="tl_query_lens.query_lens.config:ChannelsCommandConfig",
        run="tl_query_lens.query_lens.channels_commands:run_ql_channels",
        check="tl_query_lens.query_lens.channels_commands:check_ql_channels",
    ),
    Command(
        "certify",
        "certify the model through SAE / FF-KV proxies (risk bound)",
        config="tl_query_lens.certify.config:CertifyCommandConfig",
        run="tl_query_lens.certify.commands:run_certify",
        check="tl_query_lens.certify.commands:check_certify",
    ),
    Command(
        "atlas",
        "build the feature atlas: a static, searchable site of every feature (resumable; torchrun splits it)",
        config="tl_query_lens.atlas.config:AtlasCommandConfig",
        run="tl_query_lens.atlas.commands:run_atlas",
        check="tl_query_lens.atlas.commands:check_atlas",
        result_folder="result",
    ),
)
