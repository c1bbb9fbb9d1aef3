"""Decoding matches Pillow, always gives 3-channel uint8 RGB, and fails with a clear error."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from stoker import ImageDecodeError
from stoker.codecs import decode, decoder, image_size, sniff


def smooth(h=48, w=64):
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (h + w)], axis=-1)
    return img.astype(np.uint8)


def encode(arr, fmt, **kw):
    b = io.BytesIO()
    Image.fromarray(arr).save(b, fmt, **kw)
    return b.getvalue()


def pillow(buf):
    return np.asarray(Image.open(io.BytesIO(buf)).convert("RGB"))


def test_jpeg_matches_pillow_within_rounding():
    buf = encode(smooth(), "JPEG", quality=92)
    got = decode(buf)
    ref = pillow(buf)
    assert got.shape == (48, 64, 3) and got.dtype == np.uint8 and got.flags.c_contiguous
    assert np.abs(got.astype(int) - ref).max() <= 2


def test_fast_mode_is_close():
    buf = encode(smooth(), "JPEG", quality=92)
    assert np.abs(decode(buf, fast=True).astype(int) - pillow(buf)).mean() < 2


def test_png_exact_and_rgb_order():
    arr = smooth()
    arr[0, 0] = (255, 0, 0)
    got = decode(encode(arr, "PNG"))
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_grayscale_becomes_three_channels(fmt):
    gray = smooth()[:, :, 0]
    got = decode(encode(gray, fmt))
    assert got.shape == (48, 64, 3)
    assert np.array_equal(got[:, :, 0], got[:, :, 1]) and np.array_equal(got[:, :, 1], got[:, :, 2])
    assert np.abs(got[:, :, 0].astype(int) - gray).max() <= 3


def test_cmyk_jpeg_goes_through_pillow():
    b = io.BytesIO()
    Image.fromarray(smooth()).convert("CMYK").save(b, "JPEG", quality=95)
    buf = b.getvalue()
    got = decode(buf)
    assert got.shape == (48, 64, 3)
    assert np.abs(got.astype(int) - pillow(buf)).max() <= 1


def test_rgba_png_drops_alpha_and_other_formats_decode():
    rgba = np.dstack([smooth(), np.full((48, 64), 7, np.uint8)])
    np.testing.assert_array_equal(decode(encode(rgba, "PNG")), smooth())
    np.testing.assert_array_equal(decode(encode(smooth(), "BMP")), smooth())
    assert decode(encode(smooth(), "GIF")).shape == (48, 64, 3)


def test_min_size_decodes_at_reduced_scale_but_never_below():
    buf = encode(smooth(400, 320), "JPEG")
    assert decode(buf, min_size=(100, 80)).shape == (100, 80, 3)
    assert decode(buf, min_size=(101, 80)).shape == (200, 160, 3)  # only 1/2, 1/4, 1/8
    assert decode(buf, min_size=(201, 80)).shape == (400, 320, 3)  # 3/4 would be slower
    assert decode(buf, min_size=(1, 1)).shape == (50, 40, 3)
    assert decode(buf).shape == (400, 320, 3)
    with pytest.raises(ValueError, match="min_size"):
        decode(buf, min_size=(-1, 2))


def test_min_size_may_be_a_function_of_the_stored_size():
    buf = encode(smooth(400, 320), "JPEG")
    seen = []

    def quarter(hw):
        seen.append(hw)
        return hw[0] // 4, hw[1] // 4

    assert decode(buf, min_size=quarter).shape == (100, 80, 3)
    assert seen == [(400, 320)]  # asked once, with the header's (h, w)
    assert decode(buf, min_size=lambda hw: None).shape == (400, 320, 3)
    png = encode(smooth(40, 32), "PNG")  # only JPEG scales on decode: a PNG is full size
    assert decode(png, min_size=lambda hw: (1, 1)).shape == (40, 32, 3)
    with pytest.raises(ValueError, match="min_size"):
        decode(buf, min_size=lambda hw: (-1, 2))


def test_out_buffer_is_filled():
    buf = encode(smooth(), "JPEG")
    out = np.zeros((48, 64, 3), np.uint8)
    res = decode(buf, out=out)
    assert res is out
    np.testing.assert_array_equal(out, decode(buf))
    png_out = np.zeros((48, 64, 3), np.uint8)
    assert decode(encode(smooth(), "PNG"), out=png_out) is png_out
    with pytest.raises(ValueError, match="shape"):
        decode(buf, out=np.zeros((10, 10, 3), np.uint8))


def test_image_size_from_header():
    assert image_size(encode(smooth(30, 50), "JPEG")) == (30, 50)
    assert image_size(encode(smooth(30, 50), "PNG")) == (30, 50)
    assert image_size(encode(smooth(30, 50), "BMP")) == (30, 50)
    assert sniff(encode(smooth(), "PNG")) == "png"


@pytest.mark.parametrize(
    "buf,match",
    [
        (b"", "empty"),
        (b"not an image at all", "unrecognised format"),
        (encode(smooth(), "JPEG")[:200], "JPEG"),
        (encode(smooth(), "PNG")[:60], "PNG"),
    ],
)
def test_bad_bytes_raise_image_decode_error(buf, match):
    with pytest.raises(ImageDecodeError, match=match):
        decode(buf)


def test_accepts_memoryview_and_uint8_array():
    buf = encode(smooth(), "PNG")
    np.testing.assert_array_equal(decode(memoryview(buf)), smooth())
    np.testing.assert_array_equal(decode(np.frombuffer(buf, np.uint8)), smooth())
    with pytest.raises(TypeError):
        decode(12)


def test_import_stoker_codecs_does_not_import_cv2():
    import subprocess
    import sys

    code = "import stoker, stoker.codecs, stoker.loader, stoker.pipeline, sys; print('cv2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _cmyk_jpeg():
    b = io.BytesIO()
    Image.fromarray(smooth()).convert("CMYK").save(b, "JPEG", quality=95)
    return b.getvalue()


def _outcome(fn, buf):
    """What ``fn(buf)`` gives: the array, or the error's type and message."""
    try:
        return fn(buf)
    except Exception as e:  # noqa: BLE001 - compared, not swallowed
        return (type(e), re.sub(r" at 0x[0-9a-f]+", "", str(e)))  # Pillow names its BytesIO


