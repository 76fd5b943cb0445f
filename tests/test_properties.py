"""Property-based tests (Hypothesis) of the validators and parsers: range strings, corpora, token tensors, hooks.

Each property states what the function does for *every* input of a kind: accept exactly the valid ones and raise
:class:`~tl_query_lens.errors.InputError` (never another exception) for the rest.
"""

import json
import math
import string
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformer_lens.utils import get_act_name

from tests.helpers import tiny_model
from tl_query_lens.corpus import SPLIT_SHARES, document_split, read_documents
from tl_query_lens.errors import (
    CorruptFileError,
    HookNotFoundError,
    InputError,
    InputTypeError,
    NonFiniteError,
    OutOfRangeError,
)
from tl_query_lens.hooks import check_hook
from tl_query_lens.operators.engine import check_tokens
from tl_query_lens.ranges import parse_floats, parse_layers, parse_ranges
from tl_query_lens.tensor_checks import check_outputs

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MODEL = tiny_model("gelu_ln")  # d_vocab 61, n_ctx 32, 3 layers


# ----- range strings ----------------------------------------------------------------------------------------------
@st.composite
def id_sets_and_texts(draw):
    """A non-empty set of ids and one of the many ways to write it ('3,4,5' / '3-5' / ' 5, 3-4 ')."""
    ids = sorted(draw(st.sets(st.integers(0, 300), min_size=1, max_size=40)))
    runs, start = [], ids[0]
    for prev, cur in zip(ids, ids[1:] + [None]):
        if cur != prev + 1:
            runs.append((start, prev))
            start = cur
    items = []
    for lo, hi in runs:
        if lo == hi:
            items.append(str(lo))
        elif draw(st.booleans()):
            items.append(f"{lo}-{hi}")
        else:
            items.extend(str(i) for i in range(lo, hi + 1))
    items = draw(st.permutations(items))
    space = st.sampled_from(["", " ", "  "])
    return ids, ",".join(f"{draw(space)}{item}{draw(space)}" for item in items)


@SETTINGS
@given(id_sets_and_texts())
def test_every_way_of_writing_a_set_parses_to_it(case):
    ids, text = case
    assert parse_ranges(text, None, "--ids") == ids
    assert parse_ranges(text, max(ids) + 1, "--ids") == ids


@SETTINGS
@given(id_sets_and_texts(), st.integers(1, 300))
def test_bounds_are_enforced_exactly(case, upper):
    ids, text = case
    if max(ids) < upper:
        assert parse_ranges(text, upper, "--layers") == ids
    else:
        with pytest.raises(InputError, match=rf"--layers .*out of range; valid: 0\.\.{upper - 1}"):
            parse_ranges(text, upper, "--layers")


@SETTINGS
@given(st.integers(0, 500), st.integers(0, 500))
def test_reversed_ranges_are_errors_never_empty_lists(lo, hi):
    text = f"{lo}-{hi}"
    if hi < lo:
        with pytest.raises(InputError, match=f"did you mean '{hi}-{lo}'"):
            parse_ranges(text, None, "--features")
    else:
        assert parse_ranges(text, None, "--features") == list(range(lo, hi + 1))


@SETTINGS
@given(st.text(alphabet=string.digits + ",- a\t", max_size=20) | st.text(max_size=12))
def test_any_text_parses_or_raises_input_error(text):
    try:
        ids = parse_ranges(text, 1000, "--layers")
    except InputError as err:
        assert str(err).startswith("--layers")
        return
    assert ids and ids == sorted(set(ids)) and all(0 <= i < 1000 for i in ids)


@SETTINGS
@given(st.integers(1, 64))
def test_all_means_every_layer(n_layers):
    assert parse_layers("all", n_layers) == list(range(n_layers))


@SETTINGS
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=5))
def test_float_lists(values):
    text = ",".join(repr(v) for v in values)
    if all(math.isfinite(v) and v > 0 for v in values):
        assert parse_floats(text, "--kl-targets") == values
    else:
        with pytest.raises(InputError, match="--kl-targets"):
            parse_floats(text, "--kl-targets")


# ----- corpora ----------------------------------------------------------------------------------------------------
line_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
    min_size=1,
    max_size=40,
)


