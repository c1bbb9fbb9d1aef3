"""``tf.train.Example`` read and written on the protobuf wire format, without TensorFlow::

    message Example   { Features features = 1; }
    message Features  { map<string, Feature> feature = 1; }    // entry: key = 1, value = 2
    message Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                     Int64List int64_list = 3; } }
    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }

Parsing keeps spans (start, end) into the record's bytes instead of copies, so a reader takes
the image bytes as a view and skips the features nobody asked for. Packed and unpacked
repeated numbers are both read (protobuf parsers must accept either); a later map entry for
the same name wins, as in protobuf. Every :class:`WireError` carries the byte offset inside
the record's data; the caller adds the record's file offset.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.formats.protowire import (
    I32,
    I64,
    LEN,
    VARINT,
    WireError,
    encode_varint,
    iter_fields,
    read_varint,
)

__all__ = [
    "KINDS",
    "RawFeature",
    "bytes_values",
    "bytes_entry_head",
    "encode_example",
    "feature_entry",
    "int_entry",
    "one_bytes_span",
    "float_values",
    "int64_values",
    "parse_features",
    "value_count",
]

#: Feature kinds by their field number in ``Feature``.
KINDS = {1: "bytes", 2: "float", 3: "int64"}
_NUMBER = {v: k for k, v in KINDS.items()}
_TAG = {kind: bytes(((n << 3) | LEN,)) for kind, n in _NUMBER.items()}  # a Feature's list


@dataclass(frozen=True)
class RawFeature:
    """One feature as found: its kind (``"bytes"``, ``"float"``, ``"int64"``, or ``None`` for
    a Feature with no list set) and the span ``[start, end)`` of its list message."""

    kind: str | None
    start: int
    end: int


def _len(mv: memoryview, pos: int, end: int, at: int, what: str) -> tuple[int, int]:
    """``(start, end)`` of a length-delimited value whose length varint is at ``pos``."""
    n, pos = read_varint(mv, pos, end)
    if n > end - pos:
        raise WireError(at, f"{what} claims {n} bytes, only {end - pos} remain in its message")
    return pos, pos + n


def _skip(mv: memoryview, tag: int, pos: int, end: int, at: int) -> int:
    """The position after a field nobody asked for."""
    number, wire = tag >> 3, tag & 7
    if number == 0:
        raise WireError(at, "field number 0")
    if wire == VARINT:
        return read_varint(mv, pos, end)[1]
    if wire == LEN:
        return _len(mv, pos, end, at, f"field {number}")[1]
    if wire in (I64, I32):
        size = 8 if wire == I64 else 4
        if size > end - pos:
            raise WireError(at, f"field {number} needs {size} bytes, only {end - pos} remain")
        return pos + size
    raise WireError(at, f"field {number} has wire type {wire} (groups are not supported)")


def parse_features(mv: memoryview, wanted: Container[str] | None = None) -> dict[str, RawFeature]:
    """The features of the Example in ``mv`` (all, or only the names in ``wanted``).
    Written as plain loops: this runs once per sample read."""
    out: dict[str, RawFeature] = {}
    pos, end = 0, len(mv)
    while pos < end:
        at = pos
        tag, pos = read_varint(mv, pos, end)
        if tag != 0x0A:  # not Example.features (field 1, length-delimited): skipped
            pos = _skip(mv, tag, pos, end, at)
            continue
        fs, pos = _len(mv, pos, end, at, "Example.features")
        _features(mv, fs, pos, wanted, out)
    return out


def _features(mv: memoryview, pos: int, end: int, wanted: Container[str] | None, out: dict) -> None:
    while pos < end:
        at = pos
        tag, pos = read_varint(mv, pos, end)
        if tag != 0x0A:  # not a map entry (Features.feature, field 1)
            pos = _skip(mv, tag, pos, end, at)
            continue
        p, pos = _len(mv, pos, end, at, "a Features map entry")
        name, feat = "", None
        while p < pos:
            at3 = p
            t3, p = read_varint(mv, p, pos)
            if t3 == 0x0A:
                ks, p = _len(mv, p, pos, at3, "a feature name")
                try:
                    name = str(mv[ks:p], "utf-8")
                except UnicodeDecodeError:
                    raise WireError(at3, "a feature name that is not UTF-8") from None
                if wanted is not None and name not in wanted and feat is None:
                    break  # the name comes first (as every writer puts it): skip the value
            elif t3 == 0x12:
                fs, p = _len(mv, p, pos, at3, "a Feature")
                feat = (fs, p)
            else:
                p = _skip(mv, t3, p, pos, at3)
        if wanted is None or name in wanted:
            out[name] = _feature(mv, feat)


def _feature(mv: memoryview, span: tuple[int, int] | None) -> RawFeature:
    if span is None:
        return RawFeature(None, 0, 0)
    kind, start, end = None, span[0], span[0]
    pos, stop = span
    while pos < stop:
        at = pos
        tag, pos = read_varint(mv, pos, stop)
        number = tag >> 3
        if number in KINDS and tag & 7 == LEN:  # a oneof: the last one set wins
            start, pos = _len(mv, pos, stop, at, f"Feature.{KINDS[number]}_list")
            end, kind = pos, KINDS[number]
        else:
            pos = _skip(mv, tag, pos, stop, at)
    return RawFeature(kind, start, end)


def _byte_spans(mv: memoryview, f: RawFeature) -> Iterator[tuple[int, int]]:
    """``(start, end)`` in ``mv`` of each value of a BytesList feature."""
    pos, end = f.start, f.end
    while pos < end:
        at = pos
        tag, pos = read_varint(mv, pos, end)
        if tag == 0x0A:
            s, pos = _len(mv, pos, end, at, "a BytesList value")
            yield s, pos
        else:
            pos = _skip(mv, tag, pos, end, at)


def bytes_values(mv: memoryview, f: RawFeature) -> list[memoryview]:
    """The values of a bytes feature, as views of ``mv``."""
    return [mv[s:e] for s, e in _byte_spans(mv, f)]


def one_bytes_span(mv: memoryview, f: RawFeature) -> tuple[int, int] | None:
    """``(start, end)`` in ``mv`` of the one value of a bytes feature (what
    :func:`bytes_values` gives as its only item), or ``None`` when it holds another count."""
    spans = list(_byte_spans(mv, f))
    return spans[0] if len(spans) == 1 and f.kind == "bytes" else None


def _numbers(
    mv: memoryview,
    f: RawFeature,
    wire_one: int,
    what: str,
    packed: Callable[[int, int, int], Iterable[Any]],
    one: Callable[[Any], Any],
) -> list:
    """The values of a FloatList or Int64List feature: field 1, packed (``packed(start,
    end, at)``) or one value a field of wire type ``wire_one`` (``one(value)``)."""
    out: list = []
    for number, wire, value, at in iter_fields(mv, f.start, f.end):
        if number != 1:
            continue
        if wire == LEN:
            s, e = value  # type: ignore[misc]
            out.extend(packed(s, e, at))
        elif wire == wire_one:
            out.append(one(value))
        else:
            raise WireError(at, f"{what} value of wire type {wire}")
    return out


def float_values(mv: memoryview, f: RawFeature) -> list[float]:
    """The values of a float feature (packed or not)."""

    def packed(s: int, e: int, at: int) -> tuple[float, ...]:
        if (e - s) % 4:
            raise WireError(at, f"packed floats of {e - s} bytes (not a multiple of 4)")
        return struct.unpack_from(f"<{(e - s) // 4}f", mv, s)

    def one(value: int) -> float:
        return struct.unpack("<f", int(value).to_bytes(4, "little"))[0]

    return _numbers(mv, f, I32, "a float", packed, one)


def _signed(v: int) -> int:
    """A varint as int64: truncated to 64 bits (as protobuf does), then two's complement."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def int64_values(mv: memoryview, f: RawFeature) -> list[int]:
    """The values of an int64 feature (packed or not), as signed ints."""

    def packed(pos: int, end: int, at: int) -> Iterator[int]:
        while pos < end:
            v, pos = read_varint(mv, pos, end)
            yield _signed(v)

    return _numbers(mv, f, VARINT, "an int64", packed, _signed)


