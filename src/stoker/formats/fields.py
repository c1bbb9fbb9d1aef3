"""The field trailer: a sample's stored fields as bytes after its image, in any record format.

A record of a set whose schema has stored fields (``Schema.stored``) ends with::

    image bytes | trailer body | uint32 body length | b"STKF"

The body holds each stored field in schema order (``docs/format.md`` has the table):

- ``numeric``: the raw little-endian value, ``itemsize * prod(shape)`` bytes, no length;
- ``ragged``: uint32 row count, then the rows (little-endian, C order);
- ``text`` (UTF-8), ``bytes`` and ``mask`` (an encoded PNG): uint32 byte length, then the bytes.

The trailer sits at the end, not the front, so that a reader that knows nothing of it (MXNet's
``imdecode`` of everything after the labels) still finds the image first: JPEG and PNG
decoders stop at their end marker. Whether a record has a trailer is decided by the set's
declared schema, never guessed from the bytes.

Nothing here knows RecordIO: a format hands over the bytes after its own header and turns a
:class:`TrailerError` into its own error naming the file, the record and the byte offset.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from stoker._core.schema import Field, Schema, nbytes

__all__ = ["TRAILER_MAGIC", "TrailerError", "encode_trailer", "split_trailer", "decode_trailer"]

TRAILER_MAGIC = b"STKF"
_U32 = struct.Struct("<I")
_TAIL = 8  # uint32 body length + magic


class TrailerError(ValueError):
    """A trailer that does not parse: ``pos`` is the byte position inside the bytes handed to
    :func:`split_trailer` (image first), ``field`` the field being read (or ``None``)."""

    def __init__(self, reason: str, pos: int, field: str | None = None) -> None:
        self.reason, self.pos, self.field = reason, pos, field
        where = f"field {field!r}, " if field is not None else ""
        super().__init__(f"{where}byte {pos} of the payload after the labels: {reason}")


def _le(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def encode_trailer(schema: Schema, values: Mapping[str, Any]) -> bytes:
    """The trailer (body, length, magic) of ``values`` (name -> value, as ``Field.check``
    returns it) for the stored fields of ``schema``; ``KeyError`` naming a missing field. A
    schema with no stored fields has no trailer: ``b""``."""
    stored = schema.stored
    if not stored:
        return b""
    parts: list[bytes] = []
    for name, f in stored.items():
        if name not in values:
            raise KeyError(f"field {name!r} has no value (the schema stores {list(stored)})")
        parts.append(_encode_one(f, values[name]))
    body = b"".join(parts)
    if len(body) > 0xFFFFFFFF:
        raise ValueError(f"the field trailer is {len(body)} bytes, over the 4 GiB a uint32 holds")
    return body + _U32.pack(len(body)) + TRAILER_MAGIC


def _encode_one(f: Field, v: Any) -> bytes:
    if f.kind == "numeric":
        return np.ascontiguousarray(v, dtype=_le(f.dtype)).tobytes()
    if f.kind == "ragged":
        arr = np.ascontiguousarray(v, dtype=_le(f.dtype))
        return _U32.pack(arr.shape[0]) + arr.tobytes()
    raw = v.encode("utf-8") if f.kind == "text" else bytes(v)
    return _U32.pack(len(raw)) + raw


def split_trailer(buf: Any) -> tuple[memoryview, memoryview]:
    """``(image, body)`` of the bytes after a record's header: views into ``buf``. Raises
    :class:`TrailerError` when the tail is not a trailer's (no magic, a length past the start)."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n = len(mv)
    if n < _TAIL or mv[n - 4 :] != TRAILER_MAGIC:
        raise TrailerError(
            f"no field trailer: the last 4 bytes are {bytes(mv[max(n - 4, 0) :]).hex(' ')!r}, "
            f"not {TRAILER_MAGIC!r} (the manifest's schema says the records store fields)",
            max(n - 4, 0),
        )
    (length,) = _U32.unpack_from(mv, n - _TAIL)
    if length > n - _TAIL:
        raise TrailerError(
            f"the trailer length {length} is more than the {n - _TAIL} bytes before it",
            n - _TAIL,
        )
    start = n - _TAIL - length
    if start == 0:
        raise TrailerError("no image bytes before the field trailer", 0)
    return mv[:start], mv[start : n - _TAIL]


def decode_trailer(
    schema: Schema, body: memoryview, names: Collection[str] | None = None, *, start: int = 0
) -> dict[str, Any]:
    """The stored fields ``names`` (all when ``None``) of a trailer ``body``, each as
    ``Field.check`` gives it: a numeric or ragged ndarray (native byte order, its own
    memory), a str, or bytes (a mask's PNG). ``start``: where ``body`` begins in the bytes
    given to :func:`split_trailer`, so that errors name that position."""
    out: dict[str, Any] = {}
    pos, n = 0, len(body)
    want = None if names is None else set(names)
    for name, f in schema.stored.items():
        if want is not None and not want:
            break  # everything asked for is read
        pos, value = _decode_one(f, name, body, pos, n, start)
        if want is None or name in want:
            out[name] = value
            if want is not None:
                want.discard(name)
    if names is None and pos != n:
        raise TrailerError(
            f"{n - pos} bytes left over after the last field (the trailer holds {n} bytes)",
            start + pos,
        )
    return out


def _need(name: str, pos: int, k: int, n: int, start: int, what: str) -> None:
    if pos + k > n:
        raise TrailerError(
            f"{what} needs {k} bytes but the trailer has {n - pos} left", start + pos, name
        )


def _decode_one(f: Field, name: str, body: memoryview, pos: int, n: int, start: int) -> tuple:
    """``(position after the field, its value)``."""
    if f.kind == "numeric":
        k = nbytes(f)
        _need(name, pos, k, n, start, f"a {f.dtype} {f.shape} value")
        arr = np.frombuffer(body, dtype=_le(f.dtype), count=k // _itemsize(f), offset=pos)
        return pos + k, arr.astype(f.dtype).reshape(f.shape)
    _need(name, pos, 4, n, start, "the length word")
    (count,) = _U32.unpack_from(body, pos)
    pos += 4
    if f.kind == "ragged":
        row = nbytes(f)
        k = count * row
        _need(name, pos, k, n, start, f"{count} rows of {row} bytes")
        arr = np.frombuffer(body, dtype=_le(f.dtype), count=k // _itemsize(f), offset=pos)
        return pos + k, arr.astype(f.dtype).reshape((count, *f.shape))
    _need(name, pos, count, n, start, f"{count} bytes of {f.kind}")
    raw = bytes(body[pos : pos + count])
    if f.kind == "text":
        try:
            return pos + count, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TrailerError(
                f"text is not UTF-8: {e.reason}", start + pos + e.start, name
            ) from None
    if f.kind == "mask" and not raw:
        raise TrailerError("a mask of 0 bytes", start + pos, name)
    return pos + count, raw


def _itemsize(f: Field) -> int:
    return np.dtype(f.dtype).itemsize
