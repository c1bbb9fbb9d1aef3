"""Random-access reader for dmlc RecordIO files (``.rec`` + ``.idx``).

The ``.rec`` is memory-mapped read-only. Every length read from the file is checked against
the file size *before* anything is sliced or allocated, so a corrupt length can never make the
reader allocate gigabytes; problems raise :class:`CorruptRecordError` naming the file, the
record key, the byte offset and the ``.idx`` line.

A reader pickles as its paths and options; the copy in a worker process reopens the files
(and finds the binary index cache already built).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError
from stoker.formats.base import Reader
from stoker.formats.recordio.header import (
    IR_FORMAT,
    IR_SIZE,
    LENGTH_MASK,
    MAGIC,
    MAGIC_BYTES,
    IRHeader,
    unpack_header,
)
from stoker.formats.recordio.index import IndexTable, load_index
from stoker.formats.recordio.labelcache import read_label_cache, write_label_cache

__all__ = [
    "ImageRecords",
    "RecordFile",
    "default_crc_path",
    "default_idx_path",
    "iter_records",
    "scan_offsets",
]

_HEAD = struct.Struct("<II")
_HEAD_IR = struct.Struct("<II" + IR_FORMAT[1:])  # record header + IRHeader, one unpack


def _stem(rec_path: str) -> str:
    return rec_path[:-4] if rec_path.endswith(".rec") else rec_path


def default_idx_path(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.idx`` beside ``NAME.rec``."""
    return _stem(os.fspath(rec_path)) + ".idx"


