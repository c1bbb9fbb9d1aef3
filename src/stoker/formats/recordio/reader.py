"""The random-access file object of one ``.rec`` (:class:`RecordFile`), read through its ``.idx``.

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
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from stoker._core.errors import CorruptRecordError, SpecError
from stoker._core.schema import Schema
from stoker.formats.base import unmap
from stoker.formats.fields import TrailerError, decode_trailer, split_trailer
from stoker.formats.recordio.framing import (
    LENGTH_MASK,
    MAGIC,
    FrameError,
    read_record,
    scan_offsets,
    single_part_heads,
)
from stoker.formats.recordio.header import IR_FORMAT, IR_SIZE, IRHeader, unpack_header
from stoker.formats.recordio.hints import advise_ranges
from stoker.formats.recordio.index import IndexTable, load_index
from stoker.formats.recordio.labelcache import read_label_cache, write_label_cache
from stoker.formats.recordio.manifest import manifest_schema
from stoker.formats.recordio.paths import default_crc_path, default_idx_path

__all__ = ["Checksums", "PlainRead", "RecordFile"]

#: ``f(i)`` of :meth:`RecordFile.plain_reader`: ``(label, image bytes, key)`` or ``None``.
PlainRead = Callable[[int], tuple[float, memoryview, int] | None]

#: ``verify_checksums``: ``True`` (the ``.crc32c`` must exist), ``False`` (never read it) or
#: ``"auto"`` (checked when it exists; a file a manifest names must exist).
Checksums = bool | Literal["auto"]

_HEAD_IR = struct.Struct("<II" + IR_FORMAT[1:])  # record header + IRHeader, one unpack


class RecordFile:
    """Random access to a ``.rec`` file through its ``.idx``.

    ``idx_path`` defaults to ``NAME.idx`` beside ``NAME.rec``; when that does not exist the
    ``.rec`` is walked once and the keys are the positions ``0..N-1`` (like MXNet's
    sequential reader). ``verify_checksums=True`` checks every ``read`` (and every answer
    of :meth:`plain_reader`) against the ``NAME.crc32c`` side file (``crc_path``), which must
    exist and hold one uint32 per record; ``"auto"`` does so when ``crc_path`` is given or
    ``NAME.crc32c`` exists (a given ``crc_path`` that is missing is an error). Every read
    also checks that the record ends before the next record the ``.idx`` lists.
    ``cache=False`` skips the binary index cache.

    ``manifest`` is set by the shard whose manifest names the file (its schema then says
    whether records end in a field trailer). It reads the file and knows no layout: the
    set's reader recognises insightface's (``insightface.py``). A context manager: ``close``
    on exit.
    """

    def __init__(
        self,
        rec_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | None = None,
        *,
        cache: bool = True,
        verify_checksums: Checksums = False,
        crc_path: str | os.PathLike[str] | None = None,
    ) -> None:
        path = os.fspath(rec_path)
        if idx_path is None:
            guess = default_idx_path(path)
            idx = guess if os.path.exists(guess) else None
        else:
            idx = os.fspath(idx_path)
        self._setup(path, idx, cache=cache, verify_checksums=verify_checksums, crc_path=crc_path)

    def _setup(
        self,
        path: str,
        idx_path: str | None,
        *,
        cache: bool,
        verify_checksums: Checksums,
        crc_path: str | os.PathLike[str] | None,
        manifest: dict | None = None,
    ) -> None:
        """Set the paths and options (all that pickles), then open the files."""
        self.path = path
        self.idx_path = idx_path
        self._cache = bool(cache)
        if verify_checksums not in (True, False, "auto"):
            raise ValueError(
                f"verify_checksums must be True, False or 'auto', got {verify_checksums!r}"
            )
        self.verify_checksums: Checksums = verify_checksums
        self.crc_path = os.fspath(crc_path) if crc_path is not None else None
        self.manifest = manifest
        self._open()

    # ------------------------------------------------------------------ lifecycle
    def _open(self) -> None:
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._crc: np.ndarray | None = None
        self._next: np.ndarray | None = None  # sorted distinct offsets (unsorted .idx only)
        self._sorted: bool | None = None  # offsets strictly increasing (not yet looked at)
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
            if self.verify_checksums == "auto" and self.crc_path is None:
                return  # no side-car beside the .rec: nothing to check against
            raise CorruptRecordError(
                cpath,
                None,
                f"the checksum file does not exist (the .rec is {self.path}); pass "
                "verify_checksums=False (RecordSource(path, checksums=False)) to read without",
            )
        self.crc_path = cpath
        n = len(self._table)
        size = os.path.getsize(cpath)
        if size != 4 * n:
            raise CorruptRecordError(
                cpath,
                None,
                f"checksum file holds {size} bytes; {n} records need {4 * n} "
                "(one little-endian uint32 per record); it is truncated or belongs to "
                "another .rec",
            )
        self._crc = np.fromfile(cpath, dtype="<u4", count=n)

    def close(self) -> None:
        """Release the mapping. Views returned by ``read`` must not be used afterwards."""
        self._closed = True
        view, mm = self._view, self._mm
        self._view = self._mm = None
        unmap(view, mm)

    def __enter__(self) -> RecordFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record position {i} out of range for {n} records")
        return i + n if i < 0 else i

    @property
    def schema(self) -> Schema:
        """The schema the manifest declares; else an image and its IRHeader label(s), float32
        of the first record's label count (what every set packed without fields is)."""
        declared = self._declared()
        if declared is not None:
            return declared
        shape: tuple[int, ...] = ()
        if len(self):
            header, _ = self.read_header(0)
            shape = (header.flag,) if header.flag else ()
        return Schema.classification(shape, "float32")

    def _declared(self) -> Schema | None:
        """The manifest's schema (parsed once per manifest object), or ``None``."""
        m = self.manifest
        cached = self.__dict__.get("_declared_cache")
        if cached is not None and cached[0] is m:
            return cached[1]
        schema = manifest_schema(m) if m else None
        self.__dict__["_declared_cache"] = (m, schema)
        return schema

    def _stored(self) -> Schema | None:
        """The declared schema when its records end in a field trailer, else ``None``."""
        schema = self._declared()
        return schema if schema is not None and schema.stored else None

    def _check_field_names(self, names: Sequence[str] | None) -> Schema | None:
        """The trailer's schema after checking that ``names`` are stored fields of it."""
        stored = self._stored()
        have = list(stored.stored) if stored is not None else []
        unknown = [n for n in names or () if n not in have]
        if unknown:
            raise SpecError(
                f"{self!r}: no stored fields {unknown}; the set stores "
                f"{have or 'none'} beyond the image and the label"
            )
        return stored

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "idx_path": self.idx_path,
            "cache": self._cache,
            "verify_checksums": self.verify_checksums,
            "crc_path": self.crc_path,
            "manifest": self.manifest,
        }

    def __setstate__(self, state: dict) -> None:
        self._setup(
            state["path"],
            state["idx_path"],
            cache=state["cache"],
            verify_checksums=state["verify_checksums"],
            crc_path=state["crc_path"],
            manifest=state["manifest"],
        )

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

    def _limits(self, pos: np.ndarray) -> np.ndarray:
        """Where each record at ``pos`` must end at the latest: the next larger offset the
        index lists (the file size for the last record). A length field enlarged so that the
        record overlaps the next one is caught by this, with or without checksums."""
        offsets, n = self._table.offsets, len(self)
        if self._sorted is None:
            self._sorted = n < 2 or bool(np.all(offsets[1:] > offsets[:-1]))
            if not self._sorted:
                self._next = np.unique(offsets)
        if self._next is None:
            after = pos + 1
            return np.where(after < n, offsets[np.minimum(after, n - 1)], self.size)
        nxt = self._next
        j = np.searchsorted(nxt, offsets[pos], side="right")
        return np.where(j < nxt.shape[0], nxt[np.minimum(j, nxt.shape[0] - 1)], self.size)

    def advise(self, positions: Sequence[int] | np.ndarray) -> None:
        """Access hints for the records at ``positions`` (in range), about to be read: no
        read-around on misses, their byte ranges fetched at once (see hints.py)."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if self._mm is not None and not self._closed and pos.shape[0]:
            advise_ranges(self._mm, self._table.offsets[pos], self._limits(pos))

    def _payload(self, i: int) -> memoryview:
        """``read`` of a position already checked (and made non-negative)."""
        off = int(self._table.offsets[i])
        mm, view = self._buf()
        self._check_not_shrunk(i, off)
        try:
            payload, end = read_record(mm, view, self.size, off)
        except FrameError as e:
            raise self._error(i, e.offset, e.reason) from None
        limit = int(self._limits(np.array([i], dtype=np.int64))[0])
        if end > limit:
            raise self._error(
                i,
                off,
                f"record runs to byte {end}, past the next record at byte offset {limit} "
                "(a damaged length field, or an .idx that does not belong to this .rec)",
            )
        if self._crc is not None:
            from stoker._core.crc import crc32c

            got = crc32c(payload)
            want = int(self._crc[i])
            if got != want:
                raise self._error(
                    i, off, f"checksum mismatch: stored crc32c 0x{want:08x}, data has 0x{got:08x}"
                )
        return payload

    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        """``(IRHeader, image bytes)`` of position ``i`` (without a field trailer)."""
        i = self._check_index(i)
        payload, header, rest = self._unpack(i)
        if self._stored() is None:
            return header, rest
        return header, self._split(i, payload, rest)[0]

    def read_fields(
        self, i: int, names: Sequence[str] | None = None
    ) -> tuple[IRHeader, memoryview, dict[str, Any]]:
        """``(IRHeader, image bytes, fields)`` of position ``i``: the stored fields ``names``
        (all when ``None``) from the record's trailer; a set without stored fields has none."""
        i = self._check_index(i)
        stored = self._check_field_names(names)
        payload, header, rest = self._unpack(i)
        if stored is None:
            return header, rest, {}
        image, body = self._split(i, payload, rest)
        try:
            fields = decode_trailer(stored, body, names, start=len(image))
        except TrailerError as e:
            raise self._trailer_error(i, payload, rest, e) from None
        return header, image, fields

    def _unpack(self, i: int) -> tuple[memoryview, IRHeader, memoryview]:
        """The payload of (checked) position ``i``, its IRHeader and the bytes after it."""
        payload = self._payload(i)
        try:
            header, rest = unpack_header(payload)
        except ValueError as e:
            raise self._error(i, int(self._table.offsets[i]), str(e)) from None
        return payload, header, rest

    def _split(
        self, i: int, payload: memoryview, rest: memoryview
    ) -> tuple[memoryview, memoryview]:
        try:
            return split_trailer(rest)
        except TrailerError as e:
            raise self._trailer_error(i, payload, rest, e) from None

    def _trailer_error(
        self, i: int, payload: memoryview, rest: memoryview, e: TrailerError
    ) -> CorruptRecordError:
        """A trailer problem named by the file offset of the byte at fault (for a record of
        one part; a split record's offset is its start)."""
        off = int(self._table.offsets[i])
        mm, _ = self._buf()
        whole = mm is not None and (_HEAD_IR.unpack_from(mm, off)[1] >> 29) == 0
        at = off + 8 + (len(payload) - len(rest)) + e.pos if whole else off
        return self._error(i, at, f"field trailer: {e}")

    def plain_reader(self, positions: Sequence[int] | np.ndarray | None = None) -> PlainRead | None:
        """A reader for hot loops over the common record: ``f(i)`` gives ``(label, image bytes,
        key)`` of position ``i`` when that record is one part with one float label, ends
        before the next record the index lists and (with checksums on) matches its CRC32C;
        else ``None`` (the caller then reads it with :meth:`read_header`, which also raises
        the error that names what is wrong). ``None`` instead of a reader when the file shrank
        since it was opened. Make one per batch or so: the truncation check that :meth:`read`
        does on every call is done once, here.

        ``positions``: the positions about to be read (a loader's chunk). Their offsets, keys,
        bounds and checksums are then gathered in one vectorised step, instead of one index
        lookup each between two decodes, where it misses the cache lines and TLB entries the
        decode evicted; any other position still works."""
        mm, view = self._buf()
        if mm is None or mm.size() < self.size or self._stored() is not None:
            return None  # a trailer after the image: read_header cuts it off
        offsets, keys, n, crcs = self._table.offsets, self._table.keys, len(self), self._crc
        unpack, magic_ok, mask = _HEAD_IR.unpack_from, MAGIC, LENGTH_MASK
        first = 8 + IR_SIZE
        known: dict[int, tuple[int, int, int, int]] = {}
        if positions is not None:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < n)]
            cols = [offsets[pos], keys[pos], self._limits(pos)]
            cols.append(crcs[pos] if crcs is not None else np.zeros_like(pos))
            known = dict(zip(pos.tolist(), zip(*(c.tolist() for c in cols), strict=True)))
        limits = self._limits

        def where(i: int) -> tuple[int, int, int, int] | None:
            if not 0 <= i < n:
                return None
            want = int(crcs[i]) if crcs is not None else 0
            return int(offsets[i]), int(keys[i]), int(limits(np.array([i]))[0]), want

        crc = None
        if crcs is not None:
            from stoker._core.crc import crc32c

            crc = crc32c

        def read(i: int) -> tuple[float, memoryview, int] | None:
            got = known.get(i) or where(i)
            if got is None:
                return None
            off, key, end, want = got
            if off + first > end:
                return None
            magic, lrec, flag, label, _id, _id2 = unpack(mm, off)
            length = lrec & mask
            if magic != magic_ok or lrec > mask or flag or length < IR_SIZE:
                return None
            if off + 8 + ((length + 3) & ~3) > end:  # dmlc reads the padding too
                return None
            if crc is not None and crc(view[off + 8 : off + 8 + length]) != want:
                return None
            return label, view[off + first : off + 8 + length], key

        return read

    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Labels of all records (or of ``positions``) without decoding images.

        float32 ``(N,)`` when every selected record has ``flag == 0``, ``(N, k)`` when every
        one has ``k`` labels; ``ValueError`` when the selection mixes label counts.
        Vectorised over the mapping for single-part records.
        """
        if positions is None:
            return self.labels_span(0, len(self))
        return self._labels_at(np.asarray(positions, dtype=np.int64).reshape(-1))

    def labels_span(self, first: int, n: int) -> np.ndarray:
        """Labels of positions ``first .. first + n - 1``, through the label cache (see
        labelcache): what :meth:`labels` gives for every record, and a shard's labels for an
        insightface set's image records."""
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
            # 6 words: magic, lrec, and the IRHeader's flag, label and id; in a truncated
            # file they may lie past its end, and those records go the slow way
            w0c, whole, length, _ = single_part_heads(words, offs, self.size, header_words=6)
            flag = words[w0c + 2].astype(np.int64)
            simple = whole & (length >= IR_SIZE) & (flag * 4 <= length - IR_SIZE)
            flags = flag.copy()
            slow = np.flatnonzero(~simple)
            slow_labels: dict[int, Any] = {}
            for j in slow.tolist():
                h, _ = self.read_header(int(pos[j]))  # raises the precise error
                flags[j] = h.flag
                slow_labels[j] = h.label
            kinds, counts = np.unique(flags, return_counts=True)
            if kinds.shape[0] > 1:
                raise self._mixed_labels(pos, flags, kinds, counts)
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

    def _mixed_labels(
        self, pos: np.ndarray, flags: np.ndarray, kinds: np.ndarray, counts: np.ndarray
    ) -> CorruptRecordError:
        """The error for a selection whose records carry different label counts: it names
        the first record whose count differs from the one most records carry."""
        usual = int(kinds[int(np.argmax(counts))])
        j = int(np.flatnonzero(flags != usual)[0])
        i = int(pos[j])
        return self._error(
            i,
            int(self._table.offsets[i]),
            f"records carry different label counts ({kinds.tolist()}): this one has "
            f"{int(flags[j])} (IRHeader flag), {int(counts.max())} of the "
            f"{int(flags.shape[0])} records read have {usual}",
        )
