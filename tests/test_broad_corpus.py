"""The 'broad' corpus on a tiny fixture: two fake Debian packages built here (ar + tar.xz, as dpkg-deb writes them)."""

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from tests.test_corpus import TOK
from tl_query_lens import broad_corpus
from tl_query_lens.broad_corpus import DebianPackage, install_broad_corpus, read_manifest
from tl_query_lens.corpus import load_corpus, read_documents
from tl_query_lens.errors import CorruptFileError, InputError

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(n: int) -> str:
    out = ""
    while True:
        out = B64[n % 64] + out
        n //= 64
        if n == 0:
            return out


def make_deb(files: dict[str, bytes], links: dict[str, str] = ()) -> bytes:
    """A .deb: ar archive of debian-binary, control.tar.xz and data.tar.xz holding ``files`` (paths under ./)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for path, blob in files.items():
            info = tarfile.TarInfo("./" + path)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        for path, target in dict(links).items():
            info = tarfile.TarInfo("./" + path)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:xz"):
        pass
    out = b"!<arch>\n"
    for name, blob in (
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", control.getvalue()),
        ("data.tar.xz", data.getvalue()),
    ):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(blob):<10}".encode() + b"`\n" + blob
        if len(blob) % 2:
            out += b"\n"
    return out


LONG = " It is a sentence long enough to count as prose in a document of this test fixture."
ARTICLES = [
    # (headwords, raw article text, expected cleaned document)
    (
        ["Aback"],
        'Aback \\A*back"\\ ([.a]*b[a^]k"), adv. [Pref. a- + back.]\n   1. Toward the back; backward.'
        + LONG
        + "\n   [1913 Webster]\n\n   2. See {Back}."
        + LONG
        + "\n",
        "Aback, adv. [Pref. a- + back.] 1. Toward the back; backward." + LONG + "\n2. See Back." + LONG,
    ),
    (
        ["Abacus", "Abaci"],
        "Abacus, n.\n   A table for counting." + LONG * 3 + "\n",
        "Abacus, n. A table for counting." + LONG * 3,
    ),
    (["Ab"], "Ab, n. A month.\n", None),  # too short
]
FORTUNES = {
    "wisdom": "First quote\non two lines."
    + LONG * 3
    + "\n%\nshort one\n%\nThird _\bq_\bu_\bo_\bt_\be."
    + LONG * 3
    + "\n%\n",
    "ascii-art": "  /\\_/\\ " + "x" * 300 + "\n%\n",  # excluded by name
    "wisdom.dat": "binary index" * 50,  # skipped: has a suffix
}
EXPECTED_FORTUNES = ["First quote\non two lines." + LONG * 3, "Third quote." + LONG * 3]


def fixture_debs(tmp_path):
    dict_body, index = b"", []
    for heads, raw, _ in ARTICLES:
        offset, blob = len(dict_body), raw.encode()
        dict_body += blob
        index += [f"{h}\t{b64(offset)}\t{b64(len(blob))}" for h in heads]
    index.append(f"00-database-info\t{b64(0)}\t{b64(10)}")
    dictd = make_deb(
        {
            "usr/share/dictd/tiny.index": "\n".join(sorted(index)).encode(),
            "usr/share/dictd/tiny.dict.dz": gzip.compress(dict_body),
            "usr/share/doc/dict-tiny/copyright": b"public domain",
        }
    )
    # The second package repeats one dictionary article as a quotation: it is kept once.
    quotes = dict(FORTUNES, repeat=ARTICLES[1][2] + "\n%\n")
    fortune = make_deb(
        {f"usr/share/games/fortunes/{n}": t.encode() for n, t in quotes.items()},
        links={"usr/share/games/fortunes/wisdom.u8": "wisdom"},
    )
    folder = tmp_path / "debs"
    folder.mkdir()
    (folder / "dict-tiny_1_all.deb").write_bytes(dictd)
    (folder / "fortunes-tiny%3a1_all.deb").write_bytes(fortune)
    packages = (
        DebianPackage(
            "dict-tiny",
            "1",
            "pool/d/dict-tiny_1_all.deb",
            hashlib.sha256(dictd).hexdigest(),
            len(dictd),
            "dictd",
            ("tiny",),
            "public domain",
        ),
        DebianPackage(
            "fortunes-tiny",
            "1:1",
            "pool/f/fortunes-tiny_1_all.deb",
            hashlib.sha256(fortune).hexdigest(),
            len(fortune),
            "fortune",
            ("ascii-art",),
            "BSD",
        ),
    )
    return folder, packages


def expected_documents():
    return [doc for _, _, doc in ARTICLES if doc] + EXPECTED_FORTUNES


def test_install_from_debs_parses_cleans_and_deduplicates(tmp_path):
    folder, packages = fixture_debs(tmp_path)
    manifest = install_broad_corpus(tmp_path / "broad", debs=folder, packages=packages, mirror="file:///nonexistent")
    lines = (tmp_path / "broad" / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["text"] for r in records] == expected_documents()
    assert [r["source"] for r in records] == ["dict-tiny", "dict-tiny", "fortunes-tiny", "fortunes-tiny"]
    assert manifest["n_documents"] == 4
    assert [p["n_documents"] for p in manifest["packages"]] == [2, 2]
    assert [p["n_parsed"] for p in manifest["packages"]] == [3, 4]  # 3 articles; 3 quotes of wisdom + 1 repeat
    assert manifest["documents_sha256"] == hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()
    assert {p["sha256"] for p in manifest["packages"]} == {p.sha256 for p in packages}


def test_download_from_mirror_and_refuse_other_builds(tmp_path):
    folder, packages = fixture_debs(tmp_path)
    mirror = tmp_path / "mirror"
    for package, name in zip(packages, ("dict-tiny_1_all.deb", "fortunes-tiny%3a1_all.deb")):
        (mirror / package.filename).parent.mkdir(parents=True, exist_ok=True)
        (mirror / package.filename).write_bytes((folder / name).read_bytes())
    manifest = install_broad_corpus(tmp_path / "a", packages=packages, mirror=mirror.as_uri())
    assert manifest["n_documents"] == 4
    altered = (mirror / packages[0].filename).read_bytes() + b"\0\0"
    (mirror / packages[0].filename).write_bytes(altered)
    with pytest.raises(CorruptFileError, match="not the pinned"):
        install_broad_corpus(tmp_path / "b", packages=packages, mirror=mirror.as_uri())
    assert not (tmp_path / "b" / "manifest.json").exists()
    with pytest.raises(InputError, match="--debs"):
        install_broad_corpus(tmp_path / "c", packages=packages, mirror=(tmp_path / "nowhere").as_uri())


def test_load_corpus_broad_has_disjoint_hash_splits(tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    # Many short documents so every split gets some: a fortune file of 300 numbered quotations.
    quotes = "".join(
        f"Quotation number {i}: " + " ".join(f"word{i}x{j}" for j in range(40)) + "\n%\n" for i in range(300)
    )
    deb = make_deb({"usr/share/games/fortunes/many": quotes.encode()})
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs" / "many.deb").write_bytes(deb)
    package = DebianPackage(
        "fortunes-many", "1", "pool/m.deb", hashlib.sha256(deb).hexdigest(), len(deb), "fortune", (), "BSD"
    )
    install_broad_corpus(debs=tmp_path / "debs", packages=(package,))
    docs = read_documents("broad")
    assert len(docs) == 300 and docs[0].startswith("Quotation number 0:")
    # The split of a document is the SHA-1 bucket of its text: 0-59 train, 60-79 calibration, 80-99 evaluation.
    bucket = {d: int(hashlib.sha1(d.encode()).hexdigest()[:8], 16) % 100 for d in docs}
    by_split = {
        "train": [d for d in docs if bucket[d] < 60],
        "calibration": [d for d in docs if 60 <= bucket[d] < 80],
        "evaluation": [d for d in docs if bucket[d] >= 80],
    }
    assert all(by_split.values())
    for s, docs_s in by_split.items():
        windows = load_corpus("broad", TOK, n_seqs=None, seq_len=8, split=s)
        stream = [t for d in docs_s for t in [*TOK.encode(d), 0]]  # the split's documents, EOS-joined, in order
        expected = sorted(tuple(stream[i : i + 8]) for i in range(0, len(stream) - 7, 8))
        assert sorted(map(tuple, windows.tolist())) == expected


def test_missing_or_altered_install_names_the_setup_option(tmp_path, monkeypatch):
    monkeypatch.setenv("TLQL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(InputError, match="setup.sh --broad-corpus"):
        read_documents("broad")
    with pytest.raises(InputError, match="not installed"):
        read_manifest()
    with pytest.raises(InputError, match="setup.sh --broad-corpus"):
        load_corpus("broad", TOK, n_seqs=4, seq_len=8)
    from tl_query_lens.checks import check_corpus

    with pytest.raises(InputError, match="setup.sh --broad-corpus"):
        check_corpus("broad")
    check_corpus("embedded")  # the defaults never need it
    folder, packages = fixture_debs(tmp_path)
    install_broad_corpus(debs=folder, packages=packages)
    path = broad_corpus.broad_dir() / "documents.jsonl"
    path.write_text(path.read_text(encoding="utf-8").replace("Abacus", "Abakus"), encoding="utf-8")
    broad_corpus._records.cache_clear()
    with pytest.raises(CorruptFileError, match="SHA-256"):
        read_documents("broad")


def test_pinned_packages_are_well_formed():
    names = [p.name for p in broad_corpus.PACKAGES]
    assert len(set(names)) == len(names)
    for p in broad_corpus.PACKAGES:
        assert len(p.sha256) == 64 and int(p.sha256, 16) >= 0
        assert p.filename.startswith("pool/main/") and p.filename.endswith("_all.deb")
        assert p.version.split(":")[-1] in p.filename
        assert p.licence
