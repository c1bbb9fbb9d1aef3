"""TFRecord framing: the bytes around each record, read, written and walked.

One record on disk, all little-endian::

    uint64 length | uint32 masked_crc32c(length bytes) | data (length bytes) | uint32 masked_crc32c(data)

``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8  (mod 2**32)``: TensorFlow masks the
CRC so that a CRC computed over bytes that themselves hold CRCs stays well distributed.

Every length read from a file is checked against the bytes really there (``offset + 12 +
length + 4 <= size``) before anything is sliced, so a damaged length never allocates.
"""

from __future__ import annotations

import struct

import numpy as np

from stoker._core.crc import crc32c

__all__ = [
    "HEADER",
    "MASK_DELTA",
    "OVERHEAD",
    "FrameError",
    "frame",
    "frame_ends",
    "looks_gzip",
    "mask_crc",
    "masked_crc",
    "read_frame",
    "scan_offsets",
]

MASK_DELTA = 0xA282EAD8
HEADER = 12  # uint64 length + uint32 masked CRC of the length
OVERHEAD = 16  # header + uint32 masked CRC of the data
_HEAD = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_GZIP_MAGIC = b"\x1f\x8b\x08"


class FrameError(ValueError):
    """A record whose framing is wrong: ``offset`` is the byte offset in the file at fault,
    ``truncated`` is True when the file simply ends inside the record (a torn tail)."""

    def __init__(self, offset: int, reason: str, *, truncated: bool = False) -> None:
        super().__init__(f"byte offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
        self.truncated = truncated
        #: the record's number in its file, when the walk that raised knows it
        self.record: int | None = None


def mask_crc(crc: int) -> int:
    """TensorFlow's mask of a CRC32C value (see the module docstring)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    """The masked CRC32C of ``data``."""
    return mask_crc(crc32c(data))


def frame(data: bytes) -> bytes:
    """``data`` as one framed record."""
    head, tail = frame_ends(data)
    return head + data + tail


def frame_ends(data: bytes) -> tuple[bytes, bytes]:
    """The bytes :func:`frame` puts before ``data`` (its length and that length's masked
    CRC) and after it (its masked CRC), for a writer that joins many records at once."""
    head = struct.pack("<Q", len(data))
    return head + _U32.pack(masked_crc(head)), _U32.pack(masked_crc(data))


def looks_gzip(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes) starts like a GZIP stream and not like a
    TFRecord: a record length whose low bytes happen to be ``1f 8b 08`` still has a valid
    length CRC, which a GZIP header does not."""
    if not head.startswith(_GZIP_MAGIC):
        return False
    if len(head) < HEADER:
        return True
    length_bytes = head[:8]
    return masked_crc(length_bytes) != _U32.unpack_from(head, 8)[0]


def _header(buf: memoryview | bytes, size: int, off: int) -> int:
    """The checked length of the record at ``off``; ``FrameError`` when the header is cut
    short, its CRC is wrong, or the record would run past ``size``."""
    if off + HEADER > size:
        raise FrameError(
            off,
            f"truncated record: the file ends {size - off} bytes into the 12-byte record header",
            truncated=True,
        )
    length, crc = _HEAD.unpack_from(buf, off)
    if masked_crc(buf[off : off + 8]) != crc:
        raise FrameError(
            off,
            f"length CRC mismatch: the header says 0x{crc:08x}, the length bytes give "
            f"0x{masked_crc(buf[off : off + 8]):08x} (a damaged length, or not a TFRecord file)",
        )
    if length > size - off - OVERHEAD:
        raise FrameError(
            off,
            f"truncated record: it claims {length} data bytes but the file has "
            f"{max(size - off - OVERHEAD, 0)} after its header (and 4 for the data CRC)",
            truncated=True,
        )
    return int(length)


def read_frame(
    buf: memoryview, size: int, off: int, *, check_data: bool = True
) -> tuple[memoryview, int]:
    """``(data, end)`` of the record at ``off`` in ``buf`` (``size`` bytes): a zero-copy view
    of its data and the offset just past it. Both CRCs are checked (the data CRC unless
    ``check_data`` is False)."""
    length = _header(buf, size, off)
    start = off + HEADER
    data = buf[start : start + length]
    if check_data:
        want = _U32.unpack_from(buf, start + length)[0]
        got = masked_crc(data)
        if got != want:
            raise FrameError(
                off,
                f"data CRC mismatch: stored 0x{want:08x}, the {length} data bytes give 0x{got:08x}",
            )
    return data, start + length + 4


def scan_offsets(buf: memoryview | bytes, size: int) -> np.ndarray:
    """The offsets of every record in ``buf[:size]``, walking the headers only (length CRCs
    checked, data CRCs not: that is what a read or ``verify`` does). Raises ``FrameError``
    (with ``record`` set) at the first bad or torn record."""
    out: list[int] = []
    off = 0
    append = out.append
    while off < size:
        try:
            length = _header(buf, size, off)
        except FrameError as e:
            e.record = len(out)
            raise
        append(off)
        off += OVERHEAD + length
    return np.asarray(out, dtype=np.int64)
