"""The Python API fails fast and clearly: non-finite dictionaries and outputs, foreign tokens, corrupt files.

Each test is a row of docs/reliability.md.
"""

import json

import pytest
import torch

from tests.helpers import tiny_model, tiny_tokens
from tl_query_lens import FFKV, QueryLens, certify
from tl_query_lens.corpus import load_corpus
from tl_query_lens.dictionaries.saved import load_sae
from tl_query_lens.dictionaries.splice import SpliceMetrics, splice_metrics
from tl_query_lens.errors import (
    CorruptFileError,
    HookNotFoundError,
    InputError,
    NonFiniteError,
    OutOfRangeError,
)
from tl_query_lens.hooks import check_hook
from tl_query_lens.operators import value_operators
from tl_query_lens.query_lens import Signatures


@pytest.fixture(scope="module")
def model():
    return tiny_model("gelu_ln")


def _nan_ffkv(model, layer=1):
    sae = FFKV.from_model(model, layer, "topk", k=8)
    with torch.no_grad():
        sae.W_dec[3, 5] = float("nan")
    return sae


def _cal_ev(model):
    return tiny_tokens(model, 4, 8, seed=1), tiny_tokens(model, 24, 8, seed=2)


def test_nan_dictionary_signatures_name_the_dictionary_and_tensor(model):
    lens = QueryLens(model, tiny_tokens(model, 2, 8), progress=False)
    with pytest.raises(
        NonFiniteError,
        match=r"FFKVSAE at blocks\.1\.ln2\.hook_normalized → blocks\.1\.hook_mlp_out "
        r"has 1 non-finite entries \(NaN/inf\) in values \(W_dec\)",
    ):
        lens.value_signatures(_nan_ffkv(model), [0, 1], k=3)


def test_nan_dictionary_certify_refused_on_entry(model):
    cal, ev = _cal_ev(model)
    with pytest.raises(NonFiniteError, match=r"values \(W_dec\)"):
        certify(model, _nan_ffkv(model), cal, ev, k=4)


def test_nan_dictionary_splice_metrics_refused_on_entry(model):
    with pytest.raises(NonFiniteError, match="FFKVSAE at blocks.1"):
        splice_metrics(model, _nan_ffkv(model), tiny_tokens(model, 2, 8))


def _nan_model():
    broken = tiny_model("gelu_ln")
    with torch.no_grad():
        broken.blocks[2].mlp.W_out[0, 0] = float("nan")
    return broken


def test_nan_model_certificate_is_not_reported():
    """Before: bound=nan, nontrivial=False, no warning. Now: an error naming the non-finite terms."""
    broken = _nan_model()
    cal, ev = _cal_ev(broken)
    sae = FFKV.from_model(broken, 0, "topk", k=4)  # a finite dictionary upstream of the NaN
    with pytest.raises(NonFiniteError, match=r"certify produced non-finite values in R_hat .*bound"):
        certify(broken, sae, cal, ev, k=4)


def test_nan_model_splice_metrics_are_not_reported():
    broken = _nan_model()
    with pytest.raises(NonFiniteError, match=r"splice_metrics produced non-finite values in .*ce_clean"):
        splice_metrics(broken, FFKV.from_model(broken, 0, "topk", k=4), tiny_tokens(broken, 2, 8))


@pytest.mark.parametrize("method", ["certify", "splice_metrics"])
def test_token_ids_beyond_the_vocabulary(model, method):
    cal, ev = _cal_ev(model)
    ev = ev.clone()
    ev[0, 3] = model.cfg.d_vocab  # one id past the end
    sae = FFKV.from_model(model, 1, "topk", k=4)
    with pytest.raises(OutOfRangeError, match="another tokenizer"):
        if method == "certify":
            certify(model, sae, cal, ev, k=4)
        else:
            splice_metrics(model, sae, ev)


def test_truncated_operator_cache_names_the_file_and_deleting_it_fixes_it(model, tmp_path):
    tokens = tiny_tokens(model, 2, 8)
    hooks = ["blocks.1.hook_resid_post"]
    first = value_operators(model, tokens, hooks, cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match=rf"{path.name}: is not a readable safetensors file .* Delete it"):
        value_operators(model, tokens, hooks, cache_dir=tmp_path, progress=False)
    path.unlink()
    again = value_operators(model, tokens, hooks, cache_dir=tmp_path, progress=False)
    assert torch.equal(again.sums[hooks[0]], first.sums[hooks[0]])


