"""check_image: every image is checked, normalised by the documented policy, or rejected
with a reason (faults.md B1 #1, #3-#10)."""

from __future__ import annotations

import io
import resource
import struct
import time
import zlib

import cv2
import numpy as np
import pytest
from packhelp import image_bytes
from PIL import Image, ImageOps

from stoker.codecs import decode
from stoker.pack.images import MAX_JPEG_SCANS, Reject, check_image, sniff_format


def reject_reason(data: bytes, **kw) -> str:
    with pytest.raises(Reject) as e:
        check_image(data, **kw)
    return e.value.reason


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


def test_plain_jpeg_is_stored_as_is():
    data = image_bytes((40, 30))
    got = check_image(data)
    assert got.passthrough and got.payload == data
    assert (got.height, got.width, got.source_format) == (30, 40, "JPEG")


def test_zero_bytes_is_empty():  # B1 #1
    assert reject_reason(b"") == "empty"


def test_unknown_content_is_not_an_image():
    assert reject_reason(b"hello, this is text named .jpg") == "not_an_image"


def test_png_named_jpeg_is_sniffed_and_kept():  # B1 #3
    data = image_bytes((24, 20), fmt="PNG")
    assert sniff_format(data) == "PNG"
    got = check_image(data)
    assert got.source_format == "PNG" and got.passthrough
    assert decode(got.payload).shape == (20, 24, 3)


def test_cmyk_jpeg_becomes_rgb_like_pillow():  # B1 #4
    rgb = Image.open(io.BytesIO(image_bytes((32, 32), fmt="PNG", noise=0))).convert("RGB")
    buf = io.BytesIO()
    rgb.convert("CMYK").save(buf, "JPEG", quality=95)
    got = check_image(buf.getvalue())
    assert not got.passthrough  # CMYK is never stored: every decoder would differ
    out = decode(got.payload)
    ref = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), dtype=np.int16)
    assert out.shape == (32, 32, 3)
    assert np.abs(out.astype(np.int16) - ref).mean() < 6


@pytest.mark.parametrize(
    ("mode", "check"),
    [
        ("L", "gray"),
        ("P", "rgb"),
        ("RGBA", "rgb"),
        ("LA", "gray"),
        ("1", "gray"),
    ],
)
def test_modes_normalised_to_8bit(mode, check):  # B1 #5
    data = image_bytes((20, 16), fmt="PNG", mode=mode)
    got = check_image(data)
    out = decode(got.payload)
    assert out.shape == (16, 20, 3) and out.dtype == np.uint8
    if check == "gray":
        assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])
    assert sniff_format(got.payload) == "PNG"  # lossless source stays lossless


def test_alpha_is_composited_on_white():  # B1 #5: the alpha policy
    arr = np.zeros((4, 4, 4), np.uint8)
    arr[..., :3] = (10, 20, 30)
    arr[:2, :, 3] = 0  # transparent top half
    arr[2:, :, 3] = 255
    buf = io.BytesIO()
    Image.fromarray(arr, "RGBA").save(buf, "PNG")
    out = decode(check_image(buf.getvalue()).payload)
    assert (out[:2] == 255).all()
    assert (out[2:] == (10, 20, 30)).all()


def test_palette_transparency_is_composited_on_white():
    im = Image.new("P", (4, 4), 1)
    im.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    im.putpixel((0, 0), 0)
    buf = io.BytesIO()
    im.save(buf, "PNG", transparency=0)
    out = decode(check_image(buf.getvalue()).payload)
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[1, 1]) == (200, 10, 10)


