"""Writes that a crash or a full disk cannot leave half done."""

from __future__ import annotations

import os
from pathlib import Path

# What a run keeps of its data preparation, copied into its bundles: for text, and for images.
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSING_FILE = "preprocessing.json"


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Write a hidden temporary file beside ``path``, flush it to disk, then rename it over ``path``:
    readers see the old contents or the new, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    fsync_file(tmp)
    tmp.replace(path)