def default_crc_path(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.crc32c`` beside ``NAME.rec``."""
    return _stem(os.fspath(rec_path)) + ".crc32c"


def _pad4(n: int) -> int:
    return (n + 3) & ~3


class _Problem(Exception):
    """Internal: a framing problem at ``offset`` (turned into CorruptRecordError by callers)."""

    def __init__(self, offset: int, reason: str, *, truncated: bool = False) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.truncated = truncated


def _part(buf: Any, size: int, pos: int) -> tuple[int, int]:
    """``(cflag, length)`` of the part at ``pos``; checks magic and that it fits the file."""
    if pos + 8 > size:
        raise _Problem(
            pos,
            f"truncated: a record header needs 8 bytes at {pos}, the file ends at {size}",
            truncated=True,
        )
    magic, lrec = _HEAD.unpack_from(buf, pos)
    if magic != MAGIC:
        raise _Problem(pos, f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
    cflag, length = lrec >> 29, lrec & LENGTH_MASK
    if pos + 8 + _pad4(length) > size:  # dmlc reads the padding too
        raise _Problem(
            pos,
            f"truncated: record part of {length} bytes (+ padding) at {pos} runs past the end "
            f"of the file ({size} bytes)",
            truncated=True,
        )
    return cflag, length


def _record(buf: Any, view: memoryview, size: int, off: int) -> tuple[memoryview, int]:
    """``(payload, end)`` of the record starting at ``off``; ``end`` is past its padding."""
    cflag, length = _part(buf, size, off)
    if cflag == 0:
        return view[off + 8 : off + 8 + length], off + 8 + _pad4(length)
    if cflag != 1:
        raise _Problem(
            off,
            f"broken multi-part record: first part has cflag {cflag} (expected 0 or 1); "
            "the offset points into the middle of a split record",
        )
    spans = [(off + 8, off + 8 + length)]  # no views kept: an error must not pin the mapping
    pos = off + 8 + _pad4(length)
    while True:
        try:
            cflag, length = _part(buf, size, pos)
        except _Problem as e:
            raise _Problem(
                off, f"in part at {pos} of a multi-part record: {e.reason}", truncated=e.truncated
            ) from None
        if cflag not in (2, 3):
            raise _Problem(
                off,
                f"broken multi-part record: part at {pos} has cflag {cflag}, expected 2 or 3 "
                "after a first part",
            )
        spans.append((pos + 8, pos + 8 + length))
        pos += 8 + _pad4(length)
        if cflag == 3:
            return memoryview(MAGIC_BYTES.join([buf[a:b] for a, b in spans])), pos


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
                        payload, end = _record(mm, view, size, pos)
                    except _Problem as e:
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
                    cflag, length = _part(mm, size, pos)
                    if cflag not in (0, 1):
                        raise _Problem(
                            pos, f"broken multi-part record: stray part with cflag {cflag}"
                        )
                    start = pos
                    pos += 8 + _pad4(length)
                    while cflag in (1, 2):
                        try:
                            cflag, length = _part(mm, size, pos)
                        except _Problem as e:
                            raise _Problem(start, f"in part at {pos}: {e.reason}") from None
                        if cflag not in (2, 3):
                            raise _Problem(
                                start, f"broken multi-part record: part at {pos} has cflag {cflag}"
                            )
                        pos += 8 + _pad4(length)
                except _Problem as e:
                    raise CorruptRecordError(path, e.offset, e.reason) from None
                out.append(start)
    return np.asarray(out, dtype=np.int64)


class RecordFile(Reader):
    """Random access to a ``.rec`` file through its ``.idx``.

    ``idx_path`` defaults to ``NAME.idx`` beside ``NAME.rec``; when that does not exist the
    ``.rec`` is walked once and the keys are the positions ``0..N-1`` (like MXNet's
    sequential reader). ``verify_checksums=True`` checks every ``read`` against the
    ``NAME.crc32c`` side file (``crc_path``). ``cache=False`` skips the binary index cache.

    Attributes ``class_names``, ``manifest`` (set by :func:`open_records`) and
    ``identity_ranges``/``image_keys`` (insightface layout) are ``None`` for plain files.
    """

    def __init__(
        self,
        rec_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | None = None,
        *,
        cache: bool = True,
        verify_checksums: bool = False,
        crc_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = os.fspath(rec_path)
        if idx_path is None:
            guess = default_idx_path(self.path)
            self.idx_path: str | None = guess if os.path.exists(guess) else None
        else:
            self.idx_path = os.fspath(idx_path)
        self._cache = bool(cache)
        self.verify_checksums = bool(verify_checksums)
        self.crc_path = os.fspath(crc_path) if crc_path is not None else None
        self.class_names: list[str] | None = None
        self.manifest: dict | None = None
        self._open()

    # ------------------------------------------------------------------ lifecycle
    def _open(self) -> None:
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._crc: np.ndarray | None = None
        self._identity: Any = False  # not yet looked at
        self._key_pos: tuple[np.ndarray, np.ndarray | None] | None = None
        self._closed = False
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            self.size = st.st_size
            if self.size:
                self._mm = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
                self._view = memoryview(self._mm)
        try:
            if self.idx_path is not None:
                self._table = load_index(self.idx_path, rec_size=self.size, cache=self._cache)
            else:
                offsets = scan_offsets(self.path)
                self._table = IndexTable(np.arange(offsets.shape[0], dtype=np.int64), offsets)
            if self.verify_checksums:
                self._load_crc()
        except BaseException:
            self.close()
            raise

    def _load_crc(self) -> None:
        cpath = self.crc_path or default_crc_path(self.path)
        if not os.path.exists(cpath):
            raise CorruptRecordError(
                cpath, None, "verify_checksums=True but the checksum file does not exist"
            )
        self.crc_path = cpath
        n = len(self._table)
        size = os.path.getsize(cpath)
        if size != 4 * n:
            raise CorruptRecordError(
                cpath,
                None,
                f"checksum file holds {size} bytes; {n} records need {4 * n} "
                "(one little-endian uint32 per record)",
            )
        self._crc = np.fromfile(cpath, dtype="<u4", count=n)

    def close(self) -> None:
        """Release the mapping. Views returned by ``read`` must not be used afterwards."""
        self._closed = True
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:  # a caller still holds a slice; the GC unmaps later
                pass
            self._view = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass
            self._mm = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "idx_path": self.idx_path,
            "cache": self._cache,
            "verify_checksums": self.verify_checksums,
            "crc_path": self.crc_path,
            "class_names": self.class_names,
            "manifest": self.manifest,
        }

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self.idx_path = state["idx_path"]
        self._cache = state["cache"]
        self.verify_checksums = state["verify_checksums"]
        self.crc_path = state["crc_path"]
        self.class_names = state["class_names"]
        self.manifest = state["manifest"]
        self._open()

    def __repr__(self) -> str:
        return f"RecordFile({self.path!r}, {len(self)} records)"

    # ------------------------------------------------------------------ index
    def __len__(self) -> int:
        return len(self._table)

    @property
    def keys(self) -> np.ndarray:
        """int64 keys in ``.idx`` order (read-only)."""
        return self._table.keys

    @property
    def offsets(self) -> np.ndarray:
        """int64 byte offsets of each record's first part, in ``.idx`` order."""
        return self._table.offsets

    @property
    def idx_sha256(self) -> str | None:
        return self._table.sha256

    def key(self, i: int) -> int:
        return int(self._table.keys[self._check_index(i)])

    def offset(self, i: int) -> int:
        return int(self._table.offsets[self._check_index(i)])

    def idx_line(self, i: int) -> int | None:
        """1-based ``.idx`` line of position ``i`` (``None`` without an ``.idx``)."""
        return self._table.line_of(self._check_index(i)) if self.idx_path else None

    def position(self, key: int) -> int:
        """Position of ``key``; ``KeyError`` when absent."""
        return int(self.positions([int(key)])[0])

    def positions(self, keys: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions of ``keys`` (int64 array); ``KeyError`` naming the first missing key.
        Vectorised (binary search); no per-key dict, even for millions of keys."""
        want = np.asarray(keys, dtype=np.int64).reshape(-1)
        if self._key_pos is None:
            have = self._table.keys
            if have.shape[0] < 2 or bool(np.all(have[1:] > have[:-1])):
                self._key_pos = (have, None)
            else:
                perm = np.argsort(have, kind="stable")
                self._key_pos = (have[perm], perm)
        sorted_keys, order = self._key_pos
        pos = np.searchsorted(sorted_keys, want)
        found = pos < sorted_keys.shape[0]
        found[found] = sorted_keys[pos[found]] == want[found]
        if not bool(found.all()):
            missing = int(want[np.flatnonzero(~found)[0]])
            raise KeyError(f"key {missing} is not in {self.path}")
        return (pos if order is None else order[pos]).astype(np.int64)

    # ------------------------------------------------------------------ reading
    def _error(self, i: int, offset: int | None, reason: str) -> CorruptRecordError:
        return CorruptRecordError(
            self.path,
            offset,
            reason,
            key=int(self._table.keys[i]),
            idx_line=self._table.line_of(i) if self.idx_path else None,
        )

    def _buf(self) -> tuple[Any, memoryview]:
        if self._closed:
            raise ValueError(f"{self.path}: the reader is closed")
        if self._view is None:
            return b"", memoryview(b"")
        return self._mm, self._view

    def _check_not_shrunk(self, i: int, off: int) -> None:
        # Touching a page past the end of a file truncated in place kills the process with
        # SIGBUS; one fstat per read turns the common case into a clean error instead.
        if self._mm is not None and self._mm.size() < self.size:
            raise self._error(
                i,
                off,
                f"the .rec was truncated in place while open ({self._mm.size()} bytes now, "
                f"{self.size} at open); files must be replaced (os.replace), not rewritten",
            )

    def read(self, i: int) -> memoryview:
        """The whole dmlc payload of position ``i`` (IRHeader + image). Zero-copy for
        single-part records; split records are reassembled with their magic restored."""
        return self._payload(self._check_index(i))

    def _payload(self, i: int) -> memoryview:
        """``read`` of a position already checked (and made non-negative)."""
        off = int(self._table.offsets[i])
        mm, view = self._buf()
        self._check_not_shrunk(i, off)
        try:
            payload, _ = _record(mm, view, self.size, off)
        except _Problem as e:
            raise self._error(i, e.offset if e.offset != off else off, e.reason) from None
        if self._crc is not None:
            import crc32c

            got = crc32c.crc32c(payload)
            want = int(self._crc[i])
            if got != want:
                raise self._error(
                    i, off, f"checksum mismatch: stored crc32c 0x{want:08x}, data has 0x{got:08x}"
                )
        return payload

    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        """``(IRHeader, image bytes)`` of position ``i``."""
        i = self._check_index(i)
        payload = self._payload(i)
        try:
            return unpack_header(payload)
        except ValueError as e:
            raise self._error(i, int(self._table.offsets[i]), str(e)) from None

    def plain_reader(
        self, positions: Sequence[int] | np.ndarray | None = None
    ) -> Callable[[int], tuple[float, memoryview, int] | None] | None:
        """A reader for hot loops over the common record: ``f(i)`` gives ``(label, image bytes,
        key)`` of position ``i`` when that record is one part with one float label, else
        ``None`` (the caller then reads it with :meth:`read_header`, which also raises the
        error that names what is wrong). ``None`` instead of a reader when checksums are on or
        the file shrank since it was opened. Make one per batch or so: the truncation check
        that :meth:`read` does on every call is done once, here.

        ``positions``: the positions about to be read (a loader's chunk). Their offsets and
        keys are then gathered in one vectorised step, instead of one index lookup each
        between two decodes (which had evicted the index's cache lines and TLB entries:
        about 0.8 us an image, measured in a loader worker); any other position still works."""
        mm, view = self._buf()
        if self._crc is not None or mm is None or mm.size() < self.size:
            return None
        offsets, keys, size, n = self._table.offsets, self._table.keys, self.size, len(self)
        unpack, magic_ok, mask = _HEAD_IR.unpack_from, MAGIC, LENGTH_MASK
        first = 8 + IR_SIZE
        known: dict[int, tuple[int, int]] = {}
        if positions is not None:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < n)]
            known = dict(
                zip(pos.tolist(), zip(offsets[pos].tolist(), keys[pos].tolist(), strict=True))
            )

        def read(i: int) -> tuple[float, memoryview, int] | None:
            got = known.get(i)
            if got is not None:
                off, key = got
            elif 0 <= i < n:
                off, key = int(offsets[i]), int(keys[i])
            else:
                return None
            if off + first > size:
                return None
            magic, lrec, flag, label, _id, _id2 = unpack(mm, off)
            length = lrec & mask
            if magic != magic_ok or lrec > mask or flag or length < IR_SIZE:
                return None
            if off + 8 + ((length + 3) & ~3) > size:  # dmlc reads the padding too
                return None
            return label, view[off + first : off + 8 + length], key

        return read

    def read_key(self, key: int) -> memoryview:
        return self.read(self.position(key))

    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Labels of all records (or of ``positions``) without decoding images.

        float32 ``(N,)`` when every selected record has ``flag == 0``, ``(N, k)`` when every
        one has ``k`` labels; ``ValueError`` when the selection mixes label counts.
        Vectorised over the mapping for single-part records.
        """
        if positions is None:
            return self._run_labels(0, len(self))
        return self._labels_at(np.asarray(positions, dtype=np.int64).reshape(-1))

    def _run_labels(self, first: int, n: int) -> np.ndarray:
        """Labels of positions ``first .. first + n - 1``, through the ``NAME.rec.stklab``
        cache (see labelcache)."""
        if self._cache:
            cached = read_label_cache(self.path, self.idx_path, n, first)
            if cached is not None:
                return cached
        out = self._labels_at(np.arange(first, first + n, dtype=np.int64))
        if self._cache and n:
            write_label_cache(self.path, self.idx_path, out, first)
        return out

    def _labels_at(self, pos: np.ndarray) -> np.ndarray:
        n = len(self)
        if pos.size and (pos.min() < -n or pos.max() >= n):
            raise IndexError(f"positions out of range for {n} records")
        pos = np.where(pos < 0, pos + n, pos)
        if pos.size == 0:
            return np.zeros(0, dtype=np.float32)
        offs = self._table.offsets[pos]
        mm, _ = self._buf()
        self._check_not_shrunk(int(pos[0]), int(offs[0]))
        words = np.frombuffer(mm, dtype="<u4", count=self.size // 4)
        try:
            nwords = words.shape[0]
            # header words may lie past EOF for truncated files: clip, then check
            w0 = offs // 4
            ok = w0 + 5 < nwords
            w0c = np.where(ok, w0, 0)
            magic = words[w0c]
            lrec = words[w0c + 1]
            cflag = lrec >> 29
            length = (lrec & LENGTH_MASK).astype(np.int64)
            flag = words[w0c + 2].astype(np.int64)
            simple = (
                ok
                & (magic == MAGIC)
                & (cflag == 0)
                & (length >= IR_SIZE)
                & (offs + 8 + ((length + 3) & ~3) <= self.size)
                & (flag * 4 <= length - IR_SIZE)
            )
            flags = flag.copy()
            slow = np.flatnonzero(~simple)
            slow_labels: dict[int, Any] = {}
            for j in slow.tolist():
                h, _ = self.read_header(int(pos[j]))  # raises the precise error
                flags[j] = h.flag
                slow_labels[j] = h.label
            kinds = np.unique(flags)
            if kinds.shape[0] > 1:
                raise ValueError(
                    f"{self.path}: records carry different label counts ({kinds.tolist()}); "
                    "pass positions= that select records of one layout"
                )
            k = int(kinds[0])
            fast = np.flatnonzero(simple)
            if k == 0:
                out = np.empty(pos.shape[0], dtype=np.float32)
                out[fast] = words[w0c[fast] + 3].view("<f4")
            else:
                out = np.empty((pos.shape[0], k), dtype=np.float32)
                base = (w0c[fast] + 8)[:, None] + np.arange(k)[None, :]
                out[fast] = words[base].view("<f4")
            for j, lab in slow_labels.items():
                out[j] = lab
            return out
        finally:
            del words

    # ------------------------------------------------------------------ insightface
    def _detect_identity(self) -> None:
        self._identity = _detect_identity(self)

    @property
    def identity_ranges(self) -> np.ndarray | None:
        """insightface layout: int64 ``(n_identities, 2)`` of ``[start_key, end_key)`` image
        key ranges, row ``j`` for identity record key ``first_identity_key + j``; else None."""
        if self._identity is False:
            self._detect_identity()
        return None if self._identity is None else self._identity.ranges

    @property
    def image_keys(self) -> np.ndarray | None:
        """insightface layout: the keys that are images (``1..first_identity_key-1``)."""
        if self._identity is False:
            self._detect_identity()
        return None if self._identity is None else self._identity.image_keys

    @property
    def image_positions(self) -> np.ndarray | None:
        """insightface layout: positions of the image records (for ``read``/``labels``)."""
        if self._identity is False:
            self._detect_identity()
        return None if self._identity is None else self._identity.image_positions

    def images(self) -> Reader:
        """The image records only: for insightface sets a view that skips the header and
        identity records (positions ``0..M-1`` map to ``image_positions``); else ``self``."""
        if self.image_positions is None:
            return self
        return ImageRecords(self)

    @classmethod
    def scan(cls, rec_path: str | os.PathLike[str], **kwargs: Any) -> RecordFile:
        """Open a ``.rec`` without its ``.idx``: walk it; keys are positions ``0..N-1``."""
        self = cls.__new__(cls)
        self.path = os.fspath(rec_path)
        self.idx_path = None
        self._cache = bool(kwargs.get("cache", True))
        self.verify_checksums = bool(kwargs.get("verify_checksums", False))
        crc = kwargs.get("crc_path")
        self.crc_path = os.fspath(crc) if crc is not None else None
        self.class_names = None
        self.manifest = None
        self._open()
        return self


class ImageRecords(Reader):
    """The image records of an insightface-layout :class:`RecordFile`, as positions
    ``0..M-1``; same reading API. Pickles as its parent (paths) and re-derives the positions."""

    def __init__(self, parent: RecordFile) -> None:
        pos = parent.image_positions
        if pos is None:
            raise ValueError(f"{parent.path} is not an insightface-layout set")
        self.parent = parent
        self._pos = pos

    def __getstate__(self) -> dict:
        return {"parent": self.parent}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["parent"])  # type: ignore[misc]

    def __len__(self) -> int:
        return int(self._pos.shape[0])

    def __repr__(self) -> str:
        return f"ImageRecords({self.parent.path!r}, {len(self)} images)"

    def __getattr__(self, name: str) -> Any:
        # class_names, manifest, identity_ranges, image_keys, path, ... come from the parent
        if name in ("parent", "_pos"):
            raise AttributeError(name)
        return getattr(self.parent, name)

    def _p(self, i: int) -> int:
        return int(self._pos[self._check_index(i)])

    @property
    def keys(self) -> np.ndarray:
        return self.parent.keys[self._pos]

    @property
    def offsets(self) -> np.ndarray:
        return self.parent.offsets[self._pos]

    def key(self, i: int) -> int:
        return self.parent.key(self._p(i))

    def offset(self, i: int) -> int:
        return self.parent.offset(self._p(i))

    def read(self, i: int) -> memoryview:
        return self.parent.read(self._p(i))

    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        return self.parent.read_header(self._p(i))

    def plain_reader(
        self, positions: Sequence[int] | np.ndarray | None = None
    ) -> Callable[[int], tuple[float, memoryview, int] | None] | None:
        """:meth:`RecordFile.plain_reader` over the image positions."""
        pos, n = self._pos, int(self._pos.shape[0])
        known: dict[int, int] = {}
        parent_positions = None
        if positions is not None:
            mine = np.asarray(positions, dtype=np.int64).reshape(-1)
            mine = mine[(mine >= 0) & (mine < n)]
            parent_positions = pos[mine]
            known = dict(zip(mine.tolist(), parent_positions.tolist(), strict=True))
        read = self.parent.plain_reader(parent_positions)
        if read is None:
            return None

        def image(i: int) -> tuple[float, memoryview, int] | None:
            j = known.get(i)
            if j is None:
                if not 0 <= i < n:
                    return None
                j = int(pos[i])
            return read(j)

        return image

    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        if positions is None:
            pos = self._pos
            n = pos.shape[0]
            if n > 1 and bool(np.all(pos[1:] - pos[:-1] == 1)):  # as face2rec writes them
                return self.parent._run_labels(int(pos[0]), n)  # cached, as for all records
            return self.parent.labels(pos)
        sel = np.asarray(positions, dtype=np.int64).reshape(-1)
        return self.parent.labels(self._pos[sel])

    def close(self) -> None:
        self.parent.close()


class _Identity:
    __slots__ = ("image_keys", "image_positions", "ranges")

    def __init__(self, ranges: np.ndarray, image_keys: np.ndarray, image_positions: np.ndarray):
        self.ranges = ranges
        self.image_keys = image_keys
        self.image_positions = image_positions


def _detect_identity(r: RecordFile) -> _Identity | None:
    """insightface/face2rec layout: record key 0 holds ``flag=2`` labels ``(a, b)`` and no
    image; keys ``1..a-1`` are images; keys ``a..b-1`` are identity records whose labels give
    each identity's ``[start, end)`` image keys (MXFaceDataset, face_image_iter)."""
    if len(r) == 0:
        return None
    try:
        p0 = r.position(0)
    except KeyError:
        return None
    h, img = r.read_header(p0)
    if h.flag != 2 or len(img) != 0:
        return None
    a, b = (float(x) for x in np.asarray(h.label))
    if not (a.is_integer() and b.is_integer() and 1 <= a <= b):
        return None
    a_i, b_i = int(a), int(b)
    off = int(r.offsets[p0])

    def bad(reason: str) -> CorruptRecordError:
        return CorruptRecordError(r.path, off, f"insightface header record 0: {reason}", key=0)

    if b_i > len(r):
        raise bad(f"labels ({a_i}, {b_i}) name more records than the file holds ({len(r)})")
    try:
        image_positions = r.positions(np.arange(1, a_i, dtype=np.int64))
        id_positions = r.positions(np.arange(a_i, b_i, dtype=np.int64))
    except KeyError as e:
        raise bad(f"labels ({a_i}, {b_i}) name keys the .idx lacks ({e.args[0]})") from None
    if id_positions.shape[0] == 0:
        ranges = np.zeros((0, 2), dtype=np.int64)
    else:
        try:
            lab = r.labels(id_positions)
        except ValueError as e:
            if isinstance(e, CorruptRecordError):
                raise
            raise bad(f"identity records {a_i}..{b_i - 1} do not all carry 2 labels") from None
        if lab.ndim != 2 or lab.shape[1] != 2 or not bool(np.all(lab == np.round(lab))):
            raise bad(f"identity records {a_i}..{b_i - 1} do not all carry 2 integer labels")
        ranges = lab.astype(np.int64)
        wrong = np.flatnonzero(
            (ranges[:, 0] < 1) | (ranges[:, 1] > a_i) | (ranges[:, 0] > ranges[:, 1])
        )
        if wrong.size:
            j = int(wrong[0])
            raise CorruptRecordError(
                r.path,
                int(r.offsets[id_positions[j]]),
                f"insightface identity record: range {ranges[j].tolist()} lies outside the "
                f"image keys 1..{a_i - 1}",
                key=a_i + j,
            )
    return _Identity(ranges, np.arange(1, a_i, dtype=np.int64), image_positions)
