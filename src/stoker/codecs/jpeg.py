"""A JPEG's frame size from its bytes, without a decoder: what the hot-loop decoder's bomb
guard reads (:func:`stoker.codecs.decoder`)."""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["jpeg_frame"]

# what jpeg_frame reads (a numpy array's items would be numpy ints, which shift in 8 bits)
_WALKABLE = (bytes, bytearray, memoryview)
_SOF_SIZE = struct.Struct(">HHB")  # a frame header's height, width and component count
# the segments with a length that may come before the frame header: APPn, COM, DQT, DHT,
# DAC, DRI (libjpeg-turbo skips or reads them by that length, as jpeg_frame does)
_LENGTHED = frozenset([*range(0xE0, 0xF0), 0xFE, 0xDB, 0xC4, 0xCC, 0xDD])


def jpeg_frame(b: Any) -> tuple[int, int] | None:
    """(height, width) from the frame header (SOFn) of a JPEG of 1 or 3 components, found by
    walking the marker segments before it (a few per file, where simplejpeg's header read
    sets up a whole decompressor); ``None`` for anything else (not bytes, not a JPEG, a CMYK
    or YCCK one, a height left to a DNL marker, a byte out of place), which the caller hands
    to simplejpeg's header read. The frame libjpeg-turbo decodes: the first."""
    if type(b) not in _WALKABLE or (type(b) is memoryview and b.format != "B"):
        return None
    try:
        n = len(b)
        if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
            return None
        i = 2
        while i + 9 < n:
            if b[i] != 0xFF:
                return None
            m = b[i + 1]
            if 0xC0 <= m <= 0xCF and m != 0xC4 and m != 0xC8 and m != 0xCC:
                h, w, comps = _SOF_SIZE.unpack_from(b, i + 5)
                return (h, w) if h and w and comps in (1, 3) else None
            if m not in _LENGTHED:  # a marker without a length, a scan, fill: not ours
                return None
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
    except (IndexError, TypeError, ValueError, struct.error):
        return None
    return None
