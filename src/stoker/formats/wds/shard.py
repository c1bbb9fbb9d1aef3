"""One tar shard opened for random access: its member index (from the cache or one pass over
the headers) and a read-only memory map that member data is sliced from.

The map is opened on first use in the process that reads, and again after a fork (the
process id is checked), so no file handle crosses a process boundary.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError, SpecError
from stoker._core.schema import Field
from stoker.formats.wds.index import TarIndex, load_index
from stoker.formats.wds.layout import IMAGE_SUFFIXES, sample_crc

__all__ = ["Shard", "check_uncompressed", "decode_field", "open_shard"]

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


def _raise(path: str):  # noqa: ANN202 - a closure
    def on_problem(offset: int, reason: str) -> None:
        raise CorruptRecordError(path, offset, reason)

    return on_problem


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


class Shard:
    """One tar: ``index()``, ``view()``, per-sample ``columns`` for a suffix map, and its
    samples' CRC32Cs (``crcs()``) when a side-car ``crc`` is named."""

    def __init__(
        self,
        path: str,
        *,
        records: int | None = None,
        tar_bytes: int | None = None,
        manifest: str | None = None,
        cache: bool = True,
        crc: str | None = None,
    ) -> None:
        self.path, self.records, self.tar_bytes = path, records, tar_bytes
        self.manifest, self.cache, self.crc = manifest, cache, crc
        self._crcs: CrcCheck | None = None
        self._index: TarIndex | None = None
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._pid = -1
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        #: what the tar's bytes are filed under in the caches, for a shard in object storage
        self.identity: str | None = None

    def local(self) -> str:
        """The local file holding the tar (a shard in object storage: its pinned copy)."""
        return self.path

    def local_crc(self) -> str:
        """The local file holding the side-car (named by ``crc``)."""
        assert self.crc is not None
        return self.crc

    def crcs(self) -> CrcCheck | None:
        """The check of each sample against the side-car, read once per process; ``None``
        without one (a tar stoker did not write: its samples are read unchecked)."""
        if self.crc is None:
            return None
        if self._crcs is None:
            index = self.index()
            self._crcs = CrcCheck(index, read_crcs(self.local_crc(), len(index)))
        return self._crcs

    def _map(self) -> memoryview:
        with open(self.local(), "rb") as f:
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

    def view(self) -> memoryview:
        """The whole tar, mapped read-only in this process."""
        if self._view is None or self._pid != os.getpid():
            self._drop()
            return self._map()
        return self._view

    def index(self) -> TarIndex:
        if self._index is None:
            index = None
            if self.identity is not None and self.tar_bytes is not None:
                # a shard in object storage: its index as any process of the node built it
                index = load_index(
                    self.path,
                    None,
                    self.tar_bytes,
                    _raise(self.path),
                    cache=self.cache,
                    identity=self.identity,
                )
            if index is None:
                index = self._build_index()
            if self.records is not None and len(index) != self.records:
                raise ManifestError(
                    f"{self.manifest}: {self.path} holds {len(index)} samples, the manifest "
                    f"says {self.records}"
                )
            self._index = index
        return self._index

    def _build_index(self) -> TarIndex:
        was_open = self.is_open and self._pid == os.getpid()
        view = self.view()
        try:
            index = load_index(
                self.path,
                view,
                len(view),
                _raise(self.path),
                cache=self.cache,
                identity=self.identity,
            )
        finally:
            del view
            if not was_open:  # mapped only to index it: a set of many shards stays unmapped
                self._drop()
        assert index is not None
        return index

    def columns(self, suffixes: dict[str, str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
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
        if view is not None:
            try:
                view.release()
            except BufferError:  # a caller still holds a slice; the GC unmaps later
                pass
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def close(self) -> None:
        """Release the map (the index stays: it is small and costs a pass to rebuild)."""
        self._drop()

    @property
    def is_open(self) -> bool:
        return self._view is not None


def open_shard(paths: Mapping[str, Any], *, cache: bool = True) -> Shard:
    """The reader of one tar from its files by role (``data``: the ``.tar``, ``crc``: its
    per-sample checksums or ``None``)."""
    return Shard(paths["data"], cache=cache, crc=paths.get("crc"))
