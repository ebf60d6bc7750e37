"""Writes that a crash or a full disk cannot leave half done."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# What a run keeps of its data preparation: for text, and for images.
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSING_FILE = "preprocessing.json"


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries, so that a rename into it survives a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a hidden temporary file beside ``path`` (``.NAME.*.tmp``, its own name, so that two
    writers never share one), flush it to disk, then rename it over ``path``: readers see the old
    contents or the new, never a mix. On any failure the temporary file is removed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
