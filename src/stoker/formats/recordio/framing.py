"""The dmlc RecordIO framing of a record: the bytes around a payload on disk, read and written.

Every part on disk starts on a 4-byte boundary with two little-endian uint32 words, ``MAGIC``
and ``lrec = cflag << 29 | length``, then ``length`` payload bytes, then zero padding to a
multiple of 4 (dmlc-core ``recordio.h``). A payload that holds the magic at an aligned offset
is split there into parts with cflag 1 (first), 2 (middle) and 3 (last), the magic itself
dropped; ``cflag 0`` is a whole record. So the magic never stands at an aligned offset inside
a part, which is what lets a walker resynchronise after damage (:func:`next_magic`).

Readers check every length against the file size before slicing anything: a corrupt length
raises :class:`FrameError` (callers that know the key and ``.idx`` line turn it into a
``CorruptRecordError``) and never allocates.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError

__all__ = [
    "LENGTH_MASK",
    "MAGIC",
    "MAGIC_BYTES",
    "MAX_RECORD_BYTES",
    "FrameError",
    "decode_lrec",
    "encode_lrec",
    "frame_parts",
    "frame_record",
    "iter_records",
    "next_magic",
    "pad4",
    "read_part",
    "read_record",
    "scan_offsets",
    "single_part_heads",
]

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
#: dmlc-core keeps the length in the low 29 bits of ``lrec``.
MAX_RECORD_BYTES = (1 << 29) - 1
LENGTH_MASK = MAX_RECORD_BYTES

_HEAD = struct.Struct("<II")
_LREC = struct.Struct("<I")
_ZEROS = b"\x00\x00\x00"


def encode_lrec(cflag: int, length: int) -> int:
    """``cflag << 29 | length``; ``cflag`` in 0..3, ``length`` below 2**29."""
    if not 0 <= cflag <= 3:
        raise ValueError(f"cflag must be 0..3, got {cflag}")
    if not 0 <= length <= MAX_RECORD_BYTES:
        raise ValueError(f"record exceeds RecordIO limit (2^29-1 bytes): {length} bytes")
    return (cflag << 29) | length


def decode_lrec(lrec: int) -> tuple[int, int]:
    """``(cflag, length)`` of an ``lrec`` word."""
    return lrec >> 29, lrec & LENGTH_MASK


def pad4(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (a part's data plus its padding)."""
    return (n + 3) & ~3


# --------------------------------------------------------------------------- reading


class FrameError(Exception):
    """A framing problem of the record at ``offset``; ``truncated`` when the file ends inside
    it. Carries no file name: callers turn it into a ``CorruptRecordError`` or a finding."""

    def __init__(self, offset: int, reason: str, *, truncated: bool = False) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.truncated = truncated


