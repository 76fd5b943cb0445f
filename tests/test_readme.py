"""The README's Python API block runs as written: on a tiny random model by default, on the embedded model (slow).

The block is read from README.md (the first ``python`` block under "## Python API") and executed unchanged; the fast
variant only swaps ``load_model`` / ``load_corpus`` for a tiny random model with enough layers and MLP width for the
block's layer 18 and features [3, 141], and random tokens of the requested shape (distinct per split).
"""

import re
from pathlib import Path

import pytest
import torch

import tl_query_lens
from tests.helpers import tiny_model, tiny_tokens

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_api_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match, "README.md has no ```python block under '## Python API'"
    return match.group(1)


def _check(namespace: dict) -> None:
    dec, values, cert = namespace["dec"], namespace["values"], namespace["cert"]
    assert torch.allclose(dec.bias + dec.contributions.sum() + dec.residual, dec.exact, rtol=1e-6, atol=1e-8)
    assert values.feature_ids.tolist() == [3, 141] and values.top_ids.shape == (2, 10)
    assert namespace["keys"].top_ids.shape == (2, 10)
    assert namespace["scores"].shape == (namespace["model"].cfg.d_vocab,) and namespace["scores"].grad_fn is None
    assert cert.N == 64 and cert.bound == cert.bound  # finite: outputs are checked before they are returned


def test_readme_api_block_runs_on_a_tiny_model(monkeypatch):
    model = tiny_model("gated_rms", n_layers=19, d_mlp=160)
    seeds = {"train": 0, "calibration": 1, "evaluation": 2}
    monkeypatch.setattr(tl_query_lens, "load_model", lambda name, device=None: model)
    monkeypatch.setattr(
        tl_query_lens,
        "load_corpus",
        lambda source, tok, n_seqs, seq_len, split="train", seed=0: tiny_tokens(
            model, n_seqs, seq_len, seed=seeds[split]
        ),
    )
    namespace: dict = {}
    exec(compile(readme_api_block(), str(README), "exec"), namespace)  # noqa: S102 (the point: run the README)
    _check(namespace)


@pytest.mark.slow
def test_readme_api_block_runs_on_the_embedded_model():
    namespace: dict = {}
    exec(compile(readme_api_block(), str(README), "exec"), namespace)  # noqa: S102 (the point: run the README)
    _check(namespace)
    assert namespace["values"].top_strings is not None


def test_readme_test_commands_are_the_ones_ci_runs():
    """The README's test command and .ci/run's pytest invocations are the same commands, in the same order."""
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## The two commands") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, "README.md has no ```bash block under '## The two commands'"
    pattern = r"python -m pytest[^&#\n]*"
    ci_commands = [
        c.strip() for line in ci.splitlines() if not line.lstrip().startswith("#") for c in re.findall(pattern, line)
    ]
    readme_commands = [c.strip() for c in re.findall(pattern, block.group(1))]
    assert readme_commands == ci_commands and len(ci_commands) == 2
