"""One ``.tfrecord`` shard (:class:`~stoker.formats.base.Shard`): the file mapped read-only,
its record offsets and what one scan of its Examples learns (:mod:`stoker.formats.tfrecord.
index`), cached in the cache directory; a shard of a set in object storage finds them under
its cached copy's key, so a process downloads a shard only to read its records.

A read checks the record's length CRC and (``checksums=True``, the default) its data CRC, and
takes the image bytes as a view of the mapping: a read of the image and the label alone slices
the span the scan found (after checking that the bytes before it still frame a bytes value of
that length), a read of fields parses the Example, as does a record whose span is unknown or
does not check.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.crc import crc32c
from stoker._core.errors import CorruptRecordError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.base import ReadRecord, Shard, unmap
from stoker.formats.protowire import WireError, read_varint
from stoker.formats.sharded import SetPlan, ShardFiles
from stoker.formats.tfrecord.example import parse_features
from stoker.formats.tfrecord.features import (
    KEY_FEATURE,
    FieldError,
    Resolved,
    default_plan,
    field_value,
    image_hw,
    manifest_plan,
    wanted_features,
)
from stoker.formats.tfrecord.framing import HEADER, MASK_DELTA, FrameError, looks_gzip, read_frame
from stoker.formats.tfrecord.index import (
    NO_SPAN,
    ShardMeta,
    cached_meta,
    cached_offsets,
    load_meta,
    load_offsets,
    record_error,
)

__all__ = ["DEFAULT_KEYS", "GZIP_HELP", "TFRecordShard", "check_not_gzip"]

#: The feature keys of a bare file when none are asked for.
DEFAULT_KEYS = {
    "image_key": "image/encoded",
    "label_key": "image/class/label",
    "boxes_key": "image/object/bbox",
    "classes_key": "image/object/class/label",
}
GZIP_HELP = (
    "this is a GZIP-compressed TFRecord file; stoker reads TFRecord by random access (any "
    "record, in any order, from any worker), which a GZIP stream cannot give without "
    "decompressing everything before the record. Decompress it once and open the result: "
    "gunzip -k FILE.tfrecord.gz (or: python -m gzip -d FILE.tfrecord.gz)"
)
_FRAME = struct.Struct("<QI")  # a record's length and the masked CRC of its 8 bytes
_U32 = struct.Struct("<I")


def check_not_gzip(path: str, head: bytes) -> None:
    """Refuse a GZIP-compressed file with the way out (see ``GZIP_HELP``)."""
    if path.lower().endswith((".gz", ".gzip")) or looks_gzip(head):
        raise CorruptRecordError(path, 0, GZIP_HELP)


class TFRecordShard(Shard):
    """One ``.tfrecord`` file with its index and scan results; see the module docstring."""

    @classmethod
    def plan(
        cls,
        manifest: dict | None,
        where: str,
        *,
        features: dict[str, Any] | None = None,
        checksums: bool = True,
        cache: bool = True,
        **keys: str | None,
    ) -> SetPlan:
        """A manifest's features, or those named for a bare file (``DEFAULT_KEYS``)."""
        if manifest is None:
            plan = default_plan(**{**DEFAULT_KEYS, **keys}, features=features)  # type: ignore[arg-type]
        else:
            plan = manifest_plan(manifest)
        return SetPlan((plan, checksums, cache), keys_from=plan.key_feature)

    def __init__(self, files: ShardFiles, plan: SetPlan) -> None:
        features, self.checksums, cache = plan.read
        self.files, self.path = files, files.where
        self.mm: mmap.mmap | None = None
        self.view = memoryview(b"")
        self.size = 0
        kw: dict[str, Any] = {"cache": cache, "identity": files.identity}
        offsets = meta = None
        if files.identity is not None and files.size is not None:
            self.size = files.size
            offsets = cached_offsets(self.path, self.size, **kw)
            if offsets is not None:
                meta = cached_meta(self.path, self.size, offsets, features, **kw)
        if offsets is None or meta is None:
            self._map()
            try:
                offsets = load_offsets(self.path, self.view, self.size, **kw)
                meta = load_meta(self.path, self.view, self.size, offsets, features, **kw)
            except BaseException:
                self.close()
                raise
        self.offsets: np.ndarray = offsets
        self.meta: ShardMeta = meta
        self._spans: list[list[int]] | None = None
        self._labels: np.ndarray | None = None

    # ------------------------------------------------------------------ the file
    def _map(self) -> None:
        local = self.files.path("data")
        assert local is not None
        with open(local, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_not_gzip(self.path, f.read(HEADER))
            if self.mm is not None or (self.size and size != self.size):
                raise CorruptRecordError(
                    self.path,
                    None,
                    f"the file changed since it was indexed ({size} bytes now, {self.size} "
                    "then); reopen the data set",
                )
            self.size = size
            if size:
                self.mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                self.view = memoryview(self.mm)

    def close(self) -> None:
        view, mm = self.view, self.mm
        self.view, self.mm = memoryview(b""), None
        try:
            unmap(view, mm)
        finally:
            if mm is not None:
                self.files.let_go()

    def _mapped(self, r: int, key: int) -> memoryview:
        """The mapping (mapped again after a close), checked against a truncation in place:
        touching a page past the end of a file truncated in place raises SIGBUS, one size
        check per chunk turns the usual case into a clean error."""
        if self.mm is None and self.size:
            self._map()
        if self.mm is not None and self.mm.size() < self.size:
            raise CorruptRecordError(
                self.path,
                int(self.offsets[r]),
                f"record {r}: the file was truncated in place while open ({self.mm.size()} "
                f"bytes now, {self.size} at open); replace files (os.replace), do not rewrite them",
                key=key,
            )
        return self.view

    # ------------------------------------------------------------------ the contract
    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def keys(self) -> np.ndarray | None:
        res = self.meta.resolved
        return self.meta.keys if res is not None and res.keyed else None

    def labels(self) -> np.ndarray | None:
        res = self.meta.resolved
        if res is None:
            return None
        if self._labels is None:
            head = res.header
            lab = self.meta.labels.astype(head.dtype)
            shape = (-1,) if head.shape == () else (len(self), *head.shape)
            self._labels = lab.reshape(shape)
        return self._labels

    @property
    def schema(self) -> Schema:
        s = self.meta.schema()
        if s is None:  # an empty file: nothing to say of its fields
            raise CorruptRecordError(self.path, None, "the file holds no records")
        return s

    def where(self, r: int) -> tuple[int, str]:
        return int(self.offsets[r]), f"record {r}"

    def reader(self, rows: np.ndarray | None, fields: tuple[str, ...]) -> ReadRecord:
        res = self.meta.resolved
        assert res is not None
        schema = self.schema
        entries = {n: (ft, f) for n, ft, f in res.entries}  # ``fields``: stored, the set checked
        image_name = schema.image_name
        image_feat = entries[image_name][0]
        asked = [(n, entries[n][0], schema[n]) for n in fields]
        wanted = wanted_features(Resolved(tuple((n, ft, f) for n, ft, f in asked), None, False))
        wanted = (wanted - {KEY_FEATURE}) | {image_feat}
        labels, check = self.labels(), self.checksums
        assert labels is not None
        image_field = Field.image()

        def parse(r: int, key: int) -> tuple[Any, Any, dict[str, Any]]:
            view = self._mapped(r, key)
            off = int(self.offsets[r])
            try:
                data, _ = read_frame(view, self.size, off, check_data=check)
                feats = parse_features(data, wanted)
                image = field_value(image_name, image_feat, image_field, data, feats)
                out = {}
                hw = _size_of(image)
                for n, ft, f in asked:
                    out[n] = f.check(field_value(n, ft, f, data, feats, hw), name=n)
            except (FrameError, WireError, FieldError, SpecError) as e:
                raise record_error(self.path, r, off, e, key) from None
            return image, labels[r], out

        return self._image_reader(parse, labels) if not fields else parse

    def _image_reader(self, parse: ReadRecord, labels: np.ndarray) -> ReadRecord:
        """``f(r, key)`` for the image and the label alone: the record's CRCs checked, the
        image sliced at the span the scan found. A record that does not pass (a CRC, a span
        unknown or no longer framed as a bytes value of its length) goes to ``parse``, the
        full read, which raises the error that names what is wrong."""
        check = self.checksums
        offsets, starts, lengths = self._span_lists()
        unpack, u32, crc, delta = _FRAME.unpack_from, _U32.unpack_from, crc32c, MASK_DELTA
        checked = [False]

        def read(r: int, key: int) -> tuple[Any, Any, dict[str, Any]]:
            if not checked[0] or self.mm is None:
                self._mapped(r, key)
                checked[0] = True
            off, start, length = offsets[r], starts[r], lengths[r]
            if start == NO_SPAN:
                return parse(r, key)
            view = self.view
            size, stored = unpack(view, off)
            end = off + HEADER + size
            if end + 4 > self.size or start + length > size:
                return parse(r, key)
            c = crc(view[off : off + 8])
            if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != stored:
                return parse(r, key)
            data = view[off + HEADER : end]
            if check:
                c = crc(data)
                if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != u32(view, end)[0]:
                    return parse(r, key)
            if not _frames(data, start, length):
                return parse(r, key)
            return data[start : start + length], labels[r], {}

        return read

    def _span_lists(self) -> tuple[list[int], list[int], list[int]]:
        """Each record's offset and image span (start, length) as Python lists: a read looks
        them up without a NumPy scalar."""
        if self._spans is None:
            spans = self.meta.spans
            self._spans = [
                self.offsets.astype(np.int64).tolist(),
                spans[:, 0].astype(np.int64).tolist(),
                spans[:, 1].astype(np.int64).tolist(),
            ]
        offsets, starts, lengths = self._spans
        return offsets, starts, lengths


def _frames(data: memoryview, start: int, length: int) -> bool:
    """True when ``data[start:start + length]`` lies inside ``data`` and is preceded by a
    BytesList value's tag (0x0A) and the minimal varint of ``length``: the span the scan
    found still frames a bytes value of that length."""
    if start + length > len(data):
        return False
    if length < 0x80:
        return start >= 2 and data[start - 1] == length and data[start - 2] == 0x0A
    if length < 0x4000:
        return (
            start >= 3
            and data[start - 1] == length >> 7
            and data[start - 2] == (length & 0x7F) | 0x80
            and data[start - 3] == 0x0A
        )
    k = (length.bit_length() + 6) // 7
    at = start - k - 1
    if at < 0 or data[at] != 0x0A:
        return False
    try:
        value, end = read_varint(data, at + 1, start)
    except WireError:
        return False
    return value == length and end == start


def _size_of(image: memoryview) -> Callable[[], tuple[int, int]]:
    def hw() -> tuple[int, int]:
        try:
            return image_hw(image)
        except Exception as e:  # noqa: BLE001 - Pillow's errors vary by image type
            raise FieldError(
                "boxes", f"cannot read the image's size to place its boxes: {type(e).__name__}: {e}"
            ) from None

    return hw
