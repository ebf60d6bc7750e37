"""Image preprocessing, one implementation for training and serving (numpy and Pillow only: the
runtime imports it without torch, training without onnxruntime):
an image file or array -> floats in [0, 1], resized to the model's size (the shorter side, the
centre then cropped square; or both sides stretched, as transformers' ViTImageProcessor does), then
normalised per channel with the training split's statistics."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfcompile.errors import InputError, first_line
from tfcompile.paths import REGULAR_FILE, file_type

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# The formats of IMAGE_SUFFIXES, the only ones Pillow opens here: its other decoders (some 40,
# EPS's through Ghostscript) are no surface an uploaded image needs.
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF")

ImageLike = str | Path | bytes | np.ndarray  # a file, a file's bytes, or pixels
MAX_PIXELS = 1 << 26  # 67 megapixels: a larger image is refused before it is decoded (decompression bombs)
Resize = Literal["shorter_side", "stretch"]
RESIZES: tuple[Resize, ...] = ("shorter_side", "stretch")
# What preprocessing.json said before the resize was a choice: the shorter side.
DESCRIBED = {"shorter side, bilinear, then centre crop": "shorter_side"}


@dataclass(frozen=True)
class ImagePreprocessing:
    """What a ViT run saw: its image size and channels, the per-channel mean and standard
    deviation of its training images in [0, 1] (saved with the run and in the bundle), and how an
    image of another size is resized (see ``fit``)."""

    image_size: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: Resize = "shorter_side"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImagePreprocessing:
        resize = data.get("resize", "shorter_side")
        resize = DESCRIBED.get(resize, resize)
        if resize not in RESIZES:
            raise ValueError(f"preprocessing resize must be one of {RESIZES}, found {resize!r}")
        p = cls(
            int(data["image_size"]),
            int(data["channels"]),
            tuple(data["mean"]),
            tuple(data["std"]),
            cast(Resize, resize),
        )
        if len(p.mean) != p.channels or len(p.std) != p.channels or min(p.std) <= 0:
            raise ValueError(f"preprocessing needs {p.channels} means and positive stds, found {data}")
        return p

    def normalise(self, images: np.ndarray) -> np.ndarray:
        """(B, C, S, S) in [0, 1] -> (B, C, S, S) float32 with the training mean and std."""
        mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.std, dtype=np.float32)[:, None, None]
        return ((images - mean) / std).astype(np.float32)

    def pixel_values(self, images: Sequence[ImageLike]) -> np.ndarray:
        """Image paths or arrays -> the model's input (B, C, S, S) float32."""
        return self.normalise(np.stack([self.load(image) for image in images]))

    def load(self, image: ImageLike) -> np.ndarray:
        """One image path, encoded file or array -> (C, S, S) float32 in [0, 1], resized and cropped."""
        array = read_image(image, self.channels) if isinstance(image, str | Path | bytes) else image
        return fit(to_unit_range(array, self.channels), self.image_size, self.resize).transpose(2, 0, 1)


def read_image(source: str | Path | bytes, channels: int) -> np.ndarray:
    """An image file (or its bytes) -> (H, W, channels) uint8; colour converted to grey (1 channel)
    or RGB (3). A path that is no regular file (a FIFO would block the read), an image of more than
    MAX_PIXELS (refused before it is decoded), a file of none of the FORMATS and any file Pillow
    cannot decode are InputErrors."""
    if channels not in (1, 3):
        raise InputError(f"image files give 1 (grey) or 3 (RGB) channels; the model takes {channels}")
    name = "the uploaded image" if isinstance(source, bytes) else f"the image {source}"
    if not isinstance(source, bytes):
        found = file_type(source)
        if found == "nothing":
            raise InputError(f"cannot read {name}: there is no such file")
        if found != REGULAR_FILE:
            raise InputError(f"cannot read {name}: it is {found}, not a regular file")
    opened = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with Image.open(opened, formats=FORMATS) as image:
            if image.width * image.height > MAX_PIXELS:
                raise InputError(
                    f"{name} has {image.width} x {image.height} pixels, more than {MAX_PIXELS:,}"
                )
            array = np.asarray(_eight_bit(image, name).convert("L" if channels == 1 else "RGB"))
    except InputError:
        raise
    except Image.DecompressionBombError:  # Pillow's own limit, past 179 megapixels, checked first
        raise InputError(f"{name} has more than {MAX_PIXELS:,} pixels") from None
    except UnidentifiedImageError:  # its message shows a Python object, not the file
        raise InputError(
            f"cannot read {name}: it is not an image file of a format read here "
            "(PNG, JPEG, BMP, GIF, WebP or TIFF)"
        ) from None
    except Exception as e:  # Pillow's decoders fail on damaged data with many types: OSError,
        # ValueError, SyntaxError (a PNG chunk's length), EOFError, struct.error, ...
        raise InputError(f"cannot read {name}: {first_line(e, 200)}") from None
    return array[:, :, None] if channels == 1 else array


def _eight_bit(image: Image.Image, name: str) -> Image.Image:
    """16-bit grey samples as their high byte (v >> 8), as Pillow decodes 16-bit colour PNGs (its
    ``convert`` would clip them at 255); images of 32-bit samples are refused."""
    if image.mode.startswith("I;16"):
        return Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
    if image.mode in ("I", "F"):
        raise InputError(
            f"{name} has 32-bit {'integer' if image.mode == 'I' else 'float'} samples; "
            "give it 8 (or 16) bits per sample"
        )
    return image


def to_unit_range(array: Any, channels: int) -> np.ndarray:
    """(H, W) or (H, W, C) -> (H, W, C) float32 in [0, 1]: uint8 is divided by 255, floats are
    taken as already in [0, 1]."""
    array = np.asarray(array)
    if array.ndim == 2 and channels == 1:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] != channels or 0 in array.shape:
        grey = " or (height, width)" if channels == 1 else ""
        raise InputError(
            f"an image array must have shape (height, width, {channels}){grey}, got {array.shape}"
        )
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255
    if not np.issubdtype(array.dtype, np.floating):
        raise InputError(f"image arrays must be uint8 (0-255) or float (0-1), got {array.dtype}")
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
        raise InputError(
            f"a float image array must hold values in [0, 1], found [{array.min():g}, {array.max():g}]: "
            f"divide by its maximum (255 for 8-bit, 16 for scikit-learn's digits)"
        )
    return array.astype(np.float32)


def fit(image: np.ndarray, size: int, resize: Resize = "shorter_side") -> np.ndarray:
    """(H, W, C) float32 -> (size, size, C), each channel resized with Pillow's bilinear filter:
    ``shorter_side`` resizes the shorter side to ``size`` and crops the centre; ``stretch`` resizes
    height and width to ``size`` each (the aspect ratio is not kept). An image already size x size
    is returned unchanged."""
    H, W, C = image.shape
    if H == W == size:
        return image
    scale = size / min(H, W)
    h, w = (
        (max(size, round(H * scale)), max(size, round(W * scale)))
        if resize == "shorter_side"
        else (size, size)
    )
    top, left = (h - size) // 2, (w - size) // 2
    # Only the crop is computed: Pillow resizes the region of the image it comes from with the
    # whole resize's filter (within a float32 rounding of it), so a 1 x 10,000 image does not
    # become a 224 x 2,240,000 one first.
    box = (left * W / w, top * H / h, (left + size) * W / w, (top + size) * H / h)
    channels = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(image[:, :, c])).resize(
                (size, size), Image.Resampling.BILINEAR, box=box
            )
        )
        for c in range(C)
    ]
    return np.stack(channels, axis=-1)