def value_count(mv: memoryview, f: RawFeature) -> int:
    """How many values a feature holds."""
    if f.kind == "bytes":
        return len(bytes_values(mv, f))
    if f.kind == "float":
        return len(float_values(mv, f))
    if f.kind == "int64":
        return len(int64_values(mv, f))
    return 0


def _list_body(kind: str, values: Sequence | np.ndarray | bytes) -> bytes:
    if kind == "bytes":
        if isinstance(values, (bytes, bytearray, memoryview)):  # one value, the usual case
            return b"\x0a" + encode_varint(len(values)) + bytes(values)
        many: Sequence[bytes] = values  # type: ignore[assignment]
        return b"".join(b"\x0a" + encode_varint(len(v)) + bytes(v) for v in many)
    if kind == "float":
        raw = np.ascontiguousarray(values, dtype="<f4").reshape(-1).tobytes()
    elif kind == "int64":
        if type(values) is list and all(type(v) is int for v in values):
            ints: list[int] = values  # a key, a height: no array needed
        else:
            ints = [int(v) for v in np.asarray(values).reshape(-1).tolist()]
        raw = b"".join(map(encode_varint, ints))
    else:
        raise ValueError(f"feature kind must be one of {sorted(_NUMBER)}, got {kind!r}")
    return (b"\x0a" + encode_varint(len(raw)) + raw) if raw else b""


