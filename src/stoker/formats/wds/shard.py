"""One tar shard (:class:`~stoker.formats.base.Shard`) opened for random access: its member
index (from the cache or one pass over the headers) and a read-only memory map that member
data is sliced from. A shard of a set in object storage finds its index under its cached
copy's key (any process of the node that indexed it spares the others the download).

The map is opened on first use in the process that reads, and again after a fork (the
process id is checked), so no file handle crosses a process boundary.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.base import ReadRecord, Shard, unmap
from stoker.formats.manifest import manifest_schema
from stoker.formats.sharded import SetPlan, ShardFiles
from stoker.formats.wds.index import TarIndex, load_index, parse_cache
from stoker.formats.wds.layout import (
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    RAW_FIELDS,
    field_suffixes,
    raw_schema,
    sample_crc,
)

__all__ = ["WdsShard", "check_uncompressed", "decode_field"]

_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_COMPRESSED_NAMES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def compressed_message(path: str, kind: str) -> str:
    return (
        f"{path} is {kind}-compressed; stoker reads uncompressed tar shards only (random access "
        "needs the members at fixed byte offsets). Decompress it first (for example "
        "`gunzip -k`), or `stoker convert` it"
    )


def check_uncompressed(path: str, head: bytes) -> None:
    """``CorruptRecordError`` for a compressed tar (by its first bytes or its name)."""
    for magic, kind in _COMPRESSED:
        if head.startswith(magic):
            raise CorruptRecordError(path, 0, compressed_message(path, kind))
    if path.lower().endswith(_COMPRESSED_NAMES):
        raise CorruptRecordError(path, 0, compressed_message(path, "compressed"))


def decode_field(
    view: memoryview, off: int, size: int, f: Field, name: str, suffix: str, where: tuple
) -> Any:
    """The value of field ``name`` stored in the member at ``off`` (``-1``: the sample has
    none), as ``Field.check`` gives it; ``where``: ``(path, key name, position)``."""
    path, key, pos = where
    if off < 0:
        if f.kind == "text":
            return ""
        if f.kind == "bytes":
            return b""
        raise CorruptRecordError(
            path, None, f"sample {key!r} has no '.{suffix}' member (field {name!r})", key=pos
        )
    data = view[off : off + size]
    try:
        if f.kind == "text":
            return str(data, "utf-8")
        if f.kind in ("bytes", "mask"):
            return f.check(bytes(data), name=name)
        return f.check(json.loads(bytes(data)), name=name)
    except UnicodeDecodeError as e:
        reason, at = f"'.{suffix}' is not UTF-8 text ({e.reason})", off + e.start
    except (ValueError, SpecError, RecursionError, TypeError) as e:
        reason, at = f"'.{suffix}' does not hold field {name!r}: {e}", off
    raise CorruptRecordError(path, at, f"sample {key!r}: {reason}", key=pos)


def read_crcs(path: str, samples: int) -> np.ndarray:
    """The per-sample CRC32Cs of a side-car (``layout.crc_path``) for a tar of ``samples``
    samples; ``CorruptRecordError`` naming the side-car when its size is not 4 per sample."""
    with open(path, "rb") as f:
        data = f.read(4 * samples + 1)
    if len(data) != 4 * samples:
        raise CorruptRecordError(
            path,
            None,
            f"holds {len(data)}{'+' if len(data) > 4 * samples else ''} bytes, not 4 per sample "
            f"of its tar's {samples}: the checksums cannot be trusted",
        )
    return np.frombuffer(data, dtype="<u4")


class CrcCheck:
    """Checks samples of one tar against its side-car: the index's member spans and the
    stored CRC32Cs as Python lists, so one check is a CRC per member and no NumPy scalar."""

    def __init__(self, index: TarIndex, crcs: np.ndarray) -> None:
        self.crcs: list[int] = crcs.tolist()
        self.starts: list[int] = index.starts.tolist()
        self.data: list[int] = index.m_data.tolist()
        self.size: list[int] = index.m_size.tolist()

    def problem(self, view: memoryview, j: int) -> str | None:
        """Why sample ``j``'s members do not match its stored CRC32C, or ``None``."""
        data, size = self.data, self.size
        got = sample_crc(
            [view[data[r] : data[r] + size[r]] for r in range(*self.starts[j : j + 2])]
        )
        stored = self.crcs[j]
        if got == stored:
            return None
        return f"checksum mismatch: stored crc32c {stored:#010x}, data has {got:#010x}"


