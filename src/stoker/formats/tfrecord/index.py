"""The record index of a TFRecord file and what one scan of its Examples learns, both cached.

TFRecord has no index: random access needs every record's offset, and the loader needs every
label (samplers) and the longest variable field (batch columns) before the first batch. The
first open walks the file once; the same walk notes where each record's image bytes lie inside
its data, so a read that wants only the image and the label checks the record's CRCs and
slices, without parsing the Example again. The results go to the cache directory
(:mod:`stoker._core.cache`, keyed by the file's real path, size, modification time and inode,
so a changed file gets a new entry), never beside the data.

``NAME.stktfi`` (``cache_file("tfrecord-index", path, ".stktfi")``), little-endian::

    0   8s   magic b"STKTFI\\0\\1"
    8   u32  version (2)
    12  u32  reserved (0)
    16  u64  count: records in the file
    24  u64  the file's size in bytes when indexed (checked again on load)
    32  count x u64: byte offset of each record's header, increasing, the first 0

``NAME-<plan>.stktfm`` (``cache_file("tfrecord-meta", path, "-<plan digest>.stktfm")``: one
per set of feature names read, so readers with other options do not evict each other)::

    0   8s   magic b"STKTFM\\0\\1"
    8   u32  version (2)
    12  u32  J: bytes of the JSON that follows
    16  u64  count
    24  u64  the file's size
    32  J    UTF-8 JSON: {"schema": Schema.to_json() with max_len, "features": {field:
             feature}, "order": [fields read], "label": name or null, "keyed": bool}
    ..  pad to a multiple of 8
        count x k x 8: the labels (k values each; int64, or float64 for a float label)
        count x 8: int64 keys (when "keyed": records carry ``stoker/key``)
        count x 2 x u32: each record's image span in its data (the bytes after the 12-byte
            header): start, length; start 0xFFFFFFFF when the span does not fit in u32 (such
            a record is read by a full parse)

A cache entry that does not match (magic, version, sizes, count) is rebuilt, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file
from stoker._core.errors import CorruptRecordError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.protowire import WireError
from stoker.formats.tfrecord.example import int64_values, one_bytes_span, parse_features
from stoker.formats.tfrecord.features import (
    FeaturePlan,
    FieldError,
    Resolved,
    check_follows,
    field_value,
    lengths_of,
    resolve,
    settle_label,
    wanted_features,
)
from stoker.formats.tfrecord.framing import HEADER, FrameError, read_frame, scan_offsets

__all__ = [
    "NO_SPAN",
    "ShardMeta",
    "cached_meta",
    "cached_offsets",
    "load_meta",
    "load_offsets",
    "plan_digest",
    "record_error",
]

_IDX_MAGIC = b"STKTFI\x00\x01"
_META_MAGIC = b"STKTFM\x00\x01"
_VERSION = 2  # 2: the meta holds each record's image span
#: The image-span start of a record whose span is not cached (read by a full parse).
NO_SPAN = 0xFFFFFFFF
_HEAD = struct.Struct("<8sIIQQ")  # 32 bytes


def record_error(
    path: str, i: int, off: int, e: Exception, key: int | None = None
) -> CorruptRecordError:
    """A :class:`CorruptRecordError` for record ``i`` (header at ``off``) from a framing,
    wire or field problem: the offset is the byte at fault in the file."""
    key = i if key is None else key
    if isinstance(e, FrameError):
        return CorruptRecordError(path, e.offset, f"record {i}: {e.reason}", key=key)
    if isinstance(e, WireError):
        return CorruptRecordError(
            path,
            off + HEADER + e.offset,
            f"record {i}: Example does not parse: {e.reason}",
            key=key,
        )
    if isinstance(e, FieldError):
        at = off if e.pos is None else off + HEADER + e.pos
        return CorruptRecordError(path, at, f"record {i}: {e}", key=key)
    return CorruptRecordError(path, off, f"record {i}: {e}", key=key)


# ---------------------------------------------------------------------- offsets
def _read_entry(entry: str | None, magic: bytes) -> tuple[bytes, tuple] | None:
    if entry is None:
        return None
    try:
        with open(entry, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if len(raw) < _HEAD.size:
        return None
    head = _HEAD.unpack_from(raw, 0)
    if head[0] != magic or head[1] != _VERSION:
        return None
    return raw, head


def _offsets_entry(path: str, cache: bool, identity: str | None) -> str | None:
    return cache_file("tfrecord-index", path, ".stktfi", identity=identity) if cache else None


def _cached_offsets(entry: str | None, size: int) -> np.ndarray | None:
    got = _read_entry(entry, _IDX_MAGIC)
    if got is not None:
        raw, (_m, _v, reserved, n, fsize) = got
        if reserved == 0 and fsize == size and len(raw) == _HEAD.size + 8 * n:
            offs = np.frombuffer(raw, dtype="<i8", offset=_HEAD.size).astype(np.int64)
            if n == 0 or (offs[0] == 0 and bool(np.all(np.diff(offs) >= 16)) and offs[-1] < size):
                return offs
    return None


def cached_offsets(
    path: str, size: int, *, cache: bool = True, identity: str | None = None
) -> np.ndarray | None:
    """The record offsets :func:`load_offsets` cached for ``path`` (``identity``: what the
    bytes are filed under instead of the file's stat, :func:`~stoker._core.cache.cache_file`),
    without the file; ``None`` when there are none."""
    return _cached_offsets(_offsets_entry(path, cache, identity), size)


def load_offsets(
    path: str, buf: memoryview, size: int, *, cache: bool = True, identity: str | None = None
) -> np.ndarray:
    """The record offsets of ``path`` (``buf``: its ``size`` bytes), from the cache or one
    scan of the headers (then cached); ``CorruptRecordError`` at the first bad header."""
    entry = _offsets_entry(path, cache, identity)
    offs = _cached_offsets(entry, size)
    if offs is not None:
        return offs
    try:
        offs = scan_offsets(buf, size)
    except FrameError as e:
        raise record_error(path, e.record or 0, e.offset, e) from None
    if entry is not None:
        head = _HEAD.pack(_IDX_MAGIC, _VERSION, 0, offs.shape[0], size)
        write_cache_file(entry, [head, offs.astype("<i8").tobytes()])
    return offs


# ---------------------------------------------------------------------- meta
@dataclass
class ShardMeta:
    """What a scan of one file's Examples found."""

    resolved: Resolved | None  # None: the file has no records
    labels: np.ndarray  # (N, k) int64 or float64
    keys: np.ndarray | None  # int64 (N,) when records carry stoker/key
    max_len: dict[str, int]
    #: uint32 ``(N, 2)``: where each record's image bytes lie in its data (start, length);
    #: start ``NO_SPAN`` when the span is not known (read by a full parse)
    spans: np.ndarray

    def schema(self) -> Schema | None:
        return None if self.resolved is None else self.resolved.schema(self.max_len)


def plan_digest(plan: FeaturePlan) -> str:
    d = {
        "v": _VERSION,
        "entries": [[n, ft, None if f is None else f.to_json(n)] for n, ft, f in plan.entries],
        "auto": sorted(plan.auto),
        "key": plan.key_feature,
        "label": "settled",  # a bare file's label comes from every record (settle_label)
    }
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:24]


