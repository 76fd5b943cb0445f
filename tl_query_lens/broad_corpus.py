"""The ``"broad"`` corpus: general English prose from five Debian packages, installed once, offline afterwards.

The embedded corpus is Python docstrings; the certification paper draws one window from each of 10k C4 documents and
Query Lens searches max-activating examples in web text. ``"broad"`` is the nearest offline source with more than
10,000 independent documents of general prose: dictionary articles (GCIDE, built on Webster's 1913; FOLDOC; the Jargon
File; Bierce's *Devil's Dictionary*) and quotations (the BSD ``fortune`` files). Each article or quotation is one
document. The packages are pinned by version and SHA-256 (``PACKAGES``) and fetched from a Debian mirror, or taken
from a folder of ``.deb`` files (``apt-get download ...``); the ``.deb`` is unpacked here in Python (``ar`` + ``tar``),
so nothing is installed system-wide and no ``dpkg`` is needed.

Install with ``bash scripts/setup.sh --broad-corpus`` or ``python -m tl_query_lens.broad_corpus install``; then
``load_corpus("broad", model, split=...)`` reads it with the same hash-based train / calibration / evaluation split as
the embedded corpus (:func:`tl_query_lens.corpus.document_split`). Provenance and licences: docs/corpus.md.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import logging
import lzma
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from tl_query_lens.errors import (
    CorruptFileError,
    InputError,
    MissingFileError,
    UnavailableError,
    boundary_error,
    check_json_shape,
)
from tl_query_lens.models import cache_dir

logger = logging.getLogger(__name__)

BROAD_VERSION = "1"
DEBIAN_MIRROR = "https://deb.debian.org/debian"
MIN_DOC_CHARS = 200  # as the embedded corpus: a document gives at least one 32-token window
MANIFEST_KEYS = ("version", "n_documents", "n_characters", "documents_sha256", "packages")
SETUP_HINT = "bash scripts/setup.sh --broad-corpus (or: python -m tl_query_lens.broad_corpus install)"
# The largest .deb and the largest member read; the pinned packages are far below (GCIDE: 14.8 MB / 39 MB).
MAX_DEB_BYTES = 64 * 2**20
MAX_MEMBER_BYTES = 128 * 2**20


@dataclass(frozen=True)
class DebianPackage:
    """One pinned Debian package of the broad corpus.

    Attributes:
        name: the binary package.
        version: its Debian version (bookworm).
        filename: path under the mirror (``pool/main/...``), from ``apt-cache show``.
        sha256: SHA-256 of the ``.deb``; a file that does not match is refused.
        size: bytes of the ``.deb``.
        kind: ``"dictd"`` (``<name>.index`` + ``<name>.dict.dz`` under /usr/share/dictd) or ``"fortune"`` (files of
            ``%``-separated quotations under /usr/share/games/fortunes).
        files: the dictd database names, or the fortune files left out (``exclude``).
        licence: the licence stated in the package's ``copyright`` file.
    """

    name: str
    version: str
    filename: str
    sha256: str
    size: int
    kind: Literal["dictd", "fortune"]
    files: tuple[str, ...]
    licence: str


PACKAGES: tuple[DebianPackage, ...] = (
    DebianPackage(
        "dict-gcide",
        "0.48.5+nmu2",
        "pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu2_all.deb",
        "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
        14800692,
        "dictd",
        ("gcide",),
        "GPL-2+ (GCIDE; its Webster's 1913 source text is public domain)",
    ),
    DebianPackage(
        "dict-foldoc",
        "20230119-1",
        "pool/main/d/dict-foldoc/dict-foldoc_20230119-1_all.deb",
        "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3",
        2408824,
        "dictd",
        ("foldoc",),
        "GFDL-1.1+ (FOLDOC, Copyright 1993 Denis Howe)",
    ),
    DebianPackage(
        "dict-jargon",
        "4.4.7-3.1",
        "pool/main/d/dict-jargon/dict-jargon_4.4.7-3.1_all.deb",
        "405f8168d7994ed2cb71407bb95493daec2e9aa66fc0461dafa74a9d6728a8c1",
        621608,
        "dictd",
        ("jargon",),
        "public domain (the Jargon File)",
    ),
    DebianPackage(
        "dict-devil",
        "1.0-13.1",
        "pool/main/d/dict-devil/dict-devil_1.0-13.1_all.deb",
        "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
        179760,
        "dictd",
        ("devil",),
        "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
    ),
    DebianPackage(
        "fortunes",
        "1:1.99.1-7.3",
        "pool/main/f/fortune-mod/fortunes_1.99.1-7.3_all.deb",
        "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
        848988,
        "fortune",
        ("ascii-art",),
        "BSD-4-clause (fortune-mod, The Regents of the University of California); quotations by their authors",
    ),
    DebianPackage(
        "fortunes-min",
        "1:1.99.1-7.3",
        "pool/main/f/fortune-mod/fortunes-min_1.99.1-7.3_all.deb",
        "9eed5b45064e41133dae0967cf3a17588ad77c014fcc7bf1527fa3ea48e44d07",
        56492,
        "fortune",
        (),
        "BSD-4-clause (fortune-mod, The Regents of the University of California); quotations by their authors",
    ),
)


def broad_dir() -> Path:
    """Where the broad corpus is installed: ``<cache_dir()>/corpus/broad-v<BROAD_VERSION>``."""
    return cache_dir() / "corpus" / f"broad-v{BROAD_VERSION}"


# --- reading a .deb without dpkg ------------------------------------------------------------------------------------


def _ar_members(blob: bytes, where: str) -> dict[str, bytes]:
    """The members of a Unix ``ar`` archive (the container of a ``.deb``)."""
    if not blob.startswith(b"!<arch>\n"):
        raise CorruptFileError(where, "is not a Debian package (no ar header)", "Delete it and download it again.")
    members: dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos : pos + 60]
        if header[58:60] != b"`\n":
            raise CorruptFileError(where, f"has a damaged ar header at byte {pos}", "Delete it and download it again.")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip() or 0)
        members[name] = blob[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def _data_tar(blob: bytes, where: str) -> tarfile.TarFile:
    members = _ar_members(blob, where)
    for name, data in members.items():
        if name.startswith("data.tar"):
            if name.endswith(".xz"):
                data = lzma.decompress(data)
            elif name.endswith(".gz"):
                data = gzip.decompress(data)
            elif name != "data.tar":
                raise CorruptFileError(
                    where, f"compresses its payload as {name}, which this reader does not know", "Use another .deb."
                )
            return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    raise CorruptFileError(where, "has no data.tar member", "Delete it and download it again.")


def _regular_files(tar: tarfile.TarFile, folder: str) -> dict[str, bytes]:
    """Regular files directly inside ``folder`` of the package (links and anything else skipped), by base name."""
    out: dict[str, bytes] = {}
    prefix = "./" + folder.strip("/") + "/"
    for info in tar.getmembers():
        name = info.name if info.name.startswith("./") else "./" + info.name
        if not info.isreg() or not name.startswith(prefix) or "/" in name[len(prefix) :]:
            continue
        if info.size > MAX_MEMBER_BYTES:
            raise CorruptFileError(
                name, f"is {info.size} bytes, over the {MAX_MEMBER_BYTES}-byte limit", "Check the .deb."
            )
        handle = tar.extractfile(info)
        if handle is not None:
            out[name[len(prefix) :]] = handle.read()
    return out


# --- parsing ----------------------------------------------------------------------------------------------------------

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_SOURCE_TAG = re.compile(r"^\[[^\]\n]{1,60}\]$")  # GCIDE's "[1913 Webster]" lines
_HYPHENATION = re.compile(r" ?\\[^\\\n]{1,80}\\")  # GCIDE's \A*back"\
_PRONUNCIATION = re.compile(r" ?\((?=[^()\n]*\[)[^()\n]{1,80}\)")  # GCIDE's ([.a]*b[a^]k")
_CROSS_REF = re.compile(r"\{([^{}]*)\}")  # dictd cross-references {word}
_OVERSTRIKE = re.compile(r".\x08")  # fortune files' underlining by backspace


def _dictd_offset(field: str) -> int:
    value = 0
    for char in field:
        value = value * 64 + _B64[char]
    return value


def dictd_articles(index: str, data: bytes) -> list[str]:
    """The articles of a dictd database in the order of the data file, each once (several headwords may share one
    article); the ``00-database-*`` records are left out."""
    spans: set[tuple[int, int]] = set()
    for line in index.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith(("00-database", "00database")):
            continue
        try:
            spans.add((_dictd_offset(parts[1]), _dictd_offset(parts[2])))
        except KeyError:  # not a base-64 offset: a malformed index line
            continue
    return [data[start : start + length].decode("utf-8", "replace") for start, length in sorted(spans)]


def clean_article(text: str) -> str:
    """A dictionary article as prose: markup of hyphenation and pronunciation dropped, ``{cross refs}`` unwrapped,
    source-tag lines dropped, each paragraph on one line."""
    text = _CROSS_REF.sub(r"\1", _PRONUNCIATION.sub("", _HYPHENATION.sub("", text)))
    paragraphs: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if _SOURCE_TAG.match(stripped):
            continue
        if not stripped:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(" ".join(p.split()) for p in paragraphs)


def fortune_quotes(text: str) -> list[str]:
    """The quotations of a fortune file (``%`` lines separate them), overstriking removed, line breaks kept."""
    text = _OVERSTRIKE.sub("", text.replace("\r\n", "\n"))
    quotes = (q.strip("\n") for q in re.split(r"(?m)^%\s*$", text))
    return [q for q in ("\n".join(line.rstrip() for line in q.splitlines()).strip() for q in quotes) if q]


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def package_documents(package: DebianPackage, deb: bytes) -> list[str]:
    """The documents of one package's ``.deb`` (not yet filtered by length or deduplicated), in a fixed order."""
    tar = _data_tar(deb, package.name)
    if package.kind == "dictd":
        files = _regular_files(tar, "usr/share/dictd")
        docs: list[str] = []
        for db in package.files:
            if f"{db}.index" not in files or f"{db}.dict.dz" not in files:
                raise CorruptFileError(
                    package.name, f"holds no dictd database {db!r}", "Check the package version against PACKAGES."
                )
            data = gzip.decompress(files[f"{db}.dict.dz"])
            docs.extend(clean_article(a) for a in dictd_articles(_decode(files[f"{db}.index"]), data))
        return docs
    files = _regular_files(tar, "usr/share/games/fortunes")
    names = sorted(n for n in files if "." not in n and n not in package.files)
    return [q for n in names for q in fortune_quotes(_decode(files[n]))]