def test_query_lens_with_a_corrupt_cache_names_the_file(model, tmp_path):
    tokens = tiny_tokens(model, 2, 8)
    QueryLens(model, tokens, cache_dir=tmp_path, progress=False).value_operator("blocks.1.hook_resid_post")
    (path,) = tmp_path.glob("*.safetensors")
    path.write_bytes(b"not a safetensors file at all")
    lens = QueryLens(model, tokens, cache_dir=tmp_path, progress=False)
    with pytest.raises(CorruptFileError, match=str(path)):  # the identity basis reads the cached full operator
        lens.value_signatures(FFKV.from_model(model, 1), [0], k=3, basis="identity")


def _metrics():
    return SpliceMetrics(
        alive_rate=1.0,
        mean_l0=2.0,
        explained_variance=0.5,
        ce_clean=1.0,
        ce_spliced=1.1,
        ce_delta=0.1,
        kl=0.01,
        n_tokens=10,
    )


def test_result_folder_without_result_json(tmp_path):
    folder = _metrics().save(tmp_path / "m")
    (folder / "result.json").unlink()
    with pytest.raises(CorruptFileError, match=r"result\.json: is missing\. Delete .* rerun"):
        SpliceMetrics.load(folder)


def test_result_folder_with_broken_json(tmp_path):
    folder = _metrics().save(tmp_path / "m")
    (folder / "result.json").write_text('{"type": "SpliceMetrics", "fields": {')
    with pytest.raises(CorruptFileError, match=r"result\.json: is not valid JSON"):
        SpliceMetrics.load(folder)


def test_result_folder_with_missing_fields(tmp_path):
    folder = _metrics().save(tmp_path / "m")
    record = json.loads((folder / "result.json").read_text())
    del record["fields"]["kl"]
    (folder / "result.json").write_text(json.dumps(record))
    with pytest.raises(CorruptFileError, match="does not hold the fields of a SpliceMetrics"):
        SpliceMetrics.load(folder)


def test_result_folder_with_truncated_tensors(model, tmp_path):
    lens = QueryLens(model, tiny_tokens(model, 2, 8), progress=False)
    folder = lens.value_signatures(FFKV.from_model(model, 1), [0, 1], k=3, method="logit_lens").save(tmp_path / "s")
    tensors = folder / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:100])
    with pytest.raises(CorruptFileError, match=r"tensors\.safetensors: is not a readable safetensors file"):
        Signatures.load(folder)


def test_result_folder_that_does_not_exist(tmp_path):
    with pytest.raises(CorruptFileError, match="is not a folder holding a saved SpliceMetrics"):
        SpliceMetrics.load(tmp_path / "nothing")


def test_sae_folder_without_dtype_names_the_config(model, tmp_path):
    """Before: ``KeyError: 'dtype'`` from SAELens. Now: the file and the fix."""
    folder = tmp_path / "sae"
    FFKV.from_model(model, 1, "topk", k=4).save_model(folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    del cfg["dtype"]
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(CorruptFileError, match=r"cfg\.json: lacks \['dtype'\].*sae\.save_model"):
        load_sae(folder)


def test_sae_folder_loads_when_valid(model, tmp_path):
    sae = FFKV.from_model(model, 1, "topk", k=4)
    sae.save_model(tmp_path / "sae")
    assert torch.equal(load_sae(tmp_path / "sae").W_dec, sae.W_dec)


def test_unknown_hook_message_is_plain_text(model):
    with pytest.raises(HookNotFoundError) as info:
        check_hook(model, "blocks.1.hook_resid_pots")
    assert isinstance(info.value, KeyError) and str(info.value).startswith("Unknown hook 'blocks.1.hook_resid_pots'")
    assert "blocks.1.hook_resid_post" in str(info.value)


def test_corpus_split_too_small_is_an_input_error(tmp_path):
    class Tok:
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            return [1 + (ord(c) % 50) for c in text]

        def __len__(self):
            return 51

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"document number {i} " * 3 for i in range(20)))
    with pytest.raises(InputError, match="fewer than n_seqs=100000"):
        load_corpus(corpus, Tok(), n_seqs=100000, seq_len=8, split="train")


def test_decompose_with_nan_readout_names_it(tmp_path):
    from tl_query_lens.readout import fit_readout, token_logit

    model = tiny_model("gelu_ln")
    fit = fit_readout(
        model,
        tiny_tokens(model, 4, 8),
        width=64,
        k=4,
        steps=5,
        batch_rows=32,
        batch_pairs=16,
        log_every=5,
        progress=False,
    )
    sae = fit.sae
    with torch.no_grad():
        sae.W_dec[2, 0] = float("inf")
    h = torch.randn(model.cfg.d_model)
    with pytest.raises(NonFiniteError, match=r"ReadoutSAE at .* in W_dec"):
        sae.decompose(h, token_logit(3, model.cfg.d_vocab), model=model)