class WdsShard(Shard):
    """One tar: its member index, its map and, with a side-car ``crc``, its samples'
    CRC32Cs; see the module docstring."""

    @classmethod
    def plan(cls, manifest: dict | None, where: str, *, cache: bool = True) -> SetPlan:
        """A manifest's schema (an image and its label when it declares none); a bare tar's
        is read from its members. Keys are positions, labels int64."""
        schema = None
        if manifest is not None:
            schema = manifest_schema(manifest, where) or Schema.classification()
        return SetPlan(
            (cache, where),
            schema,
            keyed=False,
            label_kind=((), "int64"),
            roles=("data", "crc", "index"),
        )

    def __init__(self, files: ShardFiles, plan: SetPlan) -> None:
        self.cache, self.manifest = plan.read
        self.declared: Schema | None = plan.schema
        self.files, self.path, self.tar_bytes = files, files.where, files.size
        self._crcs: CrcCheck | None = None
        self._index: TarIndex | None = None
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._pid = -1
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._schema: Schema | None = None

    # ------------------------------------------------------------------ the file
    def _crcs_check(self) -> CrcCheck | None:
        """The check of each sample against the side-car, read once per process; ``None``
        without one (a tar stoker did not write: its samples are read unchecked)."""
        if not self.files.has("crc"):
            return None
        if self._crcs is None:
            index = self.index()
            local = self.files.path("crc")
            assert local is not None
            self._crcs = CrcCheck(index, read_crcs(local, len(index)))
        return self._crcs

    def _map(self) -> memoryview:
        local = self.files.path("data")
        assert local is not None
        with open(local, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if self.tar_bytes is not None and size != self.tar_bytes:
                raise ManifestError(
                    f"{self.manifest}: {self.path} is {size} bytes but the manifest records "
                    f"{self.tar_bytes}; the shard was replaced or truncated"
                )
            check_uncompressed(self.path, f.read(8))
            if size:
                self._mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                self._view = memoryview(self._mm)
            else:
                self._view = memoryview(b"")
        self._pid = os.getpid()
        return self._view

    def _view_of(self) -> memoryview:
        """The whole tar, mapped read-only in this process."""
        if self._view is None or self._pid != os.getpid():
            self._drop()
            return self._map()
        return self._view

    def index(self) -> TarIndex:
        if self._index is None and self.files.has("index"):
            self._index = self._indexed()
        if self._index is None:
            index = None
            if self.files.identity is not None and self.tar_bytes is not None:
                # a shard in object storage: its index as any process of the node built it
                index = load_index(
                    self.path,
                    None,
                    self.tar_bytes,
                    cache=self.cache,
                    identity=self.files.identity,
                )
            self._index = index if index is not None else self._build_index()
        return self._index

    def _indexed(self) -> TarIndex:
        """The index ``stoker index`` wrote beside a tar it did not write (its side-car)."""
        size = self.tar_bytes or 0
        found = parse_cache(self.files.read("index", 2 * size + (1 << 16)), size)
        if found is None:
            raise CorruptRecordError(
                str(self.files.location("index")),
                None,
                f"is not the member index of {self.path} ({size} bytes): the collection "
                "changed since it was indexed; run `stoker index` again",
            )
        return found

    def _build_index(self) -> TarIndex:
        was_open = self._view is not None and self._pid == os.getpid()
        view = self._view_of()
        try:
            index = load_index(
                self.path,
                view,
                len(view),
                cache=self.cache,
                identity=self.files.identity,
            )
        finally:
            del view
            if not was_open:  # mapped only to index it: a set of many shards stays unmapped
                self.close()
        assert index is not None
        return index

    def _columns_of(self, suffixes: dict[str, str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per sample ``(offset, size)`` of the image (under ``""``) and of each field in
        ``suffixes`` (name -> suffix)."""
        if self._columns is None:
            index = self.index()
            cols = {"": index.column(IMAGE_SUFFIXES)}
            for name, suffix in suffixes.items():
                cols[name] = index.column({suffix})
            self._columns = cols
        return self._columns

    def _drop(self) -> None:
        view, mm = self._view, self._mm
        self._view = self._mm = None
        unmap(view, mm)

    def close(self) -> None:
        """Release the map (the index stays: it is small and costs a pass to rebuild)."""
        try:
            self._drop()
        finally:
            self.files.let_go()

    # ------------------------------------------------------------------ the contract
    def __len__(self) -> int:
        return len(self.index())

    def keys(self) -> None:
        return None

    def labels(self) -> np.ndarray | None:
        """Each sample's ``.cls``, or ``None`` for a tar without any."""
        index = self.index()
        return index.labels if len(index) and bool(index.has_cls[0]) else None

    def where(self, r: int) -> tuple[int, str]:
        index = self.index()
        return int(index.headers[r]), f"sample {index.key_name(r)!r}"

    @property
    def schema(self) -> Schema:
        if self._schema is None:
            self._schema = self.declared or self._raw_schema()
        return self._schema

    def _raw_schema(self) -> Schema:
        """A tar without a manifest: image, ``.cls``, and ``.txt`` and ``.json`` as text
        fields where any sample holds them."""
        index = self.index()
        lengths = {}
        for suffix, name in RAW_FIELDS.items():
            m = index.max_size(suffix)
            if m is not None:
                lengths[name] = m
        unread = sorted(
            f".{x}"
            for x in index.suffixes
            if x not in RAW_FIELDS and x != LABEL_SUFFIX and x not in IMAGE_SUFFIXES
        )
        if unread:  # fields a manifest would declare: say they are left out
            warnings.warn(
                f"{self.path}: members {', '.join(unread)} are not read: a tar without "
                "a stoker manifest is read as image, .cls, .txt and .json; open the "
                "set's NAME.stoker.json (or keep it beside the tar) to read its fields",
                stacklevel=2,
            )
        return raw_schema(lengths)

    def reader(self, rows: np.ndarray | None, fields: tuple[str, ...]) -> ReadRecord:
        """``f(r, key) -> (image memoryview, label, {field: value})``; ``key`` is the
        sample's position in the set."""
        schema = self.schema
        stored = schema.stored
        if self.declared is None:
            suffixes = {n: s for s, n in RAW_FIELDS.items() if n in schema}
        else:
            suffixes = field_suffixes(schema)
        path, index = self.path, self.index()
        cols = self._columns_of(suffixes)
        off, size = cols[""]
        labels = index.labels

        def read(r: int, key: int) -> tuple[Any, int, dict[str, Any]]:
            view = self._view_of()
            o, n = int(off[r]), int(size[r])
            check = self._crcs_check()
            if check is not None:
                bad = check.problem(view, r)
                if bad is not None:
                    head = int(index.headers[r])
                    why = f"sample {index.key_name(r)!r}: {bad}"
                    raise CorruptRecordError(path, head, why, key=key)
            if n <= 0:
                why = f"sample {index.key_name(r)!r}: its image member is empty"
                raise CorruptRecordError(path, o, why, key=key)
            out: dict[str, Any] = {}
            for name in fields:
                fo, fs = cols[name]
                where = (path, index.key_name(r), key)
                out[name] = decode_field(
                    view, int(fo[r]), int(fs[r]), stored[name], name, suffixes[name], where
                )
            return view[o : o + n], int(labels[r]), out

        return read
