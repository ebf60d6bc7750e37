"""A bundle folder read as untrusted input.

A bundle comes from elsewhere, so nothing in it is believed before it is checked: the manifest is
a bounded regular file validated as a whole (tfcompile.manifest); every other file the
runtime opens must be listed in the manifest's ``files`` under a plain name inside the folder, is
opened without following symlinks, must be a regular file, and is read once, its sha256 checked
against the manifest before anything parses the bytes that were checked.

This module imports no torch: the runtime and the exporter share it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tfcompile.manifest import MANIFEST, MAX_MANIFEST_BYTES, ImageInfo, Manifest, parse_manifest
from tfcompile.runtime.errors import BundleError

PREPROCESSING_FILE = "preprocessing.json"  # format 1 kept an image model's preprocessing here


def sha256_file(path: Path) -> str:
    with _open_regular(path) as f:
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (see _open_regular)."""
    with _open_regular(path) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise BundleError(f"{path} is larger than the {limit:,} bytes a bundle allows it")
    return data


@contextlib.contextmanager
def _open_regular(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading if it is a regular file: a symlink is refused (O_NOFOLLOW), and
    a FIFO or a device neither blocks the open (O_NONBLOCK) nor gets read."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleError(f"{path.parent} is incomplete: {path.name} is missing") from None
    except OSError as e:  # ELOOP for a symlink
        raise BundleError(f"cannot open {path}: {e.strerror} (a bundle holds plain files only)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder opens too, and fdopen refuses it
        os.close(fd)
        raise BundleError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        yield f


class BundleFiles:
    """The checked manifest of a bundle folder, and its listed files, each read on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if not folder.is_dir():
            raise BundleError(f"{folder} is not a bundle folder")
        if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
            raise BundleError(f"{folder} is not a tfcompile bundle: it has no {MANIFEST}")
        data = read_regular_file(folder / MANIFEST, MAX_MANIFEST_BYTES)
        self.manifest, self.format_version = parse_manifest(data, str(folder / MANIFEST))
        for name in self.manifest.files:
            self._check(name, sha256_file(folder / name))
        if self.manifest.image is None and PREPROCESSING_FILE in self.manifest.files:
            self.manifest = self.manifest.model_copy(update={"image": self._legacy_image()})

    def read(self, name: str) -> bytes:
        """A listed file's bytes, checked against the manifest's sha256 before they are returned."""
        if name not in self.manifest.files:
            raise BundleError(f"{self.folder}: {name} is not listed in {MANIFEST}'s files")
        data = read_regular_file(self.folder / name)
        self._check(name, hashlib.sha256(data).hexdigest())
        return data

    def text(self, name: str) -> str:
        """A listed file read as UTF-8 text (see ``read``)."""
        try:
            return self.read(name).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BundleError(
                f"{self.folder / name} is not UTF-8 text ({e.reason} at byte {e.start})"
            ) from None

    def _check(self, name: str, digest: str) -> None:
        if digest != self.manifest.files[name]:
            raise BundleError(
                f"{self.folder / name} was changed after export (its sha256 differs from the "
                f"manifest's); export the bundle again"
            )

    def _legacy_image(self) -> ImageInfo:
        try:
            p = json.loads(self.read(PREPROCESSING_FILE))
            return ImageInfo(
                size=p["image_size"],
                channels=p["channels"],
                channel_order="L" if p["channels"] == 1 else "RGB",
                mean=p["mean"],
                std=p["std"],
            )
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise BundleError(
                f"{self.folder / PREPROCESSING_FILE} is not a valid preprocessing record: {e}"
            ) from None


def read_manifest(bundle: Path) -> Manifest:
    """A bundle's checked manifest (every listed file's sha256 verified)."""
    return BundleFiles(bundle).manifest


__all__ = ["MANIFEST", "BundleFiles", "Manifest", "read_manifest", "read_regular_file", "sha256_file"]
