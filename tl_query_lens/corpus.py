"""Token corpora with disjoint, deterministic splits (docs/design.md §2).

The embedded source is English prose every machine has: the docstrings of Python's standard library, read from
source with ``ast`` (nothing is imported), doctest lines dropped, deduplicated, in a fixed order. ``"embedded"`` keeps
only docstrings of at least 200 characters (the recorded figures were measured on it); ``"stdlib"`` is the larger
source for training dictionaries: every docstring, the language reference shipped as ``pydoc_data/topics.py``
(read with ``ast`` too) and the licence text, each cut into paragraph groups of about 1,000 characters.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import random
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import torch
from jaxtyping import Int

from tl_query_lens.broad_corpus import broad_documents
from tl_query_lens.config import Split
from tl_query_lens.errors import CorruptFileError, InputError, MissingFileError, UnavailableError
from tl_query_lens.models import cache_dir
from tl_query_lens.paths import atomic_write

logger = logging.getLogger(__name__)

# Documents go to a split by a hash of their text, so splits are disjoint whatever n_seqs or seed is asked for.
# 60/20/20 so that certification finds >= 1000 evaluation sequences of 32 tokens in the embedded corpus.
SPLIT_SHARES: dict[str, tuple[int, int]] = {"train": (0, 60), "calibration": (60, 80), "evaluation": (80, 100)}
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "ensurepip", "turtledemo"}
MIN_DOC_CHARS = 200
# The "stdlib" source: long texts are cut into groups of paragraphs of about this size, so the hash split is fine-grained.
CHUNK_CHARS = 1000
SOURCES = ("embedded", "stdlib", "broad")  # "broad": tl_query_lens/broad_corpus.py, installed by setup.sh


def _clean_docstring(text: str) -> str:
    lines = []
    in_doctest = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")):
            in_doctest = True
            continue
        if in_doctest and stripped:  # expected output of a doctest
            continue
        in_doctest = False
        lines.append(stripped)
    paragraphs = " ".join(lines).split("  ")
    return "\n".join(" ".join(p.split()) for p in paragraphs if p.strip()).strip()


@lru_cache(maxsize=2)
def stdlib_docstrings(min_chars: int = MIN_DOC_CHARS) -> tuple[str, ...]:
    """All standard-library docstrings of at least ``min_chars`` characters, cleaned, deduplicated, sorted by path.

    Parsing the standard library takes a few seconds, so the result is cached in the user cache directory.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    cached = cache_dir() / "corpus" / f"stdlib-docstrings-{sys.version_info[0]}.{sys.version_info[1]}-{min_chars}.json"
    if cached.exists():
        return tuple(json.loads(cached.read_text(encoding="utf-8")))
    docs = _parse_docstrings(root, min_chars)
    _write_cache(cached, docs)
    return tuple(docs)


def _write_cache(path: Path, docs: list[str]) -> None:
    """Atomically cache ``docs``; a cache that cannot be written only costs the parse next time."""
    try:
        with atomic_write(path) as handle:
            json.dump(docs, handle)
    except OSError as err:  # WriteError is an OSError
        logger.warning("could not cache the corpus in %s (%s); it is parsed again next time", path, err)


def _parse_docstrings(root: Path, min_chars: int) -> list[str]:
    seen: set[str] = set()
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            raw = ast.get_docstring(node, clean=True)
            if not raw:
                continue
            text = _clean_docstring(raw)
            if len(text) >= min_chars and text not in seen:
                seen.add(text)
                docs.append(text)
    return docs


