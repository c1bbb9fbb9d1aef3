"""Caffe's ``Datum`` message, parsed from its protobuf wire bytes without protobuf or Caffe, and
the image the loader gets from it.

``caffe.proto``::

    message Datum {
      optional int32 channels = 1;  optional int32 height = 2;  optional int32 width = 3;
      optional bytes data = 4;      // raw uint8 pixels, CHW, BGR (as cv::imread gives them)
      optional int32 label = 5;
      repeated float float_data = 6;
      optional bool encoded = 7 [default = false];  // data holds an encoded image file
    }

An encoded Datum gives its ``data`` untouched (a converted set keeps the same bytes). A raw one
gives its pixels as a decoded array (``Reader.encoded`` is per sample for a Datum set): uint8
``(H, W, 3)`` RGB, Caffe's BGR planes interleaved in reverse, grey repeated over the three
channels and BGRA's alpha left out: the pixels ``stoker.codecs.decode`` gives of the PNG such a
Datum was once read as, with no PNG written or decoded on the way. Where bytes are needed
(``stoker convert``, ``stoker unpack``) :func:`encode_png` writes that lossless PNG of the raw
pixels: RGB, grey, or RGBA.

Nothing is trusted: wire lengths are checked by :mod:`stoker.formats.protowire` before any
slice is taken, and ``channels * height * width`` must equal the bytes of ``data`` (computed
on Python ints) before the pixels are touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.codecs import encode_png as png_of
from stoker.formats.protowire import I32, I64, LEN, VARINT, WireError, read_varint

__all__ = [
    "Datum",
    "check_datum",
    "datum_fields",
    "datum_image",
    "datum_pixels",
    "encode_png",
    "image_kind",
    "parse_datum",
]

_NAMES = {1: "channels", 2: "height", 3: "width", 4: "data", 5: "label", 7: "encoded"}
_INT32 = (1, 2, 3, 5)
_CHANNELS = (1, 3, 4)  # grey, BGR, BGRA


@dataclass(frozen=True)
class Datum:
    channels: int
    height: int
    width: int
    data: memoryview | None  # None: the field is absent
    label: int
    encoded: bool
    float_count: int  # how many float_data values (Caffe's feature vectors)
    data_offset: int  # where data's field starts in the value (for messages)


def _int32(number: int, v: int, at: int) -> int:
    if v >= 1 << 63:  # a negative int32 is written as a 10-byte two's complement varint
        v -= 1 << 64
    if not -(1 << 31) <= v < 1 << 31:
        raise WireError(at, f"field {number} ({_NAMES[number]}) value {v} is not an int32")
    return v


def datum_fields(
    value: bytes | memoryview,
) -> tuple[int, int, int, memoryview | None, int, bool, int, int]:
    """:func:`parse_datum` as a plain tuple ``(channels, height, width, data, label, encoded,
    float_count, data_offset)``: one loop over the fields, no generator and no object built
    (this runs once per sample read). The same checks and errors as :func:`parse_datum`."""
    mv = value if isinstance(value, memoryview) else memoryview(value).cast("B")
    ints = [0, 0, 0, 0, 0, 0]  # by field number: 1 channels, 2 height, 3 width, 5 label
    data: memoryview | None = None
    data_at = 0
    encoded = False
    floats = 0
    pos, end = 0, len(mv)
    while pos < end:
        at = pos
        tag = mv[pos]  # the one-byte case of each varint inline
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = read_varint(mv, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError(at, "field number 0")
        if wire == VARINT:
            v = mv[pos] if pos < end else 0x80
            if v < 0x80:
                pos += 1
            else:
                v, pos = read_varint(mv, pos, end)
            if number in _INT32:
                ints[number] = _int32(number, v, at)
            elif number == 7:
                encoded = bool(v)
            elif number in (4, 6):
                raise WireError(at, _wrong_wire(number, wire))
        elif wire == LEN:
            n, pos = read_varint(mv, pos, end)
            if n > end - pos:
                raise WireError(at, f"field {number} claims {n} bytes, only {end - pos} remain")
            if number == 4:
                data, data_at = mv[pos : pos + n], at
            elif number == 6:
                if n % 4:
                    raise WireError(at, "field 6 (float_data) is not a whole number of floats")
                floats += n // 4
            elif number in _INT32 or number == 7:
                raise WireError(at, _wrong_wire(number, wire))
            pos += n
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if size > end - pos:
                raise WireError(at, f"field {number} needs {size} bytes, only {end - pos} remain")
            if number == 6 and wire == I32:
                floats += 1
            elif number in _NAMES or number == 6:
                raise WireError(at, _wrong_wire(number, wire))
            pos += size
        else:
            raise WireError(at, f"field {number} has wire type {wire} (groups are not supported)")
    return ints[1], ints[2], ints[3], data, ints[5], encoded, floats, data_at


def _wrong_wire(number: int, wire: int) -> str:
    if number == 4:
        return f"field 4 (data) has wire type {wire}, not bytes"
    if number == 7:
        return f"field 7 (encoded) has wire type {wire}, not a bool"
    if number == 6:
        return f"field 6 (float_data) has wire type {wire}"
    return f"field {number} ({_NAMES[number]}) has wire type {wire}"


def parse_datum(value: bytes | memoryview) -> Datum:
    """The fields of one Datum; :class:`WireError` (with the byte offset) when the bytes are not
    one. Unknown field numbers are skipped, as protobuf does; a known field with the wrong wire
    type is an error."""
    return Datum(*datum_fields(value))


def image_kind(buf: bytes | memoryview) -> str | None:
    """The image format the first bytes announce (``"jpeg"``, ``"png"``, ``"webp"``, ``"gif"``,
    ``"bmp"``, ``"tiff"``, ``"pnm"``, ``"jp2"``), or ``None``: a cheap check that a value is an
    encoded image before anything decodes it."""
    h = bytes(buf[:12])
    if h[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if h[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if h[:4] == b"RIFF" and h[8:12] == b"WEBP":
        return "webp"
    if h[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if h[:2] == b"BM" and len(h) >= 6:
        return "bmp"
    if h[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if len(h) >= 3 and h[0:1] == b"P" and h[1:2] in b"123456" and h[2:3] in b" \t\r\n":
        return "pnm"
    if h == b"\x00\x00\x00\x0cjP  \r\n\x87\n":
        return "jp2"
    return None


def _hwc(pixels: memoryview | bytes, channels: int, height: int, width: int) -> np.ndarray:
    """Raw Caffe pixels (uint8, CHW, BGR or BGRA or grey) as an HWC view in RGB(A) or grey
    order (no copy)."""
    chw = np.frombuffer(pixels, dtype=np.uint8).reshape(channels, height, width)
    order = [2, 1, 0, 3][:channels] if channels >= 3 else [0]
    return chw[order].transpose(1, 2, 0) if channels >= 3 else chw[0]


def encode_png(
    pixels: memoryview | bytes, channels: int, height: int, width: int, level: int = 0
) -> bytes:
    """A PNG of raw Caffe pixels (uint8, CHW, BGR or BGRA or grey); ``len(pixels)`` must be
    ``channels * height * width`` (checked by the caller)."""
    return png_of(_hwc(pixels, channels, height, width), level)


def datum_pixels(d: Datum) -> np.ndarray:
    """The decoded image of a raw Datum (after :func:`check_datum`): C-contiguous uint8
    ``(H, W, 3)`` RGB, the pixels ``decode`` gives of :func:`encode_png`'s PNG of it."""
    assert d.data is not None
    c, h, w = d.channels, d.height, d.width
    chw = np.frombuffer(d.data, dtype=np.uint8).reshape(c, h, w)
    out = np.empty((h, w, 3), dtype=np.uint8)
    for dst, src in enumerate((2, 1, 0) if c >= 3 else (0, 0, 0)):  # BGR planes -> RGB
        out[:, :, dst] = chw[src]
    return out


def check_datum(d: Datum) -> None:
    """:class:`WireError` naming what disagrees when the Datum holds no usable image."""
    if d.data is None or len(d.data) == 0:
        if d.float_count:
            raise WireError(
                0,
                f"holds float_data ({d.float_count} floats), not image data: stoker reads "
                "image Datums only",
            )
        raise WireError(0, "holds no image data (field 4 is absent or empty)")
    if d.encoded:
        return
    c, h, w = d.channels, d.height, d.width
    n = len(d.data)
    if c <= 0 or h <= 0 or w <= 0 or c * h * w != n:
        raise WireError(
            d.data_offset,
            f"channels x height x width = {c} x {h} x {w} = {c * h * w}, but data holds {n} bytes",
        )
    if c not in _CHANNELS:
        raise WireError(0, f"a raw Datum with {c} channels is not an image (1, 3 or 4 channels)")


def datum_image(d: Datum) -> memoryview | np.ndarray:
    """The image of a parsed Datum (see the module docstring): an encoded Datum's bytes, a raw
    one's decoded pixels; :class:`WireError` when it holds no usable image."""
    check_datum(d)
    assert d.data is not None
    return d.data if d.encoded else datum_pixels(d)