def test_16bit_gray_and_rgb_keep_the_high_byte():  # B1 #5: 16 -> 8 bit
    g = np.array([[0, 255, 256, 65535]], np.uint16)
    ok, buf = cv2.imencode(".png", g)
    out = decode(check_image(buf.tobytes()).payload)
    assert out[0, :, 0].tolist() == [0, 0, 1, 255]
    rgb = np.zeros((1, 2, 3), np.uint16)
    rgb[0, 0] = (65535, 32768, 0)  # BGR for cv2
    ok, buf = cv2.imencode(".png", rgb)
    got = check_image(buf.tobytes())
    assert not got.passthrough  # a 16-bit PNG is never stored as is
    assert decode(got.payload)[0, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("orientation", [6, 8, 3])
def test_exif_orientation_applied_and_backends_agree(orientation):  # B1 #6
    src = Image.open(io.BytesIO(image_bytes((40, 20), fmt="PNG", noise=0)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    src.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    got = check_image(buf.getvalue())
    assert not got.passthrough and got.rotated  # counted in the manifest's pack.exif_rotated
    a = decode(got.payload)  # libjpeg-turbo, which never rotates
    b = cv2.imdecode(np.frombuffer(got.payload, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
    ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))).convert("RGB"))
    expect = (40, 20, 3) if orientation in (6, 8) else (20, 40, 3)
    assert a.shape == b.shape == ref.shape == expect
    assert np.abs(a.astype(int) - ref).mean() < 6


def test_truncated_jpeg_and_png_are_rejected():  # B1 #7
    jpg = image_bytes((64, 64))
    assert reject_reason(jpg[: len(jpg) // 2]) == "truncated"
    png = image_bytes((64, 64), fmt="PNG")
    assert reject_reason(png[: len(png) // 2]) == "truncated"


@pytest.mark.parametrize("chunk", [b"IDAT", b"IEND"])  # Pillow itself checks IHDR's
def test_png_with_a_bad_chunk_crc_is_corrupt(chunk):
    """Pillow checks no CRC of the image data; a PNG stored as is keeps its CRCs, which libpng
    checks, so a bad one is rejected (reliability F-01, B1 png-bad-crc)."""
    data = bytearray(image_bytes((16, 16), fmt="PNG"))
    assert check_image(bytes(data)).passthrough
    at = data.index(chunk)
    length = int.from_bytes(data[at - 4 : at], "big")
    data[at + 4 + length] ^= 0xFF  # the chunk's CRC
    with pytest.raises(Reject) as e:
        check_image(bytes(data))
    assert e.value.reason == "corrupt" and chunk.decode() in e.value.detail


def test_corrupted_entropy_data_never_crashes():  # B1 #8
    data = image_bytes((64, 64), quality=90)
    sos = data.index(b"\xff\xda")
    outcomes = set()
    for seed in range(50):
        rng = np.random.default_rng(seed)
        bad = bytearray(data)
        for pos in rng.integers(sos + 12, len(data) - 2, 16):
            bad[pos] ^= int(rng.integers(1, 256))
        t0 = time.perf_counter()
        try:
            check_image(bytes(bad))
            outcomes.add("ok")
        except Reject as r:
            assert r.reason in {"corrupt", "truncated", "undecodable"}, r
            outcomes.add(r.reason)
        assert time.perf_counter() - t0 < 2
    assert outcomes & {"corrupt", "truncated"}  # libjpeg's warnings are caught, not ignored


def test_bomb_rejected_from_the_header_without_allocating():  # B1 #9
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # 10000 x 10000 is above max_pixels but below Pillow's own hard limit: our check decides
    assert reject_reason(png_header_only(10_000, 10_000)) == "bomb"
    assert reject_reason(png_header_only(30_000, 30_000)) == "bomb"
    jpeg = bytearray(image_bytes((16, 16)))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 30_000, 30_000)
    assert reject_reason(bytes(jpeg)) == "bomb"
    assert reject_reason(image_bytes((64, 64)), max_pixels=64 * 63) == "bomb"
    check_image(image_bytes((64, 64)), max_pixels=64 * 64)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 50 * 1024


def test_huge_text_chunk_rejected():  # B1 #10
    png = image_bytes((8, 8), fmt="PNG")
    ztxt = png_chunk(b"zTXt", b"comment\x00\x00" + zlib.compress(b"a" * (8 << 20)))
    bad = png[:33] + ztxt + png[33:]
    t0 = time.perf_counter()
    assert reject_reason(bad) == "oversized_chunk"
    assert time.perf_counter() - t0 < 2


def test_too_many_jpeg_scans_rejected():  # B1 #10
    data = image_bytes((32, 32), progressive=True)
    last = data.rindex(b"\xff\xda")
    scan = data[last:-2]
    bad = data[:-2] + scan * (MAX_JPEG_SCANS + 10) + b"\xff\xd9"
    assert reject_reason(bad) == "too_many_scans"
    assert check_image(data).passthrough  # a normal progressive JPEG is fine


def test_resize_and_quality_reencode():
    data = image_bytes((80, 40))
    got = check_image(data, resize=20)
    assert not got.passthrough and (got.height, got.width) == (20, 40)
    assert decode(got.payload).shape == (20, 40, 3)
    small = check_image(data, quality=30)
    assert not small.passthrough and len(small.payload) < len(data)
    png = check_image(image_bytes((30, 30), fmt="PNG"), quality=90)
    assert sniff_format(png.payload) == "JPEG"  # an explicit quality means JPEG for all


@pytest.mark.parametrize(("fmt", "mode"), [("PPM", "RGB"), ("PPM", "L"), ("PPM", "1")])
def test_pnm_is_sniffed_and_reencoded_lossless(fmt, mode):
    data = image_bytes((20, 16), fmt=fmt, mode=mode)
    assert sniff_format(data) == "PNM"
    got = check_image(data)
    assert got.source_format == "PNM" and not got.passthrough
    assert sniff_format(got.payload) == "PNG"  # a lossless source stays lossless
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(decode(got.payload), ref)


def test_pnm_magic_needs_a_digit_1_to_6_and_whitespace():
    assert [sniff_format(m) for m in (b"P6\n", b"P1 ", b"P5\t", b"P3\r")] == ["PNM"] * 4
    assert [sniff_format(m) for m in (b"P7\n", b"P0 ", b"P6x", b"P6", b"P", b"")] == [None] * 6