def _quarter(hw):
    return hw[0] // 4, hw[1] // 4


def _failing_hint(hw):
    raise KeyError("the hint's own error")


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"fast": True},
        {"min_size": (20, 30)},
        {"min_size": _quarter},
        {"min_size": lambda hw: None},
        {"min_size": _failing_hint},
        {"max_pixels": 1000},
        {"max_pixels": None},
    ],
    ids=["plain", "fast", "size", "hint", "no-hint", "bad-hint", "limit", "no-limit"],
)
def test_the_hot_loop_decoder_is_decode(kw):
    """``decoder()`` (what a loader worker calls per sample) gives what ``decode`` gives, the
    same pixels or the same error, for every kind of input, not only the common JPEG."""
    jpeg = encode(smooth(200, 160), "JPEG", quality=90)
    inputs = [
        jpeg,
        memoryview(jpeg),
        np.frombuffer(jpeg, np.uint8),
        encode(smooth()[:, :, 0], "JPEG"),  # grey
        _cmyk_jpeg(),
        encode(smooth(), "PNG"),
        encode(smooth(), "BMP"),
        jpeg[:300],  # cut short
        jpeg[:2] + b"\x00" * 40,  # a JPEG's magic, then nothing readable
        b"",
        b"not an image at all",
        # without a limit both sides would decode the declared 60000x60000 bomb in full:
        # 10.8 GB and half a minute for nothing the other cases do not show
        *_jpeg_variants(bomb=kw.get("max_pixels", 1) is not None),
    ]
    fast = decoder(**kw)
    for i, buf in enumerate(inputs):
        want, got = _outcome(lambda b: decode(b, **kw), buf), _outcome(fast, buf)
        if isinstance(want, tuple):
            assert got == want, i
        else:
            assert isinstance(got, np.ndarray), (i, got)
            np.testing.assert_array_equal(got, want, err_msg=str(i))


def _sof_at(buf: bytes) -> int:
    """The offset of a baseline or progressive JPEG's frame header marker."""
    return min(i for i in (buf.find(b"\xff\xc0"), buf.find(b"\xff\xc2")) if i > 0)


def _with_size(buf: bytes, h: int, w: int) -> bytes:
    """``buf`` with its frame header declaring ``h`` x ``w`` (the scan left as it is)."""
    i = _sof_at(buf)
    return buf[: i + 5] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + buf[i + 9 :]