@SETTINGS
@given(st.lists(line_text, min_size=1, max_size=8))
def test_txt_corpus_round_trip(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("txt") / "c.txt"
    path.write_text("\n\n".join(docs), encoding="utf-8")
    assert read_documents(path) == [d.strip() for d in docs if d.strip()]


@SETTINGS
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), min_size=1, max_size=8))
def test_jsonl_corpus_round_trip(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("jsonl") / "c.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n", encoding="utf-8")
    assert read_documents(path) == docs


@SETTINGS
@given(st.lists(line_text, min_size=1, max_size=8), st.data())
def test_jsonl_bad_line_is_named(tmp_path_factory, docs, data):
    bad = data.draw(st.integers(0, len(docs) - 1))
    garbage = data.draw(st.sampled_from(['{"text": oops}', "[1, 2]", '{"body": "x"}', "{", '"just a string"']))
    lines = [json.dumps({"text": d}) for d in docs]
    lines[bad] = garbage
    path = tmp_path_factory.mktemp("bad") / "c.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(CorruptFileError, match=rf"c\.jsonl:{bad + 1}: line {bad + 1} "):
        read_documents(path)


@SETTINGS
@given(st.text(max_size=200))
def test_document_split_is_a_deterministic_function_of_the_text(text):
    assert document_split(text) in SPLIT_SHARES and document_split(text) == document_split(str(text))


# ----- token tensors ----------------------------------------------------------------------------------------------
@SETTINGS
@given(
    st.integers(1, 4),
    st.integers(1, 40),
    st.integers(-3, MODEL.cfg.d_vocab + 3),
    st.integers(0, 10**6),
    st.sampled_from([torch.long, torch.int32]),
)
def test_check_tokens_accepts_exactly_the_valid_batches(batch, pos, extreme, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, MODEL.cfg.d_vocab, (batch, pos), generator=gen).to(dtype)
    tokens[0, pos // 2] = extreme
    valid_ids = 0 <= extreme < MODEL.cfg.d_vocab
    if not valid_ids:
        with pytest.raises(OutOfRangeError, match="another tokenizer"):
            check_tokens(MODEL, tokens)
    elif pos > MODEL.cfg.n_ctx:
        with pytest.raises(InputError, match="exceed the model context"):
            check_tokens(MODEL, tokens)
    else:
        out = check_tokens(MODEL, tokens)
        assert out.dtype == torch.long and torch.equal(out, tokens.long())


@SETTINGS
@given(st.sampled_from([torch.float32, torch.float64, torch.bool]), st.integers(0, 3))
def test_check_tokens_refuses_other_types_and_shapes(dtype, ndim):
    tokens = torch.zeros((2,) * ndim, dtype=dtype)
    with pytest.raises(InputError):
        check_tokens(MODEL, tokens)
    with pytest.raises(InputTypeError):
        check_tokens(MODEL, tokens.tolist())


# ----- hooks ------------------------------------------------------------------------------------------------------
@SETTINGS
@given(
    st.sampled_from(["resid_pre", "resid_mid", "resid_post", "mlp_out", "attn_out", "post", "pre", "z", "q"]),
    st.integers(0, 2),
)
def test_every_hook_built_with_get_act_name_is_accepted(kind, layer):
    name = get_act_name(kind, layer)
    assert check_hook(MODEL, name) == name


@SETTINGS
@given(st.text(max_size=40))
def test_any_other_name_raises_hook_not_found_with_suggestions(name):
    assume(name not in MODEL.hook_dict)
    with pytest.raises(HookNotFoundError) as info:
        check_hook(MODEL, name)
    message = str(info.value)
    assert message.startswith(f"Unknown hook {name!r}") and "get_act_name" in message
    assert isinstance(info.value, KeyError)


# ----- output checks ----------------------------------------------------------------------------------------------
@dataclass
class _Out:
    a: float
    b: torch.Tensor
    c: list
    n: int


@SETTINGS
@given(
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.floats(width=32), min_size=1, max_size=6),
    st.lists(st.floats(), max_size=4),
)
def test_output_checks_name_every_non_finite_field(a, b, c):
    out = _Out(a=a, b=torch.tensor(b), c=c, n=3)
    bad = [name for name, values in (("a", [a]), ("b", b), ("c", c)) if not all(math.isfinite(v) for v in values)]
    if bad:
        with pytest.raises(NonFiniteError) as info:
            check_outputs(out, "method")
        for name in bad:
            assert f"{name} (" in str(info.value)
    else:
        assert check_outputs(out, "method") is out
