"""What a run's data held: the sha256 of each data file it reads (of a folder: of the files its task
reads there), kept in RUN/data.json. A spec names its data by path, and a study tells a trial's data
apart by file name; a file edited in place keeps both, so a resume, a study's reuse of a finished
trial and compare read the digests to notice it."""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

from tfcompile.data.corpus import GZIP_MAGIC, DataError
from tfcompile.files import read_small_text
from tfcompile.spec.schema import DATA_PATHS, Spec
from tfcompile.tasks.task import task_of

DATA_FILE = "data.json"  # RUN/data.json: {"data.FIELD[ (SIDE)]: NAME": sha256 hex digest}
CHUNK = 1 << 20


def data_digests(spec: Spec) -> dict[str, str]:
    """``data.FIELD: NAME`` (``data.FIELD (SIDE): NAME``, one per side of a translation's
    ``{lang}``) -> the sha256 of NAME's contents, for each file or folder the spec's data fields
    name that is there: a missing one is the task's to report, or, for a finished run, one that
    can no longer be compared. Keyed by name, not place, so that a study moved elsewhere keeps its
    trials."""
    if spec.data is None:
        return {}
    folder_files = task_of(spec).folder_files
    digests = {}
    for field in DATA_PATHS:
        path = getattr(spec.data, field)
        for side, file in (spec.task.data_files(path) if path is not None else {}).items():
            if (digest := path_digest(file, folder_files)) is not None:
                digests[f"data.{field}{f' ({side})' if side else ''}: {file.name}"] = digest
    return digests


def changed_data(recorded: dict[str, str], spec: Spec) -> list[str]:
    """The data files of ``spec`` whose contents differ from those ``recorded`` (a run's data.json)
    says the run read, each with both digests' first 12 digits (none read where none is recorded)."""
    if not recorded:
        return []
    now = data_digests(spec)
    return [
        f"{key} (sha256 {now[key][:12]}..., the run's {recorded[key][:12]}...)"
        for key in sorted(recorded.keys() & now.keys())
        if now[key] != recorded[key]
    ]


def recorded_digests(run_dir: Path) -> dict[str, str]:
    """RUN/data.json's digests; empty where there is none (a run from before tfcompile kept them).
    A damaged one is a DataError: what the run read could no longer be told, and a resume would
    record the data as it is now in its place."""
    path = run_dir / DATA_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        found = json.loads(read_small_text(path))
    except (OSError, UnicodeDecodeError, ValueError):
        found = None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise DataError(
            f"{path} is damaged (not the JSON object of digests tfcompile writes): whether the run's "
            f"data changed cannot be told; restore it, or remove it to record the data as it is now"
        )
    return found


def path_digest(path: Path, folder_files: Callable[[Path], list[Path]]) -> str | None:
    """The sha256 of a regular file's contents (gunzipped: ``_digest``), or of a folder's
    ``folder_files`` (the files the task reads there: each one's path in the folder and digest);
    None for anything else (a FIFO is never opened) or what cannot be read."""
    try:
        if stat.S_ISREG(path.stat().st_mode):
            return _file_digest(path)
        if not path.is_dir():
            return None
        folder = hashlib.sha256()
        for file in folder_files(path):
            if stat.S_ISREG(file.stat().st_mode):
                folder.update(
                    f"{file.relative_to(path).as_posix()}\0{_file_digest(file)}\n".encode(errors="replace")
                )
        return folder.hexdigest()
    except OSError:
        return None


def _file_digest(path: Path) -> str:
    info = path.stat()
    return _digest(path, info.st_size, info.st_mtime_ns, info.st_ino)


@functools.lru_cache(maxsize=1 << 16)
def _digest(path: Path, size: int, mtime_ns: int, inode: int) -> str:
    """A file's sha256, read once per (size, mtime, inode): a sweep asks again for each trial. Of
    gzip data (by its bytes, as the readers tell it), the sha256 of what it holds: compressed again,
    its header's time differs, not its text. An OSError is raised, not cached."""
    digest = hashlib.sha256()
    with path.open("rb") as raw:
        gzipped = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        raw.seek(0)
        with gzip.open(raw) if gzipped else contextlib.nullcontext(raw) as f:
            try:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
            except (EOFError, zlib.error) as e:  # a damaged gzip file: the reader names it
                raise OSError(str(e)) from None
    return digest.hexdigest()
