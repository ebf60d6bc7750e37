"""Labelled images: scikit-learn's bundled 8x8 digits (no download), or a folder with one
sub-folder of images per class. Images are read once, through the runtime's preprocessing, into
(N, C, S, S) float32 in [0, 1]: a data set is held in memory whole."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfcompile.data.corpus import DataError, require_file
from tfcompile.errors import DataWarning, InputError
from tfcompile.images import IMAGE_SUFFIXES, fit, read_image, to_unit_range
from tfcompile.memory import gigabytes, physical_memory, too_large
from tfcompile.paths import FOLDER, file_type


@dataclass(frozen=True)
class LabelledImages:
    images: np.ndarray  # (N, C, S, S) float32 in [0, 1]
    labels: list[str]  # N class names

    def subset(self, rows: np.ndarray) -> LabelledImages:
        return LabelledImages(self.images[rows], [self.labels[i] for i in rows])


def load_digits(channels: int, image_size: int) -> LabelledImages:
    """scikit-learn's 1,797 8x8 grey digits (values 0-16, scaled to [0, 1]), labelled "0".."9"."""
    if channels != 1:
        raise DataError(
            f"data.builtin digits: the digits are grey, so set model.channels: 1 (found {channels})"
        )
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError("data.builtin digits needs scikit-learn: pip install scikit-learn") from None
    digits = sklearn_digits()
    _require_memory(len(digits.images), channels, image_size, "data.builtin digits")
    images = np.stack([fit(to_unit_range(image / 16.0, 1), image_size) for image in digits.images])
    return LabelledImages(images.transpose(0, 3, 1, 2), [str(t) for t in digits.target])


def read_image_folder(path: Path, channels: int, image_size: int, field: str = "data.path") -> LabelledImages:
    """``path/CLASS/IMAGE``: every image file in each sub-folder, labelled with the folder's name
    (hidden folders and files left out). Images beside the class folders, a class folder without
    images and one whose name is not UTF-8 are DataErrors: an image or a class would be left out
    unseen, or a label could not be written into the run and its bundle."""
    found = file_type(path)
    if found != FOLDER:
        where = "no folder at " if found == "nothing" else f"{found}, not a folder, at "
        raise DataError(f"{field}: {where}{path} (images go in one sub-folder per class)")
    stray = _images_in(path)
    if stray:
        raise DataError(
            f"{field}: {path} holds images beside its class folders ({stray[0].name}, ...): move "
            f"each into the sub-folder of its class ({path}/CLASS/IMAGE)"
        )
    files, unread = [], []
    for folder in _class_folders(path):
        if not _is_utf8(folder.name):
            raise DataError(
                f"{field}: the class folder {folder.name!r} in {path} has a name that is not UTF-8, "
                f"and a class's label is its folder's name: rename the folder"
            )
        members = _images_in(folder)
        if not members:
            raise DataError(
                f"{field}: {path} holds no images in class sub-folders for {folder.name!r}: add "
                f"them to {folder} (files with the suffixes {', '.join(IMAGE_SUFFIXES)}; its own "
                f"sub-folders are not read), or remove it"
            )
        files += [(folder.name, file) for file in members]
        read = set(members)
        unread += [f for f in folder.iterdir() if not f.name.startswith(".") and f not in read]
    if unread:
        shown = ", ".join(f"{f.parent.name}/{f.name}" for f in unread[:3]) + (
            ", ..." if len(unread) > 3 else ""
        )
        warnings.warn(
            f"{field}: {len(unread)} entries of {path}'s class folders are not read ({shown}): an "
            f"image's suffix is one of {', '.join(IMAGE_SUFFIXES)}, and a class folder's own folders "
            f"are not looked into",
            DataWarning,
            stacklevel=2,
        )
    _require_memory(len(files), channels, image_size, field)
    images, labels = [], []
    for label, file in files:
        require_file(file, field)  # a FIFO named like an image would block the read
        try:
            image = fit(to_unit_range(read_image(file, channels), channels), image_size)
        except InputError as e:
            raise DataError(f"{field}: {e}") from None
        images.append(image.transpose(2, 0, 1))
        labels.append(label)
    if not images:
        raise DataError(
            f"{field}: {path} holds no images in class sub-folders ({path}/CLASS/IMAGE, "
            f"with suffixes {', '.join(IMAGE_SUFFIXES)})"
        )
    return LabelledImages(np.stack(images), labels)


def image_files(path: Path) -> list[Path]:
    """The images an image folder's classes are read from: each class folder's, in order."""
    return [file for folder in _class_folders(path) for file in _images_in(folder)]


def _class_folders(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_in(folder: Path) -> list[Path]:
    """The image files (by suffix) in ``folder``, sorted; hidden ones, such as macOS's ._NAME.png
    (metadata, not an image), left out."""
    return sorted(
        f
        for f in folder.iterdir()
        if f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith(".") and not f.is_dir()
    )


def _is_utf8(name: str) -> bool:
    """Whether a file name was UTF-8 (Python holds other bytes as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _require_memory(count: int, channels: int, image_size: int, field: str) -> None:
    """Images are held in memory whole, as float32: refuse a size that cannot fit."""
    needed = count * channels * image_size**2 * 4
    if too_large(needed, physical_memory()):
        raise DataError(
            f"{field}: {count:,} images of {channels} x {image_size} x {image_size} take "
            f"{gigabytes(needed)} in memory, more than this machine's {gigabytes(physical_memory())}: "
            f"lower model.image_size"
        )


def stratified_split(labels: list[str], fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """-> (kept rows, held-out rows): ``fraction`` of each class, drawn with a fixed seed, so that
    the held-out split keeps the class balance and does not move with the training seed."""
    rng = np.random.default_rng(seed)
    names = np.asarray(labels)
    held = [
        rng.permutation(rows)[: round(len(rows) * fraction)]
        for rows in (np.flatnonzero(names == name) for name in sorted(set(labels)))
    ]
    held_rows = np.sort(np.concatenate([np.zeros(0, dtype=np.int64), *held]))  # no rows: none held
    return np.setdiff1d(np.arange(len(labels)), held_rows), held_rows
