"""What a run's data held: the sha256 of each data file it reads (of a folder: of every file in it),
kept in RUN/data.json. A spec names its data by path, and a study tells a trial's data apart by
file name; a file edited in place keeps both, so a resume, a study's reuse of a finished trial and
compare read the digests to notice it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from pathlib import Path

from tfcompile.spec.schema import DATA_PATHS, Spec

DATA_FILE = "data.json"  # RUN/data.json: {"data.FIELD: NAME": sha256 hex digest}
CHUNK = 1 << 20


def data_digests(spec: Spec) -> dict[str, str]:
    """``data.FIELD: NAME`` -> the sha256 of NAME, for each file or folder the spec's data fields
    name (one per side of a translation's ``{lang}``) that is there: a missing one is the task's to
    report, or, for a finished run, one that can no longer be compared. Keyed by name, not place,
    so that a study moved elsewhere keeps its trials."""
    if spec.data is None:
        return {}
    digests = {}
    for field in DATA_PATHS:
        path = getattr(spec.data, field)
        for file in spec.task.data_files(path) if path is not None else []:
            if (digest := path_digest(file)) is not None:
                digests[f"data.{field}: {file.name}"] = digest
    return digests


def changed_data(recorded: dict[str, str], spec: Spec) -> list[str]:
    """The data files of ``spec`` whose bytes differ from those ``recorded`` (a run's data.json)
    says the run read, each with both digests' first 12 digits."""
    now = data_digests(spec)
    return [
        f"{key} (sha256 {now[key][:12]}..., the run's {recorded[key][:12]}...)"
        for key in sorted(recorded.keys() & now.keys())
        if now[key] != recorded[key]
    ]


def recorded_digests(run_dir: Path) -> dict[str, str]:
    """RUN/data.json's digests; empty where it has none (a run from before tfcompile kept them) or
    the file is damaged (nothing can then be compared)."""
    try:
        found = json.loads((run_dir / DATA_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(v, str)}


def path_digest(path: Path) -> str | None:
    """The sha256 of a regular file's bytes, or of a folder's files (each one's path in it and
    digest; names starting with a dot skipped, as the image reader skips them); None for anything
    else (a FIFO is never opened) or what cannot be read."""
    try:
        info = path.stat()
    except OSError:
        return None
    if stat.S_ISREG(info.st_mode):
        return _file_digest(path, info.st_size, info.st_mtime_ns)
    if not stat.S_ISDIR(info.st_mode):
        return None
    folder = hashlib.sha256()
    for file in sorted(_files_in(path)):
        digest = path_digest(path / file)
        if digest is not None:
            folder.update(f"{file.as_posix()}\0{digest}\n".encode(errors="surrogateescape"))
    return folder.hexdigest()


def _files_in(folder: Path) -> list[Path]:
    """The regular files in ``folder`` and its subfolders (links to folders not followed), as paths
    relative to it, hidden ones left out."""
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = [f for f in folders if not f.startswith(".")]
        found += [(Path(root) / f).relative_to(folder) for f in files if not f.startswith(".")]
    return found


@functools.lru_cache(maxsize=4096)
def _file_digest(path: Path, size: int, mtime_ns: int) -> str | None:
    """A file's sha256, read once per (size, mtime): a sweep asks again for each trial."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()