def _scan_meta(
    path: str, buf: memoryview, size: int, offsets: np.ndarray, plan: FeaturePlan
) -> ShardMeta:
    n = offsets.shape[0]
    plan = settle_label(plan, buf, size)
    wanted = wanted_features(plan)
    resolved: Resolved | None = None
    labels = np.zeros((n, 0), dtype=np.int64)
    keys: np.ndarray | None = None
    max_len: dict[str, int] = {}
    variable: list[tuple[str, str, Field]] = []
    spans = np.zeros((n, 2), dtype=np.uint32)
    spans[:, 0] = NO_SPAN
    image_feat = ""
    for i, off in enumerate(offsets.tolist()):
        try:
            data, _ = read_frame(buf, size, off, check_data=False)
            try:
                feats = parse_features(data, wanted)
            except WireError:
                read_frame(buf, size, off)  # a data CRC mismatch explains it better
                raise
            if resolved is None:
                resolved = resolve(plan, data, feats)
                head = resolved.header
                width = math.prod(head.shape)
                kind = np.int64 if np.dtype(head.dtype).kind in "iu" else np.float64
                labels = np.full((n, width), -1, dtype=kind)
                keys = np.empty(n, dtype=np.int64) if resolved.keyed else None
                variable = [(nm, ft, f) for nm, ft, f in resolved.entries if f.variable]
                max_len = {nm: 0 for nm, _ft, _f in variable}
                image_feat = next(ft for _nm, ft, f in resolved.entries if f.kind == "image")
            values: dict[str, Any] = {}
            for nm, ft, f in resolved.entries:
                values[nm] = field_value(nm, ft, f, data, feats)
            if resolved.label is not None:
                name = resolved.label
                try:  # a label is what samplers see first: NaN or a fraction is refused here
                    value = resolved.header.check(values[name], name=name)
                except SpecError as e:
                    raise FieldError.from_check(name, e) from None
                labels[i] = np.asarray(value).reshape(-1)
            for nm, _ft, f in variable:
                max_len[nm] = max(max_len[nm], lengths_of(f, values[nm]))
            bad = check_follows(resolved.entries, values)
            if bad is not None:
                raise FieldError(
                    bad[0], f"{len(values[bad[0]])} rows, but {bad[1]!r} has {len(values[bad[1]])}"
                )
            _key(resolved, data, feats, keys, i)
            span = one_bytes_span(data, feats[image_feat])  # the value field_value checked
            if span is not None and span[1] < NO_SPAN:
                spans[i] = (span[0], span[1] - span[0])
        except (FrameError, WireError, FieldError) as e:
            raise record_error(path, i, off, e) from None
    return ShardMeta(resolved, labels, keys, max_len, spans)


