"""What one LMDB value is under each layout, and which layout a database has.

- ``"datum"``: a Caffe ``Datum`` (:mod:`.datum`): the image is its encoded bytes, or its raw
  pixels as a decoded array; the label is the Datum's.
- ``"image"`` (LSUN-style): the value is one encoded image file (JPEG, WebP, PNG, ...), kept
  untouched; labels come from outside the database (see :mod:`.labels`).

Detection looks at the first value: an image file's magic bytes cannot start a Datum (a Datum
starts with a field 1..7 tag, 0x08..0x3a; JPEG, PNG, WebP, GIF, BMP and TIFF start with 0xff,
0x89, "R", "G", "B", "I"/"M"), so the two never overlap.
"""

from __future__ import annotations

import numpy as np

from stoker.formats.lmdb.datum import (
    Datum,
    check_datum,
    datum_fields,
    datum_image,
    image_kind,
    parse_datum,
)
from stoker.formats.lmdb.location import LmdbFormatError
from stoker.formats.protowire import WireError

__all__ = [
    "LAYOUTS",
    "check_layout",
    "check_value",
    "detect_layout",
    "read_datum",
    "read_datum_label",
    "read_image_value",
]

LAYOUTS = ("datum", "image")


def check_layout(layout: object) -> str | None:
    if layout is None or layout in LAYOUTS:
        return layout  # type: ignore[return-value]
    raise ValueError(f"layout must be one of {LAYOUTS} or None (detect), got {layout!r}")


def detect_layout(value: bytes | memoryview, path: str, key: bytes) -> str:
    """The layout the first value announces; :class:`LmdbFormatError` when it is neither."""
    if image_kind(value) is not None:
        return "image"
    try:
        d = parse_datum(value)
    except WireError as e:
        d, why = None, f"not a Datum (byte {e.offset}: {e.reason})"
    if d is not None:
        if d.data is not None and len(d.data) and (not d.encoded or image_kind(d.data)):
            return "datum"
        why = "parses as protobuf but holds no Datum image"
    head = bytes(value[:8]).hex(" ")
    raise LmdbFormatError(
        path,
        f"cannot tell the layout: the value ({len(value)} bytes, starting {head or '-'}) "
        f"is not an encoded image and {why}; pass layout='datum' or layout='image'",
        key=key,
        position=0,
    )


def _not_a_datum(e: WireError, path: str, key: bytes, position: int) -> LmdbFormatError:
    return LmdbFormatError(
        path, f"not a valid Caffe Datum: {e.reason}", key=key, position=position, offset=e.offset
    )


def read_datum(
    value: bytes | memoryview, path: str, key: bytes, position: int
) -> tuple[bytes | memoryview | np.ndarray, int]:
    """(image, label) of a Datum value: an encoded Datum's image bytes, a raw one's decoded
    pixels (:func:`~.datum.datum_pixels`); :class:`LmdbFormatError` naming the key when the
    value is not a usable Datum."""
    try:
        fields = datum_fields(value)
        data, label, encoded = fields[3], fields[4], fields[5]
        if encoded and data is not None and len(data) and image_kind(data) is not None:
            return data, label  # the usual case: encoded bytes, taken as they are
        d = Datum(*fields)
        image = datum_image(d)
    except WireError as e:
        raise _not_a_datum(e, path, key, position) from None
    if d.encoded:
        _check_image(d.data, path, key, position, "the encoded Datum's data", d)  # type: ignore[arg-type]
    return image, d.label


def check_value(
    layout: str, value: bytes | memoryview, path: str, key: bytes, position: int
) -> bytes | memoryview | None:
    """What ``verify`` checks of one value, without making a PNG: the encoded image bytes
    (to decode, when asked), or ``None`` for a raw Datum whose dimensions match its pixels;
    :class:`LmdbFormatError` when the value is not what ``layout`` says."""
    if layout == "image":
        return read_image_value(value, path, key, position)
    try:
        d = parse_datum(value)
        check_datum(d)
    except WireError as e:
        raise _not_a_datum(e, path, key, position) from None
    if not d.encoded:
        return None
    _check_image(d.data, path, key, position, "the encoded Datum's data", d)  # type: ignore[arg-type]
    return d.data


def read_datum_label(value: bytes | memoryview, path: str, key: bytes, position: int) -> int:
    try:
        return datum_fields(value)[4]
    except WireError as e:
        raise _not_a_datum(e, path, key, position) from None


def read_image_value(
    value: bytes | memoryview, path: str, key: bytes, position: int
) -> bytes | memoryview:
    """The value itself, once its first bytes say it is an image file."""
    _check_image(value, path, key, position, "the value", None)
    return value


def _check_image(
    buf: bytes | memoryview, path: str, key: bytes, position: int, what: str, d: Datum | None
) -> None:
    if image_kind(buf) is None:
        head = bytes(buf[:8]).hex(" ")
        hint = ""
        if d is None:
            try:
                if parse_datum(buf).data:
                    hint = " (it parses as a Caffe Datum: open with layout='datum')"
            except WireError:
                pass
        raise LmdbFormatError(
            path,
            f"{what} ({len(buf)} bytes, starting {head or '-'}) is not an encoded image{hint}",
            key=key,
            position=position,
            offset=d.data_offset if d is not None else 0,
        )
