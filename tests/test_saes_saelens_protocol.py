"""``tlql saes report --protocol saelens``: SAELens' own ``run_evals`` beside the project's report.

With the protocols made equal (no clean first position, no special tokens in a tokenizer-less model), SAELens'
``run_evals`` and the project's :func:`suite_quality` are two independent implementations of the same figures, so
they must agree; with the project's default (first position clean) they must not.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_protocol_setup
from tl_query_lens.saes.report import SuiteQuality, suite_quality
from tl_query_lens.saes.saelens_eval import SAELENS_COLUMNS, WindowStore, saelens_quality

SHARED = ("ce_clean", "ce_spliced", "ce_zero", "ce_recovered", "kl", "explained_variance", "mean_l0")


@pytest.fixture(scope="module")
def setup():
    return tiny_protocol_setup()


def test_saelens_run_evals_equals_the_report_when_the_protocols_agree(setup):
    model, tokens, saes = setup
    theirs = saelens_quality(model, saes, tokens, batch_size=3)
    assert [r["sae_id"] for r in theirs] == ["sae"]  # the transcoder is left out
    assert set(SHARED) <= set(SAELENS_COLUMNS) and theirs[0]["n_tokens"] == tokens.numel()
    same = suite_quality(model, saes, tokens, batch_size=3, exclude_first_positions=0).row("sae")
    for key in SHARED:
        assert theirs[0][key] == pytest.approx(same[key], rel=1e-4, abs=1e-6), key
    default = suite_quality(model, saes, tokens, batch_size=3, exclude_first_positions=1).row("sae")
    assert theirs[0]["ce_spliced"] != pytest.approx(default["ce_spliced"], rel=1e-4)
    quality = SuiteQuality(rows=[default], n_tokens=0, seconds=0.0, saelens=theirs)
    text = quality.markdown()
    assert "SAELens `run_evals`" in text and f"{theirs[0]['ce_recovered']:.3f} / {default['ce_recovered']:.3f}" in text


def test_the_window_store_hands_out_whole_batches_in_order():
    tokens = torch.arange(40).reshape(8, 5)
    store = WindowStore(tokens, 3)
    assert store.get_batch_tokens(3).tolist() == tokens[:3].tolist() and store.get_batch_tokens()[0, 0] == 15
    with pytest.raises(ValueError, match="Only 8 windows"):
        store.get_batch_tokens(3)
    store.reset_input_dataset()
    assert store.get_batch_tokens(2)[0, 0] == 0 and store.context_size == 5
