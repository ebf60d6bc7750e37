"""A bundle folder read as untrusted input.

A bundle comes from elsewhere, so nothing in it is believed before it is checked: the manifest is
a bounded regular file validated as a whole (tfcompile.manifest); every other file the
runtime opens must be listed in the manifest's ``files`` under a plain name inside the folder, is
opened without following symlinks, must be a regular file of bounded size (the listed files
together too, checked before any is hashed), and is read once, its sha256 checked against the
manifest before anything parses the bytes that were checked.

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

from pydantic import ValidationError

from tfcompile.manifest import MANIFEST, MAX_MANIFEST_BYTES, ImageInfo, Manifest, parse_manifest
from tfcompile.runtime.errors import BundleError, InputError

PREPROCESSING_FILE = "preprocessing.json"  # format 1 kept an image model's preprocessing here
MAX_FILE_BYTES = (1 << 31) - 1  # protobuf's limit: the largest graph onnxruntime reads as bytes
MAX_BUNDLE_BYTES = 1 << 33  # the listed files together: four graphs of the largest size


def sha256_file(path: Path) -> str:
    with _open_regular(path) as f:
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _size(path: Path) -> int:
    """The size of ``path``, a regular file (see _open_regular), as the file system says."""
    with _open_regular(path) as f:
        return os.fstat(f.fileno()).st_size


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (see _open_regular). No
    more is asked of read() than the file holds, one past it at most: read(n) allocates n bytes
    first, so asking for the limit (2 GiB) failed under a memory limit whatever the file's size."""
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read() if limit is None else f.read(min(size, limit) + 1)
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
        try:
            if not folder.is_dir():
                raise BundleError(f"{folder} is not a bundle folder")
            if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
                raise BundleError(f"{folder} is not a tfcompile bundle: it has no {MANIFEST}")
        except OSError as e:  # a name too long, a folder this process may not search
            raise BundleError(f"cannot read the bundle folder {folder}: {e.strerror}") from None
        data = read_regular_file(folder / MANIFEST, MAX_MANIFEST_BYTES)
        self.manifest, self.format_version = parse_manifest(data, str(folder / MANIFEST))
        # Sizes first: hashing a sparse file of a terabyte, which takes no disk, would take an hour.
        sizes = {name: _size(folder / name) for name in self.manifest.files}
        for name, size in sizes.items():
            if size > MAX_FILE_BYTES:
                raise BundleError(
                    f"{folder / name} holds {size:,} bytes, more than the {MAX_FILE_BYTES:,} a bundle's "
                    f"file may hold"
                )
        if sum(sizes.values()) > MAX_BUNDLE_BYTES:
            raise BundleError(
                f"{folder}: the files its {MANIFEST} lists hold {sum(sizes.values()):,} bytes, more than "
                f"the {MAX_BUNDLE_BYTES:,} a bundle may hold"
            )
        for name in self.manifest.files:
            self._check(name, sha256_file(folder / name))
        if self.manifest.image is None and PREPROCESSING_FILE in self.manifest.files:
            self.manifest = self.manifest.model_copy(update={"image": self._legacy_image()})

    def read(self, name: str) -> bytes:
        """A listed file's bytes, checked against the manifest's sha256 before they are returned."""
        if name not in self.manifest.files:
            raise BundleError(f"{self.folder}: {name} is not listed in {MANIFEST}'s files")
        data = read_regular_file(self.folder / name, MAX_FILE_BYTES)
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
        """Format 1's preprocessing.json as the image section, checked as a manifest's is."""
        try:
            p = json.loads(self.read(PREPROCESSING_FILE))
            return ImageInfo(
                size=p["image_size"],
                channels=p["channels"],
                channel_order="L" if p["channels"] == 1 else "RGB",
                mean=p["mean"],
                std=p["std"],
            )
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            reason = first["msg"].removeprefix("Value error, ")
            raise BundleError(
                f"{self.folder / PREPROCESSING_FILE} is not a valid preprocessing record: "
                f"{field + ': ' if field else ''}{reason}"
            ) from None
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise BundleError(
                f"{self.folder / PREPROCESSING_FILE} is not a valid preprocessing record: {e!r}"
            ) from None


def bundle_files(bundle: str | os.PathLike[str] | BundleFiles) -> BundleFiles:
    """A bundle given as its folder's path (or as files already checked) -> its checked files."""
    if isinstance(bundle, BundleFiles):
        return bundle
    if not isinstance(bundle, str | os.PathLike) or not isinstance(os.fspath(bundle), str):
        raise InputError(f"a bundle is given as its folder's path, got {type(bundle).__name__}")
    return BundleFiles(Path(bundle))


def read_manifest(bundle: Path) -> Manifest:
    """A bundle's checked manifest (every listed file's sha256 verified)."""
    return BundleFiles(bundle).manifest


__all__ = [
    "MANIFEST",
    "BundleFiles",
    "Manifest",
    "bundle_files",
    "read_manifest",
    "read_regular_file",
    "sha256_file",
]
