"""``decode_mask``: a PNG label map read as its stored values (palette indices, not colours)."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from stoker._core.errors import ImageDecodeError, ImageTooLargeError
from stoker.codecs import decode_mask


def _palette_png(a: np.ndarray, bits: int = 8) -> bytes:
    im = Image.fromarray(a, mode="P")
    # a palette whose colours are not the indices: decoding colours would fail the test
    im.putpalette([(7 * i + 50) % 256 for i in range(768)])
    out = io.BytesIO()
    im.save(out, format="PNG", bits=bits)
    return out.getvalue()


def _grey_png(a: np.ndarray, depth: int) -> bytes:
    """A grey PNG of 1/2/4 bits per pixel, written by hand (Pillow and OpenCV write 8/16)."""
    h, w = a.shape
    rows = b""
    for r in a:
        bits = "".join(format(int(v), f"0{depth}b") for v in r)
        bits += "0" * (-len(bits) % 8)
        rows += b"\0" + int(bits, 2).to_bytes(len(bits) // 8, "big")

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    ihdr = struct.pack(">IIBBBBB", w, h, depth, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_a_palette_png_gives_its_indices(bits) -> None:
    a = np.random.default_rng(bits).integers(0, 1 << bits, (13, 17), dtype=np.uint8)
    got = decode_mask(_palette_png(a, bits))
    assert got.dtype == np.uint8 and got.shape == (13, 17)
    np.testing.assert_array_equal(got, a)


def test_grey_pngs_give_their_values() -> None:
    rng = np.random.default_rng(0)
    g8 = rng.integers(0, 256, (9, 11), dtype=np.uint8)
    g16 = rng.integers(0, 65536, (9, 11), dtype=np.uint16)
    for a in (g8, g16):
        ok, buf = cv2.imencode(".png", a)
        got = decode_mask(buf.tobytes())
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)
    for depth in (1, 2, 4):
        a = rng.integers(0, 1 << depth, (6, 9), dtype=np.uint8)
        np.testing.assert_array_equal(decode_mask(_grey_png(a, depth)), a)


@pytest.mark.parametrize(
    ("buf", "words"),
    [
        (cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes(), "got RGB"),
        (cv2.imencode(".png", np.zeros((4, 4, 4), np.uint8))[1].tobytes(), "got RGBA"),
        (cv2.imencode(".jpg", np.zeros((4, 4), np.uint8))[1].tobytes(), "must be a PNG"),
        (b"", "0 bytes"),
        (_palette_png(np.zeros((4, 4), np.uint8))[:40], "cannot decode"),
    ],
)
def test_what_is_not_a_label_map_is_refused(buf, words) -> None:
    with pytest.raises(ImageDecodeError, match=words):
        decode_mask(buf)


def test_max_pixels_is_checked_on_the_header() -> None:
    buf = _palette_png(np.zeros((40, 50), np.uint8))
    with pytest.raises(ImageTooLargeError, match="50x40"):
        decode_mask(buf, max_pixels=1999)
    assert decode_mask(buf, max_pixels=2000).shape == (40, 50)
    assert decode_mask(buf, max_pixels=None).shape == (40, 50)