def read_part(buf: Any, size: int, pos: int) -> tuple[int, int]:
    """``(cflag, length)`` of the part at ``pos`` of the ``size``-byte ``buf``; checks the
    magic and that the part, with its padding, fits the file."""
    if pos + 8 > size:
        raise FrameError(
            pos,
            f"truncated: a record header needs 8 bytes at {pos}, the file ends at {size}",
            truncated=True,
        )
    magic, lrec = _HEAD.unpack_from(buf, pos)
    if magic != MAGIC:
        raise FrameError(pos, f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
    cflag, length = lrec >> 29, lrec & LENGTH_MASK
    if pos + 8 + pad4(length) > size:  # dmlc reads the padding too
        raise FrameError(
            pos,
            f"truncated: record part of {length} bytes (+ padding) at {pos} runs past the end "
            f"of the file ({size} bytes)",
            truncated=True,
        )
    return cflag, length


def read_record(buf: Any, view: memoryview, size: int, off: int) -> tuple[memoryview, int]:
    """``(payload, end)`` of the record starting at ``off``; ``end`` is past its padding.

    ``view`` is a memoryview of ``buf``: a single-part payload is a slice of it (no copy);
    the parts of a split record are joined with the magic put back between them.
    """
    cflag, length = read_part(buf, size, off)
    if cflag == 0:
        return view[off + 8 : off + 8 + length], off + 8 + pad4(length)
    if cflag != 1:
        raise FrameError(
            off,
            f"broken multi-part record: first part has cflag {cflag} (expected 0 or 1); "
            "the offset points into the middle of a split record",
        )
    spans = [(off + 8, off + 8 + length)]  # no views kept: an error must not pin the mapping
    pos = off + 8 + pad4(length)
    while True:
        try:
            cflag, length = read_part(buf, size, pos)
        except FrameError as e:
            raise FrameError(
                off, f"in part at {pos} of a multi-part record: {e.reason}", truncated=e.truncated
            ) from None
        if cflag not in (2, 3):
            raise FrameError(
                off,
                f"broken multi-part record: part at {pos} has cflag {cflag}, expected 2 or 3 "
                "after a first part",
            )
        spans.append((pos + 8, pos + 8 + length))
        pos += 8 + pad4(length)
        if cflag == 3:
            return memoryview(MAGIC_BYTES.join([buf[a:b] for a, b in spans])), pos


def _record_end(buf: Any, size: int, pos: int) -> int:
    """Where the record at ``pos`` ends (past its padding), without joining its parts."""
    cflag, length = read_part(buf, size, pos)
    if cflag not in (0, 1):
        raise FrameError(pos, f"broken multi-part record: stray part with cflag {cflag}")
    start = pos
    pos += 8 + pad4(length)
    while cflag in (1, 2):
        try:
            cflag, length = read_part(buf, size, pos)
        except FrameError as e:
            raise FrameError(start, f"in part at {pos}: {e.reason}") from None
        if cflag not in (2, 3):
            raise FrameError(start, f"broken multi-part record: part at {pos} has cflag {cflag}")
        pos += 8 + pad4(length)
    return pos


def next_magic(mm: mmap.mmap, start: int) -> int:
    """Offset of the first magic at an aligned offset from ``start`` on, or -1: where the
    next part can start after damage."""
    j = mm.find(MAGIC_BYTES, start)
    while j >= 0 and j & 3:
        j = mm.find(MAGIC_BYTES, (j + 3) & ~3)
    return j


def single_part_heads(
    words: np.ndarray, offsets: np.ndarray, size: int, *, header_words: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The framing of many records at once, read from ``words`` (a ``size``-byte ``.rec`` as
    little-endian uint32) at the aligned ``offsets``.

    Returns ``(first, whole, length, end)``: the word index of each record's magic (0 where
    its first ``header_words`` words lie past the end of the file), whether it is one part
    with the right magic that fits the file, its length and where it ends (past its padding;
    meaningful only where ``whole``). The records that are not ``whole`` are for
    :func:`read_record`, which names what is wrong.
    """
    w0 = offsets // 4
    inside = w0 + header_words <= words.shape[0]
    first = np.where(inside, w0, 0)
    lrec = words[first + 1].astype(np.int64)
    length = lrec & LENGTH_MASK
    end = offsets + 8 + pad4(length)
    whole = inside & (words[first] == MAGIC) & ((lrec >> 29) == 0) & (end <= size)
    return first, whole, length, end


def iter_records(path: str | os.PathLike[str], *, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """Walk a ``.rec`` from ``start`` and yield ``(offset, payload)`` for every record.

    Needs no ``.idx``. Raises :class:`CorruptRecordError` with the offset of the first record
    that cannot be framed.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                pos = start
                while pos < size:
                    try:
                        payload, end = read_record(mm, view, size, pos)
                    except FrameError as e:
                        raise CorruptRecordError(path, e.offset, e.reason) from None
                    data = bytes(payload)
                    del payload
                    yield pos, data
                    pos = end
            finally:
                view.release()


def scan_offsets(path: str | os.PathLike[str]) -> np.ndarray:
    """Offsets of every record of a ``.rec``, found by walking it (no ``.idx`` needed)."""
    path = os.fspath(path)
    out: list[int] = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while pos < size:
                try:
                    end = _record_end(mm, size, pos)
                except FrameError as e:
                    raise CorruptRecordError(path, e.offset, e.reason) from None
                out.append(pos)
                pos = end
    return np.asarray(out, dtype=np.int64)


# --------------------------------------------------------------------------- writing


def _split_points(data: bytes) -> list[int]:
    """Offsets of the magic at 4-byte-aligned positions (where dmlc splits a record)."""
    out = []
    limit = len(data) & ~3
    j = data.find(MAGIC_BYTES, 0, limit)
    while j >= 0:
        if j & 3 == 0:
            out.append(j)
            j = data.find(MAGIC_BYTES, j + 4, limit)
        else:
            j = data.find(MAGIC_BYTES, (j + 3) & ~3, limit)
    return out


def frame_parts(data: bytes) -> list[bytes]:
    """The pieces of :func:`frame_record` of ``data``, for ``writelines`` (no joined copy)."""
    n = len(data)
    if n > MAX_RECORD_BYTES:
        raise ValueError(f"record exceeds RecordIO limit (2^29-1 bytes): {n} bytes")
    splits = _split_points(data)
    parts: list[bytes] = []
    start = 0
    for i in splits:
        parts.append(MAGIC_BYTES + _LREC.pack(encode_lrec(1 if start == 0 else 2, i - start)))
        parts.append(data[start:i])
        start = i + 4
    parts.append(MAGIC_BYTES + _LREC.pack(encode_lrec(3 if splits else 0, n - start)))
    parts.append(data[start:] if start else data)
    if n & 3:
        parts.append(_ZEROS[: (-n) & 3])
    return parts


def frame_record(payload: bytes | bytearray | memoryview) -> bytes:
    """The exact bytes dmlc's ``RecordIOWriter::WriteRecord`` writes for ``payload``.

    A payload holding the magic at an aligned offset is split there into parts with
    cflag 1 (first), 2 (middle), 3 (last); the magic itself is dropped (the reader puts it
    back). The record is zero-padded to a multiple of 4 bytes.
    """
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"record exceeds RecordIO limit (2^29-1 bytes): {len(payload)} bytes")
    return b"".join(frame_parts(bytes(payload)))
