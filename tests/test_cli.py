import csv

import pytest

from tl_query_lens.cli import main
from tl_query_lens.errors import InputError
from tl_query_lens.ranges import parse_layers


def test_help(capsys):
    assert main([]) == 0
    assert "ffkv" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0


def test_parse_layers():
    assert parse_layers("0-2,5", 30) == [0, 1, 2, 5]
    assert parse_layers("all", 3) == [0, 1, 2]
    with pytest.raises(InputError, match="out of range"):
        parse_layers("31", 30)


@pytest.mark.slow
def test_ffkv_command(tmp_path):
    out = tmp_path / "ffkv"
    assert main(["ffkv", "--layers", "2,20", "--n-seqs", "4", "--seq-len", "16", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "ffkv_per_layer.csv").open()))
    assert [r["layer"] for r in rows] == ["2", "20"]
    for row in rows:
        assert float(row["ev_vanilla"]) > 0.9999  # the dense dictionary is exact
        assert 0 < float(row["ev_topk"]) < 1 and float(row["mean_l0_topk"]) == 64
    assert list((out / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["certify"], {"--checkpoint-dir": "<--out>/partial"}),
        (["ql-evaluate"], {"--cache-dir": "<--out>/operators", "--checkpoint-dir": "<--out>/parts"}),
        (["ql-channels"], {"--cache-dir": "<--out>/operators"}),
        (
            ["query-lens"],
            {
                "--cache-dir": "none: operators are not cached; with --evaluate <--out>/operators",
                "--checkpoint-dir": "only with --evaluate: <--out>/parts",
            },
        ),
    ],
)
def test_help_shows_the_folders_the_command_really_uses(command, shown, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help: compare with spaces collapsed
    for flag, default in shown.items():
        entry = text.split(f" {flag} TEXT ")[1]
        assert entry.split(" (default: ")[1].startswith(default + ")"), entry[:300]
