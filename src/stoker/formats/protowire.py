"""The protobuf wire format, read and written without protobuf: what TFRecord's
``tf.train.Example`` and Caffe's ``Datum`` (in LMDB) are made of.

A message is a sequence of fields, each a varint tag ``(number << 3) | wire_type`` and a value:
wire type 0 a varint, 1 eight little-endian bytes, 2 a varint length and that many bytes
(strings, bytes, nested messages, packed repeated numbers), 5 four little-endian bytes.
Groups (3, 4) are long deprecated and refused.

Everything read is untrusted: a length is checked against the bytes that are really there
before any slice is taken (nothing is allocated from an unchecked length), a varint has at most
10 bytes, and every :class:`WireError` carries the byte offset at fault.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "WireError",
    "encode_field",
    "encode_varint",
    "iter_fields",
    "read_varint",
]

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """Malformed protobuf bytes; ``offset`` is the byte offset (in the buffer given) at fault."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def read_varint(buf: memoryview | bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``; at most 10 bytes, before ``end``.
    The one-byte case (every tag, most lengths) returns before the loop: parsers call this once
    or twice per field, per sample."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError(start, "varint runs past the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(start, "varint longer than 10 bytes")


def iter_fields(
    buf: memoryview | bytes, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, int | tuple[int, int], int]]:
    """Every field of the message in ``buf[start:end]``: ``(number, wire type, value, offset)``
    with ``value`` an int (varint, fixed32, fixed64: raw unsigned) or the ``(start, end)`` span
    of a length-delimited value in ``buf`` (checked to lie inside the message; no slice is
    made until the caller wants one), ``offset`` where the field's tag starts."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    end = len(mv) if end is None else end
    if not 0 <= start <= end <= len(mv):
        raise WireError(start, f"message bounds {start}..{end} outside {len(mv)} bytes")
    pos = start
    while pos < end:
        at = pos
        tag, pos = read_varint(mv, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError(at, "field number 0")
        if wire == VARINT:
            value, pos = read_varint(mv, pos, end)
            yield number, wire, value, at
        elif wire == LEN:
            n, pos = read_varint(mv, pos, end)
            if n > end - pos:
                raise WireError(at, f"field {number} claims {n} bytes, only {end - pos} remain")
            yield number, wire, (pos, pos + n), at
            pos += n
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if size > end - pos:
                raise WireError(at, f"field {number} needs {size} bytes, only {end - pos} remain")
            value = int.from_bytes(mv[pos : pos + size], "little")
            yield number, wire, value, at
            pos += size
        else:
            raise WireError(at, f"field {number} has wire type {wire} (groups are not supported)")


_ONE_BYTE = tuple(bytes((i,)) for i in range(128))


def encode_varint(n: int) -> bytes:
    """Varint of ``n`` (a negative int64 is written as its 10-byte two's complement)."""
    if 0 <= n < 128:  # most lengths, tags and small numbers: one byte
        return _ONE_BYTE[n]
    if 0 < n < 1 << 14:  # an image's length and the lengths around it: two bytes
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_field(number: int, wire: int, value: int | bytes) -> bytes:
    """One field: a varint (``wire=0``), length-delimited bytes (2), fixed64 (1), fixed32 (5)."""
    tag = encode_varint((number << 3) | wire)
    if wire == VARINT:
        return tag + encode_varint(int(value))  # type: ignore[arg-type]
    if wire == LEN:
        data = bytes(value)  # type: ignore[arg-type]
        return tag + encode_varint(len(data)) + data
    if wire == I64:
        return tag + int(value).to_bytes(8, "little")  # type: ignore[arg-type]
    if wire == I32:
        return tag + int(value).to_bytes(4, "little")  # type: ignore[arg-type]
    raise ValueError(f"wire type {wire} is not written")
