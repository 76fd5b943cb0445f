import json

import pytest
import torch

from tl_query_lens.corpus import (
    check_disjoint,
    corpus_fingerprint,
    document_split,
    load_corpus,
    read_documents,
    stdlib_docstrings,
)


class WordTokenizer:
    """A deterministic offline tokenizer: one id per whitespace word (hash bucket), EOS = 0."""

    eos_token_id = 0
    name_or_path = "word-hash"

    def __len__(self) -> int:
        return 1000

    def encode(self, text, add_special_tokens=False):
        return [1 + (sum(map(ord, w)) * 31 + len(w)) % 999 for w in text.split()]


TOK = WordTokenizer()


def test_embedded_corpus_is_real_prose():
    docs = stdlib_docstrings()
    assert len(docs) > 1000
    assert sum(map(len, docs)) > 500_000
    assert len(set(docs)) == len(docs)
    assert not any(line.lstrip().startswith(">>>") for doc in docs[:500] for line in doc.splitlines())


def test_splits_are_disjoint_and_deterministic():
    splits = {
        s: load_corpus("embedded", TOK, n_seqs=200, seq_len=32, split=s, seed=3)
        for s in ("train", "calibration", "evaluation")
    }
    for a, tokens_a in splits.items():
        for b, tokens_b in splits.items():
            if a != b:
                assert check_disjoint(tokens_a, tokens_b) == 0
    again = load_corpus("embedded", TOK, n_seqs=200, seq_len=32, split="evaluation", seed=3)
    assert torch.equal(again, splits["evaluation"])
    other_seed = load_corpus("embedded", TOK, n_seqs=200, seq_len=32, split="evaluation", seed=4)
    assert not torch.equal(other_seed, again)
    assert corpus_fingerprint(again) != corpus_fingerprint(other_seed)
    docs = read_documents("embedded")
    by_split = {document_split(d) for d in docs}
    assert by_split == {"train", "calibration", "evaluation"}


def test_local_text_and_jsonl(tmp_path):
    paragraphs = [f"paragraph {i} " + " ".join(f"w{i}_{j}" for j in range(40)) for i in range(60)]
    (tmp_path / "a.txt").write_text("\n\n".join(paragraphs))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": p}) for p in paragraphs))
    assert read_documents(tmp_path / "a.txt") == paragraphs
    assert read_documents(tmp_path / "b.jsonl") == paragraphs
    tokens = load_corpus(tmp_path / "a.txt", TOK, n_seqs=4, seq_len=16, split="train")
    assert tokens.shape == (4, 16) and tokens.dtype == torch.long


def test_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no documents"):
        load_corpus(tmp_path / "empty.txt", TOK, n_seqs=1, seq_len=4)
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "missing.txt", TOK)
    with pytest.raises(ValueError, match="fewer than n_seqs"):
        load_corpus("embedded", TOK, n_seqs=10**7, seq_len=32, split="evaluation")
    with pytest.raises(ValueError, match="Unknown split"):
        load_corpus("embedded", TOK, split="test")
    with pytest.raises(TypeError, match="needs a tokenizer"):
        load_corpus("embedded", None)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "x"}))
    with pytest.raises(ValueError, match="'text' field"):
        read_documents(tmp_path / "bad.jsonl")


def test_stdlib_source_adds_short_docstrings_and_the_language_reference():
    embedded, stdlib = read_documents("embedded"), read_documents("stdlib")
    assert set(embedded) <= set(stdlib)  # every long docstring is still there; "embedded" itself is unchanged
    assert len(stdlib) > 2 * len(embedded) and sum(map(len, stdlib)) > 1.5 * sum(map(len, embedded))
    assert any("Assert statements are a convenient way" in doc for doc in stdlib)  # pydoc_data.topics
    assert any(len(doc) < 200 for doc in stdlib) and len(set(stdlib)) == len(stdlib)
    splits = {s: load_corpus("stdlib", TOK, n_seqs=None, seq_len=64, split=s) for s in ("train", "evaluation")}
    assert check_disjoint(splits["train"], splits["evaluation"]) == 0
    assert splits["train"].shape[0] > 2 * splits["evaluation"].shape[0]
