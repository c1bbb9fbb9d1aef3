"""A lossless PNG writer for decoded images: what a reader that hands over arrays is stored as
where bytes are needed (``stoker convert``, ``stoker unpack``)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["PNG_MAGIC", "encode_png"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


_PNG_COLOUR = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type (grey, RGB, RGBA)


def encode_png(img: np.ndarray, level: int = 0) -> bytes:
    """A lossless PNG of a uint8 image: ``(H, W)`` or ``(H, W, 1)`` grey, ``(H, W, 3)`` RGB or
    ``(H, W, 4)`` RGBA; filter 0 on every row and deflate ``level`` (0: stored, about the cost
    of copying the pixels twice; 1..9 smaller and several times slower). ``decode`` gives
    the same pixels back (as RGB)."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in _PNG_COLOUR:
        raise ValueError(
            f"encode_png takes uint8 (H, W) or (H, W, 1|3|4) pixels, got {arr.dtype} {arr.shape}"
        )
    height, width, channels = arr.shape
    rows = np.empty((height, 1 + width * channels), dtype=np.uint8)
    rows[:, 0] = 0  # filter type 0 (none) on every row
    rows[:, 1:].reshape(height, width, channels)[:] = arr
    ihdr = struct.pack(">IIBBBBB", width, height, 8, _PNG_COLOUR[channels], 0, 0, 0)
    return b"".join(
        (
            PNG_MAGIC,
            _png_chunk(b"IHDR", ihdr),
            _png_chunk(b"IDAT", zlib.compress(rows.data, level)),
            _png_chunk(b"IEND", b""),
        )
    )