def _jpeg_variants(*, bomb: bool = True) -> list[bytes]:
    """JPEGs whose frame header sits behind other segments, and some whose header the
    decoder's own marker walk must leave to simplejpeg; the last (with ``bomb``) declares
    60000x60000."""
    img = smooth(90, 70)
    plain = encode(img, "JPEG", quality=90)
    b = io.BytesIO()
    Image.fromarray(img).save(b, "JPEG", progressive=True, exif=b"Exif\0\0" + b"x" * 300)
    progressive = b.getvalue()
    b = io.BytesIO()
    Image.fromarray(img).save(b, "JPEG", icc_profile=b"i" * 5000, comment=b"a comment")
    icc = b.getvalue()
    dri = plain[:2] + b"\xff\xdd\x00\x04\x00\x10" + plain[2:]  # a restart interval
    rst = plain[:2] + b"\xff\xd0" + plain[2:]  # a marker without a length before the frame
    fill = plain[:2] + b"\xff" + plain[2:]  # a fill byte
    return [plain, progressive, icc, dri, rst, fill] + [_with_size(plain, 60000, 60000)] * bomb


def test_the_decoders_marker_walk_reads_what_simplejpeg_reads():
    """The hot-loop decoder reads the frame size by walking the segments before it, which
    costs less than simplejpeg's header read; where it answers, it answers what simplejpeg
    does, on these JPEGs and on thousands with a byte of the header area changed (the size
    the bomb guard checks is the size libjpeg-turbo decodes)."""
    import simplejpeg

    from stoker.codecs.jpeg import jpeg_frame as _jpeg_frame

    def header(buf):
        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(buf)
        except ValueError:
            return None
        return (h, w) if colorspace not in ("CMYK", "YCCK") else None

    answered = 0
    for buf in _jpeg_variants():
        got = _jpeg_frame(buf)
        assert got is None or got == header(buf)
        answered += got is not None
    assert answered >= 5  # plain, progressive, ICC and comment, restart interval, the bomb
    # a marker without a length (libjpeg-turbo then skips what follows up to the next 0xFF)
    # is left to simplejpeg, even where the next two bytes would read as a length
    plain = _jpeg_variants()[0]
    assert _jpeg_frame(plain[:2] + b"\xff\xd0\x00\x02" + plain[2:]) is None
    assert (
        _jpeg_frame(_cmyk_jpeg()) is None
        and _jpeg_frame(np.frombuffer(b"\xff\xd8", np.uint8)) is None
    )
    rng = np.random.default_rng(0)
    base = _jpeg_variants()[2]
    end = _sof_at(base) + 12
    for _ in range(3000):
        buf = bytearray(base)
        buf[int(rng.integers(2, end))] = int(rng.integers(0, 256))
        got = _jpeg_frame(bytes(buf))
        if got is not None:
            want = header(bytes(buf))
            assert want is None or got == want, bytes(buf[:end])


def test_the_hot_loop_decoder_asks_the_hint_per_size():
    """A hint that reduces some sizes and not others, over images of both kinds coming back
    in turn: each decode is what ``decode`` gives for that image (the answer kept for a size
    is never used for another)."""

    def half_if_large(hw):
        return (hw[0] // 2, hw[1] // 2) if hw[0] >= 200 else None

    bufs = [
        encode(smooth(h, w), "JPEG", quality=90) for h, w in [(200, 160), (100, 80), (240, 200)]
    ]
    fast = decoder(min_size=half_if_large)
    for buf in bufs * 3:
        want = decode(buf, min_size=half_if_large)
        got = fast(buf)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert fast(bufs[0]).shape == (100, 80, 3) and fast(bufs[1]).shape == (100, 80, 3)


def test_a_jpeg_only_pillow_decodes_leaves_no_reference_cycle():
    """simplejpeg refuses this JPEG (damaged scan data), Pillow decodes it. The refusal is
    kept for the error message; kept with its traceback it would hold the decoding frame in
    a cycle, and with it the callers' frames and any view of a mapped file in them."""
    import gc
    import weakref

    import simplejpeg

    rng = np.random.default_rng(0)
    good = encode(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "JPEG")
    sos = good.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(good[sos + 2 : sos + 4], "big")
    bad = bytearray(good)
    for i in range(start, start + 40):
        bad[i] ^= 0x55
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg(bytes(bad))
    decode(bytes(bad))  # first call: whatever is imported or cached on first use

    class Caller:
        pass

    def call() -> weakref.ref:  # a caller's local lives on only if its frame is in a cycle
        local = Caller()
        assert decode(bytes(bad)).shape == (32, 32, 3)
        return weakref.ref(local)

    gc.collect()
    gc.disable()  # counting on cycles collected would count other threads' (aiohttp's) too
    try:
        assert call()() is None
    finally:
        gc.enable()
