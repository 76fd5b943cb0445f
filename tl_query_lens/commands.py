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
        "saes compare",
        "FF-KV (vanilla / TopK / normalized) vs SAE vs transcoder vs a random model, one table",
        config="tl_query_lens.saes.config:SAECompareCommandConfig",
        run="tl_query_lens.saes_commands:run_saes_compare",
        check="tl_query_lens.saes_commands:check_saes_compare",
    ),
    Command(
        "saes train",
        "train (or resume) the suite into the user cache",
        config="tl_query_lens.saes.config:SAETrainCommandConfig",
        run="tl_query_lens.saes_commands:run_saes_train",
        check="tl_query_lens.saes_commands:check_saes_train",
    ),
    Command(
        "saes report",
        "quality of each trained dictionary on the evaluation split",
        config="tl_query_lens.saes.config:SAEReportCommandConfig",
        run="tl_query_lens.saes_commands:run_saes_report",
        check="tl_query_lens.saes_commands:check_saes_report",
        result_name="saes_quality",
    ),
    Command(
        "reproduce",
        "re-measure every reproduction row: paper | documented | this run, CSV + markdown + W&B",
        config="tl_query_lens.reproduce.config:ReproduceCommandConfig",
        run="tl_query_lens.reproduce.run:run_reproduce",
        check="tl_query_lens.reproduce.run:check_reproduce",
    ),
    Command(
        "query-lens",
        "Query Lens key/value signatures of FF-KV features",
        config="tl_query_lens.query_lens.config:QueryLensCommandConfig",
        run="tl_query_lens.query_lens.commands:run_query_lens",
        check="tl_query_lens.query_lens.commands:check_query_lens",
        result_name="signatures",  # signatures_layer<L>_<side>.csv beside the sets' folders
    ),
    Command(
        "ql-evaluate",
        "Table-1 input/output scores of Query Lens signatures",
        config="tl_query_lens.query_lens.config:QLEvaluateCommandConfig",
        run="tl_query_lens.query_lens.commands:run_ql_evaluate",
        check="tl_query_lens.query_lens.commands:check_ql_evaluate",
    ),
    Command(
        "readout fit",
        "fit a readout SAE to the model's LM head and cache it",
        config="tl_query_lens.readout.config:ReadoutFitCommandConfig",
        run="tl_query_lens.readout.commands:run_fit",
        check="tl_query_lens.readout.commands:check_fit",
    ),
    Command(
        "readout decompose",
        "decompose one score of one prompt into readout features",
        config="tl_query_lens.readout.config:ReadoutDecomposeCommandConfig",
        run="tl_query_lens.readout.commands:run_decompose",
        check="tl_query_lens.readout.commands:check_decompose",
    ),
    Command(
        "readout eval",
        "diagnostics and row-geometry baselines on held-out states",
        config="tl_query_lens.readout.config:ReadoutEvalCommandConfig",
        run="tl_query_lens.readout.commands:run_eval",
        check="tl_query_lens.readout.commands:check_eval",
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
