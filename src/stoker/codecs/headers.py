"""``(h, w)`` from the header of a WebP, BMP, TIFF or Radiance HDR file, or ``None``: what
``decode``'s bomb guard checks before any pixel is decoded (else Pillow reads the header)."""

from __future__ import annotations

import struct

__all__ = ["bmp_size", "radiance_size", "riff_webp_size", "tiff_size"]


def riff_webp_size(mv: memoryview) -> tuple[int, int] | None:
    """(h, w) from a WebP header (VP8, VP8L or VP8X chunk), or ``None``."""
    if len(mv) < 30 or mv[0:4] != b"RIFF" or mv[8:12] != b"WEBP":
        return None
    chunk = bytes(mv[12:16])
    if chunk == b"VP8 " and mv[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", mv[26:30])
        return h & 0x3FFF, w & 0x3FFF
    if chunk == b"VP8L" and mv[20] == 0x2F:
        (bits,) = struct.unpack("<I", mv[21:25])
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        w = int.from_bytes(mv[24:27], "little") + 1
        h = int.from_bytes(mv[27:30], "little") + 1
        return h, w
    return None


def bmp_size(mv: memoryview) -> tuple[int, int] | None:
    """(h, w) from a BMP header (BITMAPINFOHEADER or later, or OS/2's), or ``None``."""
    if len(mv) < 26 or mv[0:2] != b"BM":
        return None
    (dib,) = struct.unpack("<I", mv[14:18])
    if dib == 12:
        w, h = struct.unpack("<HH", mv[18:22])
        return h, w
    if dib >= 40:
        w, h = struct.unpack("<ii", mv[18:26])
        return abs(h), abs(w)
    return None


def tiff_size(mv: memoryview) -> tuple[int, int] | None:
    """(h, w) of the first page of a classic TIFF (ImageLength/ImageWidth of IFD 0), or
    ``None`` (BigTIFF, a damaged IFD: Pillow reads those)."""
    head = bytes(mv[0:4])
    if head == b"II*\x00":
        e = "<"
    elif head == b"MM\x00*":
        e = ">"
    else:
        return None
    try:
        (ifd,) = struct.unpack_from(e + "I", mv, 4)
        (n,) = struct.unpack_from(e + "H", mv, ifd)
        size: dict[int, int] = {}
        for pos in range(ifd + 2, ifd + 2 + 12 * n, 12):
            tag, typ = struct.unpack_from(e + "HH", mv, pos)
            if tag in (256, 257):
                fmt = {3: "H", 4: "I"}.get(typ)
                if fmt is None:
                    return None
                size[tag] = struct.unpack_from(e + fmt, mv, pos + 8)[0]
                if len(size) == 2:
                    return size[257], size[256]
    except struct.error:
        return None
    return None


def radiance_size(mv: memoryview) -> tuple[int, int] | None:
    """(h, w) from a Radiance HDR header (``-Y h +X w`` after the blank line), or ``None``."""
    if mv[0:2] != b"#?":
        return None
    head = bytes(mv[:4096])
    end = head.find(b"\n\n")
    if end < 0:
        return None
    tokens = head[end + 2 :].split(b"\n", 1)[0].split()
    if len(tokens) != 4 or not (tokens[1].isdigit() and tokens[3].isdigit()):
        return None
    a, b = int(tokens[1]), int(tokens[3])
    return (a, b) if tokens[0].endswith(b"Y") else (b, a)