def encode_example(features: Sequence[tuple[str, str, Sequence | np.ndarray | bytes]]) -> bytes:
    """A serialised Example of ``(name, kind, values)`` features, numbers packed (as
    TensorFlow writes them); a ``bytes`` value may be one bytes object or a list of them."""
    body = b"".join([feature_entry(name, kind, values) for name, kind, values in features])
    return b"\x0a" + encode_varint(len(body)) + body


def feature_entry(name: str, kind: str, values: Sequence | np.ndarray | bytes) -> bytes:
    """One feature's map entry, as :func:`encode_example` writes it into an Example."""
    lst = _list_body(kind, values)
    feature = _TAG[kind] + encode_varint(len(lst)) + lst
    entry = _key_field(name) + encode_varint(len(feature))
    return b"\x0a" + encode_varint(len(entry) + len(feature)) + entry + feature


def bytes_entry_head(name: str, size: int) -> bytes:
    """What :func:`feature_entry` of one ``bytes`` value of ``size`` bytes writes before the
    value itself (the value follows it, and nothing after)."""
    return _one_value_head(name, "bytes", size)


def int_entry(name: str, value: int) -> bytes:
    """:func:`feature_entry` of one ``int64`` value (``[value]``), from a head made once per
    name and varint length."""
    raw = encode_varint(value)
    return _int_head(name, len(raw)) + raw


@functools.lru_cache(maxsize=256)
def _int_head(name: str, size: int) -> bytes:
    return _one_value_head(name, "int64", size)


def _one_value_head(name: str, kind: str, size: int) -> bytes:
    """The bytes of a one-entry feature before its list's ``size`` bytes of payload: one
    bytes value, or the packed varint of one int64."""
    lst_head = b"\x0a" + encode_varint(size)
    lst_len = len(lst_head) + size
    feature_head = _TAG[kind] + encode_varint(lst_len) + lst_head
    feature_len = len(feature_head) + size
    entry = _key_field(name) + encode_varint(feature_len)
    return b"\x0a" + encode_varint(len(entry) + feature_len) + entry + feature_head


@functools.lru_cache(maxsize=4096)
def _key_field(name: str) -> bytes:
    """A map entry's key field (``name``) and the value field's tag, before its length."""
    key = name.encode("utf-8")
    return b"\x0a" + encode_varint(len(key)) + key + b"\x12"
