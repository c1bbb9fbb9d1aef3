"""``decode(..., max_pixels=)``: every format's header size is checked before any pixel is
decoded; the header parsers agree with Pillow; bad limits are refused."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

import stoker.codecs
from stoker import ImageDecodeError, ImageTooLargeError
from stoker.codecs import DEFAULT_MAX_PIXELS, decode, image_size
from stoker.codecs.headers import bmp_size, riff_webp_size, tiff_size


def encode(arr, fmt, **kw):
    b = io.BytesIO()
    Image.fromarray(arr).save(b, fmt, **kw)
    return b.getvalue()


def img(h=24, w=40, mode="RGB"):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    return arr if mode == "RGB" else np.dstack([arr, arr[:, :, :1]])


FORMATS = [
    ("JPEG", {}),
    ("PNG", {}),
    ("WEBP", {}),
    ("WEBP", {"lossless": True}),
    ("BMP", {}),
    ("TIFF", {}),
    ("TIFF", {"compression": "tiff_lzw"}),
    ("GIF", {}),
]


@pytest.mark.parametrize(("fmt", "kw"), FORMATS)
def test_every_format_is_checked_against_its_header(fmt, kw):
    buf = encode(img(), fmt, **kw)
    n = 24 * 40
    with pytest.raises(ImageTooLargeError, match=r"40x24 \(width x height\) = 960 pixels"):
        decode(buf, max_pixels=n - 1)
    assert decode(buf, max_pixels=n).shape == (24, 40, 3)
    assert decode(buf, max_pixels=None).shape == (24, 40, 3)
    assert decode(buf).shape == (24, 40, 3)


def test_cmyk_jpeg_is_checked_before_pillow_decodes_it():
    buf = encode(img(), "JPEG")
    cmyk = io.BytesIO()
    Image.open(io.BytesIO(buf)).convert("CMYK").save(cmyk, "JPEG")
    with pytest.raises(ImageTooLargeError, match="JPEG header declares 40x24"):
        decode(cmyk.getvalue(), max_pixels=100)
    assert decode(cmyk.getvalue(), max_pixels=960).shape == (24, 40, 3)


def test_the_limit_comes_before_a_min_size_function():
    buf = encode(img(), "JPEG")
    called = []
    with pytest.raises(ImageTooLargeError):
        decode(buf, min_size=lambda hw: called.append(hw), max_pixels=10)
    assert called == []


def _gif_declaring(w, h):
    data = bytearray(encode(img(8, 8), "GIF"))
    data[6:10] = struct.pack("<HH", w, h)
    return bytes(data)


@pytest.mark.parametrize(("w", "h"), [(9_600, 9_600), (20_000, 20_000)])
def test_pillow_read_header_over_the_limit(w, h):
    # 9600^2 is over Pillow's limit (a warning there, silenced here); 20000^2 over twice it
    # (Pillow's own DecompressionBombError): both are refused as ImageTooLargeError
    with pytest.raises(ImageTooLargeError, match=f"{w * h:,} pixels"):
        decode(_gif_declaring(w, h))


def test_image_too_large_is_an_image_decode_error():
    assert issubclass(ImageTooLargeError, ImageDecodeError)
    assert DEFAULT_MAX_PIXELS == 89_478_485


@pytest.mark.parametrize("bad", [0, -5])
def test_bad_limits_are_refused(bad):
    with pytest.raises(ValueError, match="max_pixels"):
        decode(encode(img(), "PNG"), max_pixels=bad)


@pytest.mark.parametrize("bad", [1.5, "100", True])
def test_limits_of_the_wrong_type_are_refused(bad):
    with pytest.raises(TypeError, match="max_pixels"):
        decode(encode(img(), "PNG"), max_pixels=bad)


def test_numpy_integer_limit():
    assert decode(encode(img(), "PNG"), max_pixels=np.int64(960)).shape == (24, 40, 3)


@pytest.mark.parametrize(("h", "w"), [(1, 1), (3, 17), (100, 37), (513, 1023), (16383, 2)])
def test_webp_and_bmp_header_parsers_agree_with_pillow(h, w):
    arr = np.zeros((h, w, 3), np.uint8)
    for kw in ({}, {"lossless": True}):
        assert riff_webp_size(memoryview(encode(arr, "WEBP", **kw))) == (h, w)
    assert riff_webp_size(memoryview(encode(np.dstack([arr, arr[:, :, :1]]), "WEBP"))) == (h, w)
    assert bmp_size(memoryview(encode(arr, "BMP"))) == (h, w)
    for kw in ({}, {"compression": "tiff_deflate"}, {"big_tiff": True}):
        buf = encode(arr, "TIFF", **kw)
        assert tiff_size(memoryview(buf)) == ((h, w) if not kw.get("big_tiff") else None)
        assert decode(buf, max_pixels=h * w).shape == (h, w, 3)
    assert image_size(encode(arr, "BMP")) == (h, w)


def test_header_parsers_give_up_on_other_bytes():
    assert riff_webp_size(memoryview(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(20))) is None
    assert bmp_size(memoryview(b"BM" + bytes(10))) is None
    assert tiff_size(memoryview(b"II*\x00\xff\xff\x00\x00")) is None  # IFD past the end


def test_radiance_hdr_header_is_read_too():
    cv2 = pytest.importorskip("cv2")
    ok, buf = cv2.imencode(".hdr", np.ones((24, 40, 3), np.float32))
    assert ok
    with pytest.raises(ImageTooLargeError, match="HDR header declares 40x24"):
        decode(buf.tobytes(), max_pixels=100)
    assert decode(buf.tobytes(), max_pixels=960).shape == (24, 40, 3)


def test_an_unread_header_is_checked_on_the_decoded_size(monkeypatch):
    # a format whose header neither decode nor Pillow reads: the decoded size is checked, so
    # an image over the limit is still never returned
    monkeypatch.setattr(stoker.codecs, "_check_other_header", lambda mv, max_pixels: None)
    with pytest.raises(ImageTooLargeError, match="the decoded image is 40x24"):
        decode(encode(img(), "BMP"), max_pixels=100)