# --- installing -------------------------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _from_folder(package: DebianPackage, debs: Path) -> bytes | None:
    """The pinned ``.deb`` among the files of ``debs`` (matched by SHA-256, whatever its name), else None."""
    for path in sorted(debs.glob("*.deb")):
        if not path.is_file() or path.stat().st_size != package.size:
            continue
        blob = path.read_bytes()
        if _sha256(blob) == package.sha256:
            return blob
    return None


def _download(package: DebianPackage, mirror: str) -> bytes:
    url = f"{mirror.rstrip('/')}/{package.filename}"
    logger.info("Downloading %s %s from %s", package.name, package.version, url)
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            blob = response.read(MAX_DEB_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as err:  # ValueError: a URL urllib cannot open
        raise UnavailableError(
            f"Could not download {url} ({err}). Offline: fetch {package.name}={package.version} on a machine with "
            f"Debian access (`apt-get download {package.name}={package.version}`) and pass the folder with --debs."
        ) from err
    return blob


def fetch_package(package: DebianPackage, *, debs: Path | None = None, mirror: str = DEBIAN_MIRROR) -> bytes:
    """The ``.deb`` of ``package``, from ``debs`` (a folder) or the mirror; refused unless its SHA-256 matches."""
    if debs is not None:
        blob = _from_folder(package, debs)
        if blob is not None:
            return blob
        logger.info("%s %s is not in %s; trying the mirror", package.name, package.version, debs)
    blob = _download(package, mirror)
    digest = _sha256(blob)
    if digest != package.sha256:
        raise CorruptFileError(
            f"{mirror.rstrip('/')}/{package.filename}",
            f"has SHA-256 {digest}, not the pinned {package.sha256}",
            "The mirror serves another build: fetch the pinned version (snapshot.debian.org) and pass it with --debs.",
        )
    return blob


def build_documents(
    packages: Sequence[DebianPackage] = PACKAGES,
    *,
    debs: Path | None = None,
    mirror: str = DEBIAN_MIRROR,
    min_chars: int = MIN_DOC_CHARS,
) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """Documents of every package (``{"text", "source"}``, at least ``min_chars`` characters, each text once, in
    package order) and a provenance record per package."""
    seen: set[str] = set()
    records: list[dict[str, str]] = []
    provenance: list[dict[str, Any]] = []
    for package in packages:
        deb = fetch_package(package, debs=debs, mirror=mirror)
        raw = package_documents(package, deb)
        kept = 0
        for text in raw:
            if len(text) >= min_chars and text not in seen:
                seen.add(text)
                records.append({"text": text, "source": package.name})
                kept += 1
        provenance.append(asdict(package) | {"n_parsed": len(raw), "n_documents": kept})
        logger.info("%s: %d documents of %d parsed", package.name, kept, len(raw))
    return records, provenance


def check_mirror(mirror: str) -> str:
    """``mirror`` if it is an http(s) or file URL with a host or path; else :class:`InputError` naming ``--mirror``
    (before anything is fetched: ``urlopen`` would raise a bare ``ValueError`` on ``garbage``)."""
    parsed = urllib.parse.urlparse(mirror)
    if parsed.scheme not in ("http", "https", "file") or not (parsed.netloc or parsed.path.strip("/")):
        raise InputError(
            f"--mirror {mirror!r} is not a mirror URL; give one such as {DEBIAN_MIRROR!r} (http, https or file)."
        )
    return mirror


def install_broad_corpus(
    target: str | Path | None = None,
    *,
    debs: str | Path | None = None,
    mirror: str = DEBIAN_MIRROR,
    packages: Sequence[DebianPackage] = PACKAGES,
    min_chars: int = MIN_DOC_CHARS,
) -> dict[str, Any]:
    """Fetch the pinned packages, parse them and write ``documents.jsonl`` and ``manifest.json`` into ``target``
    (default :func:`broad_dir`). Returns the manifest. Writing is atomic: an interrupted install leaves no corpus."""
    check_mirror(mirror)
    target = Path(target) if target is not None else broad_dir()
    debs_path = Path(debs).expanduser() if debs is not None else None
    if debs_path is not None and not debs_path.is_dir():
        raise MissingFileError(f"--debs {debs_path} is not a folder; give the folder holding the .deb files.")
    records, provenance = build_documents(packages, debs=debs_path, mirror=mirror, min_chars=min_chars)
    target.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    manifest = {
        "version": BROAD_VERSION,
        "n_documents": len(records),
        "n_characters": sum(len(r["text"]) for r in records),
        "min_chars": min_chars,
        "documents_sha256": _sha256(body),
        "packages": provenance,
        "mirror": mirror,
    }
    tmp = target / f"documents.jsonl.tmp{os.getpid()}"
    tmp.write_bytes(body)
    tmp.replace(target / "documents.jsonl")
    tmp = target / f"manifest.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    tmp.replace(target / "manifest.json")
    _records.cache_clear()
    return manifest


# --- reading ----------------------------------------------------------------------------------------------------------


def read_manifest(folder: str | Path | None = None) -> dict[str, Any]:
    """The manifest of the installed corpus; an :class:`InputError` naming the setup option when it is missing."""
    folder = Path(folder) if folder is not None else broad_dir()
    path = folder / "manifest.json"
    if not path.is_file() or not (folder / "documents.jsonl").is_file():
        raise MissingFileError(f"The 'broad' corpus is not installed (no {path}). Install it with: {SETUP_HINT}.")
    fix = f"Reinstall: {SETUP_HINT}."
    try:
        manifest = check_json_shape(json.loads(path.read_text(encoding="utf-8")), path, fix, keys=MANIFEST_KEYS)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptFileError(path, f"is not valid JSON ({err})", fix) from err
    packages = manifest["packages"]
    if not isinstance(packages, list) or not all(
        isinstance(p, dict) and {"name", "n_documents"} <= p.keys() for p in packages
    ):
        raise CorruptFileError(path, "its 'packages' is not a list of package records", fix)
    return manifest


def broad_records(folder: str | Path | None = None) -> tuple[tuple[str, str], ...]:
    """``(text, source package)`` of every document of the installed corpus (default :func:`broad_dir`), in the
    install's order; the file's SHA-256 is checked against the manifest (once per process and folder)."""
    return _records(str(Path(folder) if folder is not None else broad_dir()))


@lru_cache(maxsize=2)
def _records(folder: str) -> tuple[tuple[str, str], ...]:
    folder_path = Path(folder)
    manifest = read_manifest(folder_path)
    path = folder_path / "documents.jsonl"
    body = path.read_bytes()
    if _sha256(body) != manifest.get("documents_sha256"):
        raise CorruptFileError(path, "does not match the SHA-256 in manifest.json", f"Reinstall: {SETUP_HINT}.")
    out = []
    for number, line in enumerate(body.decode("utf-8").splitlines(), 1):
        try:  # the SHA-256 matched, so a bad line means the manifest was rewritten to match an edited file
            record = json.loads(line)
            out.append((str(record["text"]), str(record["source"])))
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptFileError(
                f"{path}:{number}", f"is not a {{'text', 'source'}} record ({err})", f"Reinstall: {SETUP_HINT}."
            ) from err
    return tuple(out)


def broad_documents(folder: str | Path | None = None) -> tuple[str, ...]:
    """The texts of the installed broad corpus (what ``read_documents("broad")`` returns)."""
    return tuple(text for text, _ in broad_records(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tl_query_lens.broad_corpus", description="Install or describe the 'broad' corpus."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="fetch the pinned Debian packages and build the corpus")
    install.add_argument("--debs", help="a folder of .deb files to use before the mirror (matched by SHA-256)")
    install.add_argument("--mirror", default=DEBIAN_MIRROR, help="Debian mirror (default %(default)s)")
    install.add_argument("--target", help="install folder (default: <cache>/corpus/broad-v1)")
    sub.add_parser("info", help="print the installed corpus' manifest summary")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "install":
            manifest = install_broad_corpus(args.target, debs=args.debs, mirror=args.mirror)
        else:
            manifest = read_manifest()
    except Exception as err:  # the command line's one boundary: a user's input or machine -> one line, exit 2
        mapped = boundary_error(err)
        if mapped is None:
            raise
        print(f"error: {mapped}", file=sys.stderr)
        return 2
    per_package = ", ".join(f"{p['name']} {p['n_documents']}" for p in manifest["packages"])
    print(
        f"broad corpus v{manifest['version']}: {manifest['n_documents']} documents, "
        f"{manifest['n_characters']} characters ({per_package})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
