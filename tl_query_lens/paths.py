"""Names and writes on disk that cannot lose or misplace work.

- :func:`plain_name`: a name a user gives that becomes one path component (an SAE id, a release id, a run name):
  no separators, no ``.``/``..``, no control characters, not too long.
- :func:`result_name` / :func:`result_names`: folder names made from labels (dictionary specs, keys of a result
  dict), one-to-one: a label that is not already a plain name keeps a readable part and gets a short hash of the
  whole label, so ``x/a-b`` and ``y/a_b`` never share a folder; names that would still collide (also on
  case-insensitive file systems) are refused.
- :func:`atomic_write`: write a file through a temporary file in the same folder and a rename; on any failure or
  interruption the temporary file is removed and the old file (if any) is untouched; ``OSError`` becomes a
  :class:`~tl_query_lens.errors.WriteError` that names the path and the fix.
- :func:`folder_lock`: one writer per output folder; a second concurrent run is refused with the first one's pid.
- :func:`relative_command`: a command line as a record stores it, with no path of the machine it ran on.
- :func:`check_owned`: a command writes only into a new or empty folder, or one a ``tlql`` run wrote before (it
  holds the lock file, :data:`LOCK_NAME`, which every locked run leaves there as its marker).
- :func:`clear_temporaries`: remove what an interrupted :func:`atomic_write` left, only among the entries a command
  lists as its own (never every hidden ``*.tmp`` below a folder).

This module imports nothing heavy (the command line uses it before torch is loaded).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tl_query_lens.errors import InputError, LockedError, write_error, write_error_of

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the folder lock degrades to none
    fcntl = None  # type: ignore[assignment]

MAX_NAME_BYTES = 200  # file systems allow 255 bytes a component; leave room for suffixes such as ".safetensors"
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def plain_name(name: Any, what: str = "name") -> str:
    """``name`` if it is usable as one path component, else :class:`InputError` naming ``what`` and the fix.

    Refused: empty names, ``.`` and ``..``, path separators (``/``, ``\\``), control characters (NUL, newlines) and
    names longer than :data:`MAX_NAME_BYTES` bytes in UTF-8.
    """
    text = str(name)
    problem = None
    if not text.strip():
        problem = "is empty"
    elif text in (".", "..") or text.startswith(".."):
        problem = "would leave its folder ('.' and '..' are not names)"
    elif "/" in text or "\\" in text or (os.altsep and os.altsep in text):
        problem = "contains a path separator"
    elif _CONTROL.search(text):
        problem = "contains a control character"
    elif len(text.encode("utf-8")) > MAX_NAME_BYTES:
        problem = f"is longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise InputError(
            f"{what} {text[:60]!r}{'…' if len(text) > 60 else ''} {problem}; it names one file or folder, so use "
            "a plain name such as 'blocks.12.hook_resid_post' or 'run-1'."
        )
    return text


def result_name(label: Any) -> str:
    """A folder name for ``label``: the label itself when it is a plain, safe name (letters, digits, ``._-``, at
    most 100 characters), else a readable version of it plus ``~`` and 10 hex digits of its SHA-256. Different
    labels give different names (``~`` never occurs in a label kept as it is)."""
    text = str(label)
    if _SAFE.fullmatch(text) and len(text) <= 100:
        return text
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:60] or "_"
    return f"{readable}~{hashlib.sha256(text.encode('utf-8')).hexdigest()[:10]}"


def result_names(labels: Iterable[Any], what: str = "labels", name: Callable[[Any], str] = result_name) -> list[str]:
    """:func:`result_name` of each label; labels that would share a folder (identical names, or names equal up to
    case, which collide on macOS and Windows) are refused with an :class:`InputError` naming them."""
    labels = list(labels)
    duplicates = sorted({str(label) for label in labels if labels.count(label) > 1})
    if duplicates:
        raise InputError(f"{what} {duplicates} given more than once; give each once.")
    names = [name(label) for label in labels]
    seen: dict[str, Any] = {}
    for label, folder in zip(labels, names):
        other = seen.setdefault(folder.casefold(), label)
        if other is not label:
            raise InputError(
                f"{what} {other!r} and {label!r} would be saved in the same folder {folder!r}; give distinct labels."
            )
    return names


@contextlib.contextmanager
def _replaced_on_success(path: Path) -> Iterator[str]:
    """A temporary file name beside ``path``; when the block succeeds the file replaces ``path`` (mode 0644), when it
    raises the file is removed and ``path`` keeps its old content. ``OSError`` becomes :func:`write_error`'s."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp")
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be read by others
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise write_error(path, err) from err
    except Exception as err:  # a writer's own error wrapping an OSError (safetensors on a full disk)
        if type(err).__name__ == "SafetensorError":
            raise write_error_of(path, err) from err
        raise
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` (readable by others).

    On any exception (``OSError`` such as a full disk, ``KeyboardInterrupt``, a signal turned into an exception)
    the temporary file is removed and ``path`` keeps its old content. ``OSError`` is raised as
    :class:`~tl_query_lens.errors.WriteError` naming ``path`` and the fix.
    """
    with _replaced_on_success(Path(path)) as tmp, open(tmp, mode, encoding=None if "b" in mode else encoding) as handle:
        yield handle
        handle.flush()


def atomic_write_with(path: str | Path, write: Callable[[str], None]) -> Path:
    """Atomically produce ``path`` with ``write(tmp_path)`` (for writers that take a file name, e.g. safetensors'
    ``save_file``); same guarantees as :func:`atomic_write`."""
    with _replaced_on_success(Path(path)) as tmp:
        write(tmp)
    return Path(path)


def inside(folder: str | Path, relative: Any, what: str) -> Path:
    """``folder / relative`` if that stays inside ``folder`` (no absolute path, no ``..``, no link out), else
    :class:`InputError` (a result file edited or crafted to point elsewhere)."""
    base = Path(folder).resolve()
    if not isinstance(relative, str) or not relative or os.path.isabs(relative):
        raise InputError(f"{what}: {relative!r} is not a folder inside {folder}; the file was edited or is corrupt.")
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise InputError(
            f"{what}: {relative!r} points outside {folder}; refusing to follow it (the file was edited or crafted)."
        )
    return Path(folder) / relative


LOCK_NAME = ".tlql.lock"


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str = "--out", *, name: str = LOCK_NAME) -> Iterator[Path]:
    """Hold an exclusive lock on ``folder`` (created) while the block runs.

    Every shared write takes one: ``--out`` (the command line), the user cache's training folder of a release
    (``saes train``) and a readout SAE's cache entry (``readout fit``, ``name`` = one lock file per id).

    A second process that asks for the same folder is refused at once with a :class:`LockedError` naming the pid
    of the first. The lock is an ``flock`` on ``folder/.tlql.lock``: the operating system releases it when the
    holder exits, even after ``kill -9``, so a stale lock file never blocks a later run. Where ``fcntl`` does not
    exist (Windows) the block runs unlocked.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / name, "a+", encoding="utf-8")  # noqa: SIM115  (held for the whole block)
    except OSError as err:
        raise write_error(folder, err) from err
    try:
        if fcntl is None:  # pragma: no cover - Windows
            yield folder
            return
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise LockedError(
                f"{what} {folder} is being written by {holder}; wait for it to finish or choose another folder."
            ) from None
        try:  # the holder's pid, for the message of a second writer; a full disk here is named, not a traceback
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
        except OSError as err:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            raise write_error(folder / name, err) from err
        try:
            yield folder
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        with contextlib.suppress(OSError):  # closing flushes nothing left: the pid was flushed or its error raised
            handle.close()


def check_owned(folder: str | Path, what: str = "--out") -> None:
    """Refuse an existing, non-empty ``folder`` that no ``tlql`` run wrote (it lacks :data:`LOCK_NAME`), before any
    work, naming it: a run never overwrites or cleans up a user's own folder (e.g. their ``index.html``)."""
    folder = Path(folder).expanduser()
    try:
        if not folder.is_dir() or (folder / LOCK_NAME).exists():
            return
        entries = sorted(p.name for p in folder.iterdir())
    except OSError as err:
        raise InputError(f"{what} {folder}: {err.strerror or err}; choose another folder.") from None
    if entries:
        shown = ", ".join(entries[:3]) + (", …" if len(entries) > 3 else "")
        raise InputError(
            f"{what} {folder} already holds files that no tlql run wrote ({shown}); nothing was written there. "
            "Choose a new or empty folder."
        )


def clear_temporaries(folder: str | Path, owned: Iterable[str]) -> int:
    """Remove the temporary files an interrupted :func:`atomic_write` left (``.<name>.<random>.tmp``), only where the
    command's own entries are: beside each owned top-level file and anywhere inside each owned sub-folder (relative
    names in ``owned``). Returns how many were removed."""
    folder = Path(folder)
    removed = 0
    for name in owned:
        entry = folder / name
        candidates = entry.rglob(".*.tmp") if entry.is_dir() else folder.glob(f".{glob_escape(name[:100])}.*.tmp")
        for tmp in candidates:
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed += 1
    return removed


@contextlib.contextmanager
def output_folder(out: str | Path, what: str = "--out") -> Iterator[Path]:
    """Check ``out`` (a folder that can be created and written, with plain component names, new or empty or written
    by tlql before: :func:`check_owned`, so nothing of a user's own is overwritten) and hold its lock while the body
    runs, so two runs never write one folder; a folder this run created and left empty (the run stopped on a user
    error) is removed again."""
    folder = check_folder(out, what)
    check_owned(folder, what)
    created = not folder.exists()
    try:
        with folder_lock(folder, what):
            yield folder
    finally:
        if created and folder.is_dir() and {p.name for p in folder.iterdir()} <= {LOCK_NAME}:
            with contextlib.suppress(OSError):
                (folder / LOCK_NAME).unlink(missing_ok=True)
                folder.rmdir()


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def check_folder(path: str | Path, what: str = "--out") -> Path:
    """A folder that can be created and written: not a file, each component a name the file system takes, under
    an existing ancestor this user can write (checked before any work, so nothing computed is lost to it)."""
    folder = Path(path).expanduser()
    for part in folder.parts:
        if len(part.encode("utf-8")) > 255:
            raise InputError(
                f"{what}: the name {part[:40]!r}… is {len(part.encode('utf-8'))} bytes; file systems allow 255. "
                "Choose a shorter name."
            )
    if "\x00" in str(folder):
        raise InputError(f"{what} {str(folder)!r} contains a NUL character; choose another path.")
    try:
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{what} {folder} is a file, not a folder; pass a folder path (it is created if missing).")
        ancestor = folder
        while not ancestor.exists() and not ancestor.is_symlink():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise InputError(f"{what} {folder} cannot be created: {ancestor} is not a folder. Choose another path.")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise InputError(
                f"{what} {folder} cannot be written: {ancestor} is read-only for this user. Choose a writable folder."
            )
        top = ancestor.resolve().parts[:2]
    except OSError as err:
        raise InputError(f"{what} {folder}: {err.strerror or err}; choose another path.") from None
    if top in (("/", "proc"), ("/", "sys")):
        raise InputError(f"{what} {folder} is under /{top[1]}, which holds no files of ours; choose another folder.")
    return folder


def shipped_root() -> Path:
    """Folder of the releases shipped inside the package (``tl_query_lens/release``)."""
    return Path(__file__).resolve().parent / "release"


def shipped_ids(folder: Path) -> list[str]:
    """The dictionary ids of a shipped release folder (its subfolders holding a ``cfg.json``; none if it is absent)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "cfg.json").is_file())


def _repository_root() -> Path:
    """The folder that holds the package's source tree (the repository root of a checkout)."""
    return Path(__file__).resolve().parent.parent


def relative_command(argv: Iterable[str], *, root: str | Path | None = None) -> str:
    """``argv`` as one shell-quoted line that names no path of this machine, for records kept in the repository.

    A Python interpreter (``sys.executable``, a virtual environment's ``bin/python``) becomes ``python`` and any
    other program in a ``bin`` folder its bare name (``torchrun``). A path inside ``root`` (default: the repository)
    becomes relative to it, as does one inside another checkout of it (from the first component that names a
    top-level folder of ``root``, such as ``benchmarks``). Any other absolute path becomes ``results/<its last
    component>``, the folder a reader's own run would use (``--out /data/runs/x`` is recorded as
    ``--out results/x``). Both forms ``--flag PATH`` and ``--flag=PATH`` are rewritten.
    """
    base = Path(root).resolve() if root is not None else _repository_root()
    executable = Path(sys.executable).name

    def one(arg: str) -> str:
        if "=" in arg and arg.startswith("-"):
            flag, _, value = arg.partition("=")
            return f"{flag}={one(value)}"
        if not arg.startswith("/"):
            return arg
        path = Path(arg)
        if path.name == executable or re.fullmatch(r"python[0-9.]*", path.name):
            return "python"
        if path.parent.name == "bin":  # a console script of an environment (torchrun, tlql)
            return path.name
        with contextlib.suppress(ValueError):
            return path.resolve().relative_to(base).as_posix() or "."
        tops = {p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")}
        parts = path.parts
        for i, part in enumerate(parts[1:], 1):  # another checkout of the repository: from its top-level folder on
            if part in tops and part != "results":
                return Path(*parts[i:]).as_posix()
        return f"results/{path.name}" if path.name else "results"

    return shlex.join(one(a) for a in argv)