def _paragraph_chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Consecutive blank-line-separated paragraphs of ``text`` joined into chunks of at least ``size`` characters."""
    chunks: list[str] = []
    current: list[str] = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        current.append(para)
        if sum(map(len, current)) >= size:
            chunks.append("\n\n".join(current))
            current = []
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _pydoc_topics(root: Path) -> list[str]:
    """The language-reference topics shipped in ``pydoc_data/topics.py``, read with ``ast`` (not imported)."""
    path = root / "pydoc_data" / "topics.py"
    if not path.exists():
        logger.warning("%s is missing; the 'stdlib' corpus goes without the language reference", path)
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return [topics[name] for name in sorted(topics)]
    raise ValueError(f"{path} has no `topics = {{...}}` assignment; this Python's pydoc_data layout is unknown.")


@lru_cache(maxsize=1)
def stdlib_texts() -> tuple[str, ...]:
    """The ``"stdlib"`` source: every docstring, the pydoc topics and the licence, in paragraph chunks, deduplicated.

    Cached in the user cache directory like :func:`stdlib_docstrings`.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cached = cache_dir() / "corpus" / f"stdlib-texts-{version}-{CHUNK_CHARS}.json"
    if cached.exists():
        return tuple(json.loads(cached.read_text(encoding="utf-8")))
    long_texts = _pydoc_topics(root)
    licence = root / "LICENSE.txt"
    if licence.exists():
        long_texts.append(licence.read_text(encoding="utf-8"))
    seen: set[str] = set()
    docs: list[str] = []
    for doc in [*stdlib_docstrings(1), *(c for t in long_texts for c in _paragraph_chunks(t))]:
        if doc not in seen:
            seen.add(doc)
            docs.append(doc)
    _write_cache(cached, docs)
    return tuple(docs)


MAX_FILE_BYTES = 4 * 1024**3  # a corpus file larger than this is a mistake (or /dev/zero), not a corpus


def _read_local(path: Path) -> list[str]:
    if path.is_dir():
        files = sorted(path.glob("*.txt")) + sorted(path.glob("*.jsonl"))
        if not files:
            raise InputError(
                f"The corpus folder {path} holds no .txt or .jsonl files; put documents there or pass a file."
            )
        return [doc for p in files for doc in _read_local(p)]
    if not path.is_file():  # a FIFO would block, a device (/dev/zero) never ends
        raise InputError(
            f"The corpus {path} is not a regular file (a pipe, socket or device); save the documents to a .txt or "
            ".jsonl file and pass that."
        )
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise InputError(
                f"The corpus file {path} is larger than {MAX_FILE_BYTES / 1024**3:.0f} GiB; split it into several "
                "files in a folder, or sample it."
            )
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorruptFileError(path, f"is not UTF-8 text (byte {err.start})", "Convert it to UTF-8.") from err
    if path.suffix == ".jsonl":
        return _read_jsonl(path, text)
    # Plain text: one document per blank-line-separated block.
    return [block.strip() for block in text.split("\n\n") if block.strip()]


def _read_jsonl(path: Path, text: str) -> list[str]:
    """One ``{"text": ...}`` object per line; a bad line raises an error naming the file and the line."""
    docs = []
    fix = 'Each line must be one JSON object with a "text" field: {"text": "..."}; fix or delete that line.'
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorruptFileError(
                f"{path}:{n}", f"line {n} is not valid JSON ({err.msg} at column {err.colno})", fix
            ) from err
        if not isinstance(record, dict) or "text" not in record:
            raise CorruptFileError(f"{path}:{n}", f"line {n} has no 'text' field", fix)
        if not isinstance(record["text"], str):
            kind = "null" if record["text"] is None else type(record["text"]).__name__
            raise CorruptFileError(f"{path}:{n}", f"line {n} has a 'text' that is {kind}, not a string", fix)
        docs.append(record["text"])
    return docs


def _read_hf_dataset(name: str, max_docs: int, text_field: str = "text") -> list[str]:
    try:
        import datasets
    except ImportError as err:
        raise UnavailableError(
            f"{name!r} is not a local file or folder, and HF datasets as a corpus need "
            "`pip install datasets`; offline, use 'embedded' or a local .txt/.jsonl path."
        ) from err
    try:
        stream = datasets.load_dataset(name, split="train", streaming=True)
        return [str(row[text_field]) for _, row in zip(range(max_docs), stream)]
    except (OSError, ValueError, ConnectionError, KeyError) as err:
        raise UnavailableError(
            f"Could not read HF dataset {name!r} ({err}). Offline, use source='embedded' or a local .txt/.jsonl path."
        ) from err