def _key(
    resolved: Resolved, data: memoryview, feats: dict, keys: np.ndarray | None, i: int
) -> None:
    raw = feats.get(resolved.key_feature)
    if keys is None:
        if raw is not None:
            raise FieldError(resolved.key_feature, "this record has a key but record 0 has none")
        return
    if raw is None or raw.kind != "int64":
        raise FieldError(resolved.key_feature, "no int64 key (record 0 has one)")
    vals = int64_values(data, raw)
    if len(vals) != 1 or vals[0] < 0:
        raise FieldError(
            resolved.key_feature, f"a key must be one integer >= 0, got {vals}", raw.start
        )
    keys[i] = vals[0]


def _meta_json(meta: ShardMeta) -> bytes:
    assert meta.resolved is not None
    r = meta.resolved
    d = {
        "schema": r.schema(meta.max_len).to_json(),
        "features": {n: ft for n, ft, _f in r.entries},
        "order": [n for n, _ft, _f in r.entries],
        "label": r.label,
        "keyed": r.keyed,
        "key_feature": r.key_feature,
    }
    return json.dumps(d, sort_keys=True).encode()


def _meta_from(raw: bytes, n: int) -> ShardMeta | None:
    """The cached meta, or ``None`` when the entry does not hold what its header says."""
    (_m, _v, j, _count, _size) = _HEAD.unpack_from(raw, 0)
    try:
        d = json.loads(raw[_HEAD.size : _HEAD.size + j].decode())
        schema = Schema.from_json(d["schema"])
        entries = tuple((nm, d["features"][nm], schema[nm]) for nm in d["order"])
        resolved = Resolved(entries, d["label"], bool(d["keyed"]), d["key_feature"])
    except (ValueError, KeyError, TypeError, SpecError):
        return None
    head = resolved.header
    width = math.prod(head.shape)
    pos = _HEAD.size + j + (-(_HEAD.size + j)) % 8
    at_spans = pos + 8 * n * width + (8 * n if resolved.keyed else 0)
    if len(raw) != at_spans + 8 * n:
        return None
    kind = "<i8" if np.dtype(head.dtype).kind in "iu" else "<f8"
    labels = np.frombuffer(raw, dtype=kind, count=n * width, offset=pos).reshape(n, width)
    keys = None
    if resolved.keyed:
        keys = np.frombuffer(raw, dtype="<i8", count=n, offset=pos + 8 * n * width)
    spans = np.frombuffer(raw, dtype="<u4", count=2 * n, offset=at_spans).reshape(n, 2)
    max_len = {nm: f.max_len or 0 for nm, f in schema.items() if f.variable}
    keys = None if keys is None else keys.copy()
    return ShardMeta(resolved, labels.copy(), keys, max_len, spans.astype(np.uint32))


def _meta_entry(path: str, plan: FeaturePlan, cache: bool, identity: str | None) -> str | None:
    digest = plan_digest(plan)
    return (
        cache_file("tfrecord-meta", path, f"-{digest}.stktfm", identity=identity) if cache else None
    )


def _cached_meta(entry: str | None, n: int, size: int) -> ShardMeta | None:
    got = _read_entry(entry, _META_MAGIC)
    if got is not None and got[1][3] == n and got[1][4] == size:
        return _meta_from(got[0], n)
    return None


def cached_meta(
    path: str,
    size: int,
    offsets: np.ndarray,
    plan: FeaturePlan,
    *,
    cache: bool = True,
    identity: str | None = None,
) -> ShardMeta | None:
    """What :func:`load_meta` cached for ``path`` (``identity`` as for
    :func:`cached_offsets`), without the file; ``None`` when there is none."""
    if offsets.shape[0] == 0:
        return _empty_meta()
    return _cached_meta(_meta_entry(path, plan, cache, identity), offsets.shape[0], size)


def _empty_meta() -> ShardMeta:
    return ShardMeta(None, np.zeros((0, 0), np.int64), None, {}, np.zeros((0, 2), np.uint32))


def load_meta(
    path: str,
    buf: memoryview,
    size: int,
    offsets: np.ndarray,
    plan: FeaturePlan,
    *,
    cache: bool = True,
    identity: str | None = None,
) -> ShardMeta:
    """Labels, keys and field lengths of every record of ``path``, from the cache or one
    scan (then cached). ``CorruptRecordError`` names the first record that does not fit."""
    n = offsets.shape[0]
    if n == 0:
        return _empty_meta()
    entry = _meta_entry(path, plan, cache, identity)
    meta = _cached_meta(entry, n, size)
    if meta is not None:
        return meta
    meta = _scan_meta(path, buf, size, offsets, plan)
    if entry is not None:
        js = _meta_json(meta)
        pad = b"\x00" * ((-(_HEAD.size + len(js))) % 8)
        chunks = [_HEAD.pack(_META_MAGIC, _VERSION, len(js), n, size), js, pad]
        kind = "<i8" if meta.labels.dtype.kind in "iu" else "<f8"
        chunks.append(np.ascontiguousarray(meta.labels, dtype=kind).tobytes())
        if meta.keys is not None:
            chunks.append(meta.keys.astype("<i8").tobytes())
        chunks.append(meta.spans.astype("<u4").tobytes())
        write_cache_file(entry, chunks)
    return meta
