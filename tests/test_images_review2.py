"""Image files as the runtime and training read them: limits in tfcompile's words."""

from __future__ import annotations

import struct
import zlib

import pytest

from tfcompile.errors import InputError
from tfcompile.images import MAX_PIXELS, read_image


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` grey pixels and holds none."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [9_000, 20_000])  # 81 and 400 megapixels: ours, then Pillow's limit
def test_an_image_of_too_many_pixels_is_refused_in_one_message(side: int) -> None:
    with pytest.raises(InputError) as caught:
        read_image(png_header(side, side), 1)
    assert f"more than {MAX_PIXELS:,}" in str(caught.value)
    assert "DOS" not in str(caught.value)
