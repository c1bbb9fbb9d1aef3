"""The :class:`~stoker.formats.Reader` of TFRecord: one ``.tfrecord`` file, or every shard a
TFRecord set's manifest lists, as one data set with random access by position.

Each file is memory-mapped read-only; its record offsets, labels, keys, field lengths and
image spans come from one scan cached in the cache directory
(:mod:`stoker.formats.tfrecord.index`). A read checks the record's length CRC and
(``checksums=True``, the default) its data CRC, and takes the image bytes as a view of the
mapping: a read of the image and the label alone slices the span the scan found (after
checking that the bytes before it still frame a bytes value of that length), a read of fields
parses the Example, as does a record whose span is unknown or does not check. Positions and
the files kept mapped (``MAX_OPEN_SHARDS``, least recently used unmapped first) are the shard
layer's (:mod:`stoker.formats.shards`).

The reader pickles as its configuration and reopens in the process that uses it: no mapping
crosses a fork.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.crc import crc32c
from stoker._core.errors import CorruptRecordError, SpecError, StokerFormatError
from stoker._core.schema import Field, Schema
from stoker.formats.base import Reader, ReadSample
from stoker.formats.manifest import shard_file
from stoker.formats.opening import open_set
from stoker.formats.protowire import WireError, read_varint
from stoker.formats.remote import RemoteOptions
from stoker.formats.report import spread
from stoker.formats.shardfiles import ReadsRemoteShards
from stoker.formats.shards import MAX_OPEN_SHARDS, OpenShards, ShardEntry, ShardSet, digest
from stoker.formats.tfrecord.example import parse_features
from stoker.formats.tfrecord.features import (
    KEY_FEATURE,
    FieldError,
    Resolved,
    default_plan,
    describe_fields,
    field_value,
    image_hw,
    manifest_plan,
    same_fields,
    wanted_features,
)
from stoker.formats.tfrecord.framing import (
    HEADER,
    MASK_DELTA,
    FrameError,
    read_frame,
)
from stoker.formats.tfrecord.index import (
    NO_SPAN,
    record_error,
)
from stoker.formats.tfrecord.remote import RemoteShard
from stoker.formats.tfrecord.shard import Shard

__all__ = ["MAX_OPEN_SHARDS", "TFRecordReader", "manifest_plan"]

#: ``TFRecordReader``'s feature keys when none are asked for.
_DEFAULT_KEYS = {
    "image_key": "image/encoded",
    "label_key": "image/class/label",
    "boxes_key": "image/object/bbox",
    "classes_key": "image/object/class/label",
}
_FRAME = struct.Struct("<QI")  # a record's length and the masked CRC of its 8 bytes
_U32 = struct.Struct("<I")


class TFRecordReader(ReadsRemoteShards, Reader):
    """TFRecord data set; see the module docstring and the package README.

    ``path``: a ``.tfrecord`` file, or a ``NAME.stoker.json`` of a TFRecord set.
    For a bare file, ``image_key``, ``label_key``, ``boxes_key`` (the prefix of the four
    ``/xmin`` ... features) and ``classes_key`` name the features (``None`` turns the label,
    boxes or classes off) and ``features={field: feature}`` (or ``{field: (feature,
    Field)}``) adds fields; a manifest names its own. ``checksums=False`` skips the data CRC
    on reads (the length CRC is always checked). ``cache=False`` neither reads nor writes the
    index cache. ``path`` may be a manifest's URL (``remote``: how to reach and cache it):
    each shard is read from a pinned copy in the node's shard cache (``docs/remote.md``).
    """

    format = "tfrecord"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        image_key: str = _DEFAULT_KEYS["image_key"],
        label_key: str | None = _DEFAULT_KEYS["label_key"],
        boxes_key: str | None = _DEFAULT_KEYS["boxes_key"],
        classes_key: str | None = _DEFAULT_KEYS["classes_key"],
        features: dict[str, Any] | None = None,
        checksums: bool = True,
        cache: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        self._config: dict[str, Any] = {
            "path": os.fspath(path),
            "image_key": image_key,
            "label_key": label_key,
            "boxes_key": boxes_key,
            "classes_key": classes_key,
            "features": dict(features or {}),
            "checksums": bool(checksums),
            "cache": bool(cache),
            "remote": remote,
        }
        self._opened: Any = None
        self._init_state()
        self._ensure()

    def _init_state(self) -> None:
        self.path = self._config["path"]
        self.checksums = self._config["checksums"]
        self._ready = False
        self._shards: list[Shard] = []
        self._open: OpenShards[None] = OpenShards(MAX_OPEN_SHARDS)
        self._class_names: list[str] | None = None
        self._spans: tuple[np.ndarray, ...] | None = None
        self._remote = None

    # ------------------------------------------------------------------ lifecycle
    def _reopen(self, config: dict[str, Any], opened: Any) -> None:
        self._config, self._opened = config, opened
        self._init_state()  # reopened on first use, in the process that uses it

    def _ensure(self) -> None:
        if self._ready:
            return
        c = self._config
        asked = c["features"] or any(c[k] != v for k, v in _DEFAULT_KEYS.items())
        # a stoker shard with its manifest beside it: read with the manifest's features
        src = open_set(
            self.path, self.format, remote=c.get("remote"), opened=self._opened, sibling=not asked
        )
        entries: list[ShardEntry | None] = [None]  # a bare file
        if (m := src.manifest) is None:
            plan = default_plan(**{k: c[k] for k in (*_DEFAULT_KEYS, "features")})
        else:
            plan, self._class_names, entries = manifest_plan(m), src.class_names, [*src.entries]
        self._remote = src.remote
        if self._remote is not None:
            self._remote.on_release = self._released
        try:
            for j, s in enumerate(entries):
                if self._remote is None:
                    f = src.path if s is None else shard_file(str(src.manifest_path), s, "data")
                    sh = Shard(str(f), plan, cache=c["cache"])
                else:
                    sh = RemoteShard(self._remote, j, plan, cache=c["cache"])
                self._shards.append(self._check_shard(sh, s))
            self._combine()
        except BaseException:
            self.close()
            raise
        self._ready = True

    def _check_shard(self, sh: Shard, s: ShardEntry | None) -> Shard:
        """``sh`` checked against its manifest entry ``s`` (``None``: a bare file)."""
        where = f"{sh.path} (listed in {self.path})"
        if s is not None and s.bytes is not None and sh.size != s.bytes:
            sh.unmap()
            raise StokerFormatError(f"{where}: {sh.size} bytes, the manifest says {s.bytes}")
        if s is not None and sh.offsets.shape[0] != s.records:
            sh.unmap()
            raise StokerFormatError(
                f"{where}: {sh.offsets.shape[0]} records, the manifest says {s.records}"
            )
        self._touch(len(self._shards), sh)
        return sh

    def _touch(self, j: int, sh: Shard) -> None:
        """Mark shard ``j`` used; unmap the least recently used beyond the limit."""
        for old, _ in self._open.use(j):
            self._shards[old].unmap()  # the newest, ``sh``, is never the oldest

    def _combine(self) -> None:
        """The set's arrays (starts, keys, labels) and schema from its shards."""
        metas = [s.meta for s in self._shards]
        counts = np.array([s.offsets.shape[0] for s in self._shards], dtype=np.int64)
        total = int(counts.sum())
        if total == 0:
            raise StokerFormatError(f"{self.path}: the data set has 0 records")
        self._set = ShardSet(counts)
        self._starts = self._set.starts
        first = next(j for j, m in enumerate(metas) if m.resolved is not None)
        res = metas[first].resolved
        assert res is not None
        for j, m in enumerate(metas):
            if m.resolved is not None and not same_fields(m.resolved, res):
                raise StokerFormatError(
                    f"{self._shards[j].path}: its records hold other fields than "
                    f"{self._shards[first].path} ({describe_fields(m.resolved)} vs {describe_fields(res)})"
                )
        self._resolved = res
        max_len: dict[str, int] = {}
        for m in metas:
            for n, v in m.max_len.items():
                max_len[n] = max(max_len.get(n, 0), v)
        self._schema = res.schema(max_len)
        head = res.header
        full = [m.labels for m in metas if m.resolved is not None]
        lab = np.concatenate(full).astype(head.dtype)
        self._labels = lab.reshape(-1) if head.shape == () else lab.reshape(total, *head.shape)
        self._labels.setflags(write=False)
        if res.keyed:
            self._keys = np.concatenate([m.keys for m in metas if m.keys is not None])
            firsts = np.unique(self._keys, return_index=True)[1]
            if firsts.shape[0] != total:  # the first record whose key an earlier one holds
                i = int(np.setdiff1d(np.arange(total), firsts)[0])
                j, r = self._set.locate(i)
                key = int(self._keys[i])
                why = f"record {r}: key {key} ({res.key_feature}) is an earlier record's; keys must be unique in a set"
                raise CorruptRecordError(
                    self._shards[j].path, int(self._shards[j].offsets[r]), why, key=key
                )
        else:
            self._keys = np.arange(total, dtype=np.int64)
        self._keys.setflags(write=False)

    def _released(self, j: int) -> None:
        """A remote set lets go of shard ``j``: unmap it first."""
        self._open.pop(j)
        self._shards[j].unmap()

    def _shard_set(self) -> ShardSet:
        self._ensure()
        return self._set

    def close(self) -> None:
        for sh in self._shards:
            sh.unmap()
        self._open.clear()  # every shard is unmapped above
        if self._remote is not None:
            self._remote.close()

    def __repr__(self) -> str:
        n = len(self) if self._ready else "?"
        return f"TFRecordReader({self.path!r}, {n} records)"

    # ------------------------------------------------------------------ the contract
    def __len__(self) -> int:
        self._ensure()
        return int(self._starts[-1])

    def keys(self) -> np.ndarray:
        self._ensure()
        return self._keys

    @property
    def schema(self) -> Schema:
        self._ensure()
        return self._schema

    def labels(self) -> np.ndarray:
        """Every label: ``(N,)`` (or ``(N, k)``) of the label feature's type (int64 for an
        int64 list, float32 for a float list; -1 for a set without a label feature)."""
        self._ensure()
        return self._labels

    @property
    def class_names(self) -> list[str] | None:
        self._ensure()
        return self._class_names

    def files(self) -> list[str]:
        """The TFRecord files, in position order."""
        self._ensure()
        return [s.path for s in self._shards]

    def shard_sizes(self) -> np.ndarray:
        """Records per ``.tfrecord`` file, in manifest order (a single file is one shard)."""
        self._ensure()
        return self._set.shard_sizes()

    def where(self, i: int) -> tuple[int, int]:
        """``(shard number, record number in that file)`` of position ``i``."""
        self._ensure()
        return self._set.locate(i, self.path)

    def locate(self, i: int) -> tuple[str, int]:
        """``(file, byte offset of the record's header)`` of position ``i``."""
        j, r = self.where(i)
        return self._shards[j].path, int(self._shards[j].offsets[r])

    def summary(self) -> dict:
        """What ``stoker inspect`` shows: shards, bytes, bytes per record (min, median, mean,
        max over every record, framing included), the features read, the label, the keys."""
        self._ensure()
        sizes = np.concatenate(
            [np.diff(np.append(s.offsets, s.size)) for s in self._shards if s.offsets.size]
        )
        res = self._resolved
        return {
            "shards": len(self._shards),
            "bytes": int(sum(s.size for s in self._shards)),
            "bytes_per_record": spread(sizes),
            "features": {n: ft for n, ft, _f in res.entries},
            "label_feature": next((ft for n, ft, _f in res.entries if n == res.label), None),
            "keys": res.key_feature if res.keyed else "record positions",
        }

    def describe(self, i: int) -> str:
        j, r = self.where(i)
        sh = self._shards[j]
        return f"record {r} (key {self.key(i)}) at byte offset {int(sh.offsets[r])} of {sh.path}"

    def fingerprint(self) -> dict:
        self._ensure()
        sha = digest([np.ascontiguousarray(self._keys, dtype="<i8"), self._labels])
        return {"format": self.format, "records": len(self), "sha256": sha}

    def _mapped(self, j: int) -> Shard:
        sh = self._shards[j]
        if sh.mm is None and sh.size:
            sh.map()
        self._touch(j, sh)
        return sh

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        """``f(i) -> (image view, label, key, {field: value})``; see :class:`Reader`. The image
        is a view of the mapping, valid until the reader is closed."""
        self._ensure()
        self._focus(indices)  # a remote set holds only the shards this chunk reads
        res, schema = self._resolved, self._schema
        entries = {n: (ft, f) for n, ft, f in res.entries}
        names = tuple(n for n in fields if n not in schema or schema[n].kind != "size")
        for n in names:
            if n not in entries or schema[n].kind == "image" or schema[n].header:
                raise SpecError(f"{self.path}: no stored field {n!r}; it has {list(schema.extra)}")
        image_name = schema.image_name
        image_feat = entries[image_name][0]
        asked = [(n, entries[n][0], schema[n]) for n in names]
        wanted = wanted_features(Resolved(tuple((n, ft, f) for n, ft, f in asked), None, False))
        wanted = (wanted - {KEY_FEATURE}) | {image_feat}
        labels, keys, check = self._labels, self._keys, self.checksums
        image_field = Field.image()

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            j, r = self.where(i)
            sh = self._mapped(j)
            key = int(keys[i])
            off = int(sh.offsets[r])
            sh.check_size(r, key)
            try:
                data, _ = read_frame(sh.view, sh.size, off, check_data=check)
                feats = parse_features(data, wanted)
                image = field_value(image_name, image_feat, image_field, data, feats)
                out = {}
                hw = _size_of(image)
                for n, ft, f in asked:
                    out[n] = f.check(field_value(n, ft, f, data, feats, hw), name=n)
            except (FrameError, WireError, FieldError, SpecError) as e:
                raise record_error(sh.path, r, off, e, key) from None
            return image, labels[i], key, out

        return read if names else self._image_reader(read, indices)

    def _image_reader(self, parse: ReadSample, indices: np.ndarray | None) -> ReadSample:
        """``f(i)`` for the image and the label alone: the record's CRCs checked, the image
        sliced at the span the scan found. Any record that does not pass (a CRC, a span
        unknown or no longer framed as a bytes value of its length) goes to ``parse``, the
        full read, which raises the error that names what is wrong. As RecordIO's plain
        reader: make one per chunk; the in-place truncation check is done once per shard
        per reader, and ``indices`` (the chunk) are looked up in one vectorised step."""
        labels, check = self._labels, self.checksums
        shards, table = self._shards, self._span_table()
        n = int(self._starts[-1])
        known: dict[int, tuple[int, int, int, int, int]] = {}
        if indices is not None:
            pos = np.asarray(indices, dtype=np.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < n)]
            cols = [c[pos].tolist() for c in table]
            known = dict(zip(pos.tolist(), zip(*cols, strict=True)))
        checked: set[int] = set()
        unpack, u32, crc, delta = _FRAME.unpack_from, _U32.unpack_from, crc32c, MASK_DELTA

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            got = known.get(i)
            if got is None:
                if not 0 <= i < n:
                    return parse(i)
                got = tuple(int(c[i]) for c in table)  # type: ignore[assignment]
            j, off, key, start, length = got  # type: ignore[misc]
            sh = shards[j]
            if j not in checked or sh.mm is None:
                sh = self._mapped(j)
                sh.check_size(int(i - self._starts[j]), key)
                checked.add(j)
            if start == NO_SPAN:
                return parse(i)
            view = sh.view
            size, stored = unpack(view, off)
            end = off + HEADER + size
            if end + 4 > sh.size or start + length > size:
                return parse(i)
            c = crc(view[off : off + 8])
            if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != stored:
                return parse(i)
            data = view[off + HEADER : end]
            if check:
                c = crc(data)
                if (((c >> 15) | (c << 17)) + delta) & 0xFFFFFFFF != u32(view, end)[0]:
                    return parse(i)
            if not _frames(data, start, length):
                return parse(i)
            return data[start : start + length], labels[i], key, {}

        return read

    def _span_table(self) -> tuple[np.ndarray, ...]:
        """Per position: shard, record offset, key, image span start and length (computed
        once per reader object, in the process that reads)."""
        got = self._spans
        if got is None:
            shards = self._shards
            counts = [s.offsets.shape[0] for s in shards]
            got = (
                np.repeat(np.arange(len(shards), dtype=np.int64), counts),
                np.concatenate([s.offsets for s in shards]).astype(np.int64),
                np.asarray(self._keys, dtype=np.int64),
                np.concatenate([s.meta.spans[:, 0] for s in shards]).astype(np.int64),
                np.concatenate([s.meta.spans[:, 1] for s in shards]).astype(np.int64),
            )
            self._spans = got
        return got


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