def read_documents(source: str | Path | Iterable[str] = "embedded", *, max_hf_docs: int = 20000) -> list[str]:
    """Documents of a corpus source: ``"embedded"``, ``"stdlib"``, ``"broad"`` (once installed), a local .txt/.jsonl file or folder, an HF dataset
    name, or texts."""
    if not isinstance(source, (str, Path)):
        texts = list(source)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise InputError(
                f"Corpus text {bad} is a {type(texts[bad]).__name__} ({texts[bad]!r:.40}), not a string; pass "
                "strings only (a None or a number would become the document 'None' or '12345')."
            )
        return texts
    if str(source) == "embedded":
        return list(stdlib_docstrings())
    if str(source) == "stdlib":
        return list(stdlib_texts())
    if str(source) == "broad":  # general prose from Debian packages, installed by `scripts/setup.sh --broad-corpus`
        return list(broad_documents())
    path = Path(source)
    if path.exists():
        return _read_local(path)
    if path.suffix in {".txt", ".jsonl"}:
        raise MissingFileError(
            f"Corpus file {path} does not exist; give an existing .txt/.jsonl file or folder, or 'embedded'."
        )
    return _read_hf_dataset(str(source), max_hf_docs)


def document_split(text: str) -> str:
    """The split a document belongs to (hash bucket of its text; stable across machines and runs)."""
    bucket = int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:8], 16) % 100
    return next(name for name, (lo, hi) in SPLIT_SHARES.items() if lo <= bucket < hi)


def _get_tokenizer(tokenizer):
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer  # accept a HookedTransformer
    if tok is None or not callable(getattr(tok, "encode", None)):
        raise TypeError(
            "load_corpus needs a tokenizer (or a model with .tokenizer); got "
            f"{type(tokenizer).__name__}. Tiny models without a tokenizer: pass token tensors directly."
        )
    return tok


def load_corpus(
    source: str | Path | Iterable[str] = "embedded",
    tokenizer=None,
    *,
    n_seqs: int | None = 64,
    seq_len: int = 32,
    split: Split = "train",
    seed: int = 0,
) -> Int[torch.Tensor, "batch pos"]:
    """Fixed-length token sequences from one split of a corpus.

    Documents are assigned to train / calibration / evaluation by a hash of their text (60/20/20), tokenized,
    joined with the EOS token, cut into ``seq_len`` windows, and ``n_seqs`` windows are drawn with ``seed``
    (``n_seqs=None``: every window of the split, in the seeded order).

    Returns:
        LongTensor ``[n_seqs, seq_len]``.
    """
    if split not in SPLIT_SHARES:
        raise InputError(f"Unknown split {split!r}; use one of {sorted(SPLIT_SHARES)}.")
    if (n_seqs is not None and n_seqs < 1) or seq_len < 1:
        raise InputError(f"n_seqs and seq_len must be positive, got n_seqs={n_seqs}, seq_len={seq_len}.")
    tok = _get_tokenizer(tokenizer)
    docs = [d for d in read_documents(source) if d.strip() and document_split(d) == split]
    if not docs:
        raise InputError(
            f"The corpus {source!r} has no documents in split {split!r}; give a larger corpus "
            "(a .txt file with blank-line-separated paragraphs, or a .jsonl with a 'text' field)."
        )
    stream = _token_stream(tuple(docs), tok)
    n_windows = stream.numel() // seq_len
    if n_seqs is None:
        n_seqs = n_windows
    if n_windows < n_seqs or n_windows == 0:
        raise InputError(
            f"Split {split!r} of {source!r} holds {n_windows} sequences of {seq_len} tokens, fewer than n_seqs={n_seqs}; "
            "lower n_seqs or seq_len, or use a larger corpus."
        )
    windows = stream[: n_windows * seq_len].view(n_windows, seq_len)
    order = list(range(n_windows))
    random.Random(seed).shuffle(order)
    return windows[torch.tensor(order[:n_seqs])].clone()


def _token_stream(docs: Sequence[str], tok) -> torch.Tensor:
    """The documents tokenised and joined with EOS (no cache: a tokenizer is not a safe cache key)."""
    sep = tok.eos_token_id if tok.eos_token_id is not None else 0
    ids: list[int] = []
    for doc in docs:
        ids.extend(tok.encode(doc, add_special_tokens=False))
        ids.append(sep)
    return torch.tensor(ids, dtype=torch.long)


def corpus_fingerprint(tokens: torch.Tensor) -> str:
    """A short content hash of a token tensor, stored with every cached result computed on it."""
    data = tokens.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(data + str(tuple(tokens.shape)).encode()).hexdigest()[:16]


def check_disjoint(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of sequences of ``a`` that also occur in ``b`` (rows compared exactly)."""
    rows = {tuple(r) for r in b.tolist()}
    return sum(tuple(r) in rows for r in a.tolist())
