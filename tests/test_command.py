"""A new ``tlql`` command is one config and one ``run`` (docs/architecture.md, "Commands"): the runner gives it
options, checks, the model, saving, W&B, printed tables and a report page, with nothing else written for it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from tests.helpers import tiny_model
from tl_query_lens.cli import main
from tl_query_lens.command import Command
from tl_query_lens.commands import COMMANDS
from tl_query_lens.config import RunConfig, check_ranges
from tl_query_lens.presentation import Table
from tl_query_lens.results import SavableResult


@dataclass
class EmbedNormConfig:
    """``tlql embed-norm``: norms of the first token embeddings, scaled.

    Attributes:
        run: model, output and W&B.
        n_tokens: how many token ids (from 0) are measured.
        scale: factor applied to each norm.
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(out="results/embed_norm"))
    n_tokens: int = 4
    scale: float = 2.0

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("model", "out", "wandb")
    RANGES: ClassVar[dict[str, str]] = {"n_tokens": "[1, inf)", "scale": "(0, inf)"}

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class EmbedNorms(SavableResult):
    """Scaled embedding norms.

    Attributes:
        norms: one per token id.
    """

    norms: list[float]

    def scalars(self) -> dict[str, float]:
        return {"mean_norm": sum(self.norms) / len(self.norms)}

    def tables(self) -> dict[str, Table]:
        return {"per_token": Table.build({"token": int, "norm": float}, list(enumerate(self.norms)))}


def run_embed_norm(model, cfg: EmbedNormConfig) -> EmbedNorms:
    return EmbedNorms(norms=(model.W_E[: cfg.n_tokens].norm(dim=-1) * cfg.scale).tolist())


NEW = Command(
    "embed-norm",
    "norms of the first token embeddings",
    config="tests.test_command:EmbedNormConfig",
    run="tests.test_command:run_embed_norm",
)


@pytest.fixture
def model(monkeypatch):
    model = tiny_model("gelu_ln")
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: model)
    return model


def test_a_new_command_is_one_config_and_one_run(model, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["embed-norm", "--scale", "3", "--n-tokens", "5", "--out", str(out), "--no-wandb"]
    assert main(argv, commands=(*COMMANDS, NEW)) == 0
    want = (model.W_E[:5].norm(dim=-1) * 3).tolist()  # reference: the model's own weights
    assert EmbedNorms.load(out).norms == pytest.approx(want)
    scalars = json.loads((out / "embed_norm.json").read_text())
    assert scalars["mean_norm"] == pytest.approx(sum(want) / 5)
    csv = (out / "embed_norm_per_token.csv").read_text().splitlines()
    assert csv[0] == "token,norm" and len(csv) == 6
    assert "mean_norm" in (out / "report.html").read_text()
    printed = capsys.readouterr().out
    assert "per_token:" in printed and f"{want[4]:.4g}" in printed


def test_a_new_commands_bad_option_exits_2_before_the_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("tl_query_lens.models.load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["embed-norm", "--scale", "0", "--out", str(tmp_path / "o")], commands=(*COMMANDS, NEW)) == 2
    err = capsys.readouterr().err
    assert "--scale" in err and "Traceback" not in err and not (tmp_path / "o").exists()


def test_a_new_command_has_help_from_its_config(capsys):
    with pytest.raises(SystemExit):
        main(["embed-norm", "--help"], commands=(*COMMANDS, NEW))
    text = capsys.readouterr().out
    assert "factor applied to each norm. (default: 2.0)" in text and "--n-seqs" not in text
