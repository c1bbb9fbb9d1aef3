"""Atomic, resumable writer of dmlc RecordIO files (``.rec`` + ``.idx`` [+ ``.crc32c``]).

Records go to ``NAME.rec.partial``, ``NAME.idx.partial`` (and ``NAME.crc32c.partial``); for
each record the ``.rec`` bytes are written first, then its checksum, then its ``.idx`` line.
``commit()`` flushes, fsyncs and renames the partials over the final names, so a killed run
never leaves a complete-looking file. ``resume=True`` reopens partials left by a killed run,
keeps every record that is complete *and* indexed, truncates the torn tail and reports the
kept keys in ``keys_written``.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import operator
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from stoker._core.atomic import fsync_dir, partial_path
from stoker._core.checksum import file_crc32c
from stoker._core.errors import (
    CorruptRecordError,
    IndexFormatError,
    OutputExistsError,
    SpecError,
)
from stoker._core.schema import Schema
from stoker.formats.fields import encode_trailer
from stoker.formats.recordio.framing import (
    MAX_RECORD_BYTES,
    FrameError,
    frame_parts,
    read_record,
    single_part_heads,
)
from stoker.formats.recordio.index import IndexTable, parse_idx
from stoker.formats.recordio.paths import default_crc_path, default_idx_path

__all__ = ["RecordWriter", "ShardInfo"]

_KEY_LIMIT = 1 << 63


@dataclass(frozen=True)
class ShardInfo:
    """What :meth:`RecordWriter.commit` produced: paths, record count, sizes, idx digest."""

    rec: str
    idx: str
    crc32c: str | None
    records: int
    rec_bytes: int
    idx_sha256: str
    rec_crc32c: int | None = None


def _complete_prefix(rec_p: str, table: IndexTable) -> tuple[int, int]:
    """How many leading ``.idx`` entries of a partial have complete records, and where the
    last of them ends. Entries must follow each other without gaps (as the writer wrote
    them); a torn record ends the prefix; anything else means the partials cannot be trusted.
    """
    size = os.path.getsize(rec_p)
    offs = table.offsets
    n = offs.shape[0]
    if size < 8 or n == 0:
        return 0, 0
    with open(rec_p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
        # vectorised fast-forward over whole single-part records that follow each other
        words = np.frombuffer(mm, dtype="<u4", count=size // 4)
        try:
            _, simple, _, ends = single_part_heads(words, offs, size)
            prev_end = np.concatenate([[0], ends[:-1]])
            good = simple & (offs == prev_end)
            bad = np.flatnonzero(~good)
            kept = int(bad[0]) if bad.size else n
            end = int(ends[kept - 1]) if kept else 0
        finally:
            del words
        view = memoryview(mm)
        try:
            for i in range(kept, n):
                off = int(offs[i])
                if off != end:
                    raise CorruptRecordError(
                        rec_p,
                        off,
                        f"cannot resume: .idx line {i + 1} says {off} but the previous record "
                        f"ends at {end}; start over",
                        key=int(table.keys[i]),
                    )
                try:
                    payload, nxt = read_record(mm, view, size, off)
                except FrameError as e:
                    if e.truncated:
                        break  # torn tail: this record never finished
                    raise CorruptRecordError(
                        rec_p, e.offset, f"cannot resume: {e.reason}; start over"
                    ) from None
                del payload
                end = nxt
                kept += 1
        finally:
            view.release()
    return kept, end


class RecordWriter:
    """Write records to ``rec_path`` + ``idx_path`` (default ``NAME.idx``) atomically.

    ``write(key, payload) -> offset`` appends one record (``payload`` is the whole dmlc
    payload, e.g. from :func:`pack_header`); keys are distinct non-negative integers.
    ``checksums=True`` also writes ``NAME.crc32c`` (CRC32C of each payload, little-endian
    uint32, in ``.idx`` order). ``overwrite=False`` refuses existing outputs with
    :class:`OutputExistsError`; with ``overwrite=True`` the old files stay intact until
    ``commit``. ``resume=True`` continues from partials a killed run left (see module doc).

    As a context manager: ``commit`` on success, ``abort`` on an exception.
    """

    def __init__(
        self,
        rec_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | None = None,
        *,
        overwrite: bool = False,
        resume: bool = False,
        checksums: bool = False,
        crc_path: str | os.PathLike[str] | None = None,
        schema: Schema | None = None,
    ) -> None:
        self.rec_path = os.fspath(rec_path)
        #: the set's schema: with stored fields, every ``write`` takes their values
        self.schema = schema
        self.idx_path = os.fspath(idx_path) if idx_path is not None else default_idx_path(rec_path)
        if checksums or crc_path is not None:
            self.crc_path: str | None = (
                os.fspath(crc_path) if crc_path is not None else default_crc_path(rec_path)
            )
        else:
            self.crc_path = None
        if len({self.rec_path, self.idx_path, self.crc_path} - {None}) != 2 + (
            self.crc_path is not None
        ):
            raise ValueError("rec, idx and crc32c paths must differ")
        if not overwrite:
            for p in (self.rec_path, self.idx_path, self.crc_path):
                if p is not None and os.path.exists(p):
                    raise OutputExistsError(f"{p} exists; pass overwrite=True to replace it")
        self._keys = array("q")
        self._key_set: set[int] | None = None  # built only once keys stop increasing
        self._sha = hashlib.sha256()
        self._done = False
        self.bytes_written = 0
        self._rec: Any = None
        self._idx: Any = None
        self._crcf: Any = None
        if resume and os.path.exists(partial_path(self.rec_path)):
            self._resume()
        else:
            self._start()

    # ------------------------------------------------------------------ opening
    def _paths(self) -> list[str]:
        return [p for p in (self.rec_path, self.idx_path, self.crc_path) if p is not None]

    def _start(self) -> None:
        try:
            self._rec = open(partial_path(self.rec_path), "wb", buffering=1 << 20)  # noqa: SIM115
            self._idx = open(partial_path(self.idx_path), "wb", buffering=1 << 16)  # noqa: SIM115
            if self.crc_path is not None:
                self._crcf = open(partial_path(self.crc_path), "wb", buffering=1 << 16)  # noqa: SIM115
        except BaseException:
            self._close_files()
            raise

    def _resume(self) -> None:
        rec_p = partial_path(self.rec_path)
        idx_p = partial_path(self.idx_path)
        idx_bytes = b""
        if os.path.exists(idx_p):
            with open(idx_p, "rb") as f:
                idx_bytes = f.read()
        # a torn last line (no newline yet) is dropped
        idx_bytes = idx_bytes[: idx_bytes.rfind(b"\n") + 1]
        try:
            table = parse_idx(idx_bytes, idx_p)
        except IndexFormatError as e:
            raise CorruptRecordError(
                idx_p, None, f"cannot resume: {e.reason} (line {e.line}); start over"
            ) from None
        if table.lines is not None:
            raise CorruptRecordError(idx_p, None, "cannot resume: blank lines; start over")
        kept, end = _complete_prefix(rec_p, table)
        # cut the files back to the kept records
        with open(rec_p, "r+b") as rf:
            rf.truncate(end)
        idx_end = 0
        if kept:
            newlines = np.flatnonzero(np.frombuffer(idx_bytes, dtype=np.uint8) == 10)
            idx_end = int(newlines[kept - 1]) + 1
        with open(idx_p, "r+b") if os.path.exists(idx_p) else open(idx_p, "wb") as xf:
            xf.truncate(idx_end)
        self._sha.update(idx_bytes[:idx_end])
        keep_keys = table.keys[:kept]
        self._keys = array("q", keep_keys.tolist())
        if kept > 1 and not bool(np.all(keep_keys[1:] > keep_keys[:-1])):
            self._key_set = set(keep_keys.tolist())
        self.bytes_written = end
        if self.crc_path is not None:
            crc_p = partial_path(self.crc_path)
            have = os.path.getsize(crc_p) // 4 if os.path.exists(crc_p) else 0
            with open(crc_p, "r+b") if os.path.exists(crc_p) else open(crc_p, "wb") as cf:
                cf.truncate(4 * min(have, kept))
            missing = list(range(min(have, kept), kept))
            if missing:
                self._fill_crc(rec_p, crc_p, table.offsets, missing)
        self._rec = open(rec_p, "ab", buffering=1 << 20)  # noqa: SIM115
        self._idx = open(idx_p, "ab", buffering=1 << 16)  # noqa: SIM115
        if self.crc_path is not None:
            self._crcf = open(partial_path(self.crc_path), "ab", buffering=1 << 16)  # noqa: SIM115

    @staticmethod
    def _fill_crc(rec_p: str, crc_p: str, offsets: np.ndarray, which: list[int]) -> None:
        from stoker._core.crc import crc32c

        size = os.path.getsize(rec_p)
        with open(rec_p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                out = array("I")
                for i in which:
                    payload, _ = read_record(mm, view, size, int(offsets[i]))
                    out.append(crc32c(payload))
                    del payload
            finally:
                view.release()
        with open(crc_p, "ab") as out_f:
            out_f.write(np.asarray(out, dtype="<u4").tobytes())

    # ------------------------------------------------------------------ writing
    @property
    def count(self) -> int:
        """Records written so far (including those kept by ``resume``)."""
        return len(self._keys)

    @property
    def keys_written(self) -> np.ndarray:
        """int64 keys written so far, in order (after ``resume``: the ones kept)."""
        return (
            np.frombuffer(self._keys, dtype=np.int64).copy()
            if self._keys
            else np.zeros(0, np.int64)
        )

    def write(
        self,
        key: int,
        payload: bytes | bytearray | memoryview,
        fields: Mapping[str, Any] | None = None,
    ) -> int:
        """Append one record; returns its byte offset in the ``.rec``. ``fields``: the values
        of the schema's stored fields (checked with ``Field.check``), written as the record's
        field trailer after ``payload`` (IRHeader, labels, image); required when the writer's
        ``schema`` stores fields, refused otherwise."""
        if self._done or self._rec is None:
            raise ValueError(f"{self.rec_path}: the writer is already committed or aborted")
        stored = self.schema.stored if self.schema is not None else {}
        if fields is not None or stored:
            payload = bytes(payload) + self._trailer(key, stored, fields)
        k = operator.index(key)
        if not 0 <= k < _KEY_LIMIT:
            raise ValueError(f"record keys must be integers in [0, 2**63), got {k}")
        n = len(payload)  # checked before touching the data: no 512 MB copies for nothing
        if n > MAX_RECORD_BYTES:
            raise ValueError(
                f"record exceeds RecordIO limit (2^29-1 bytes): key {k} has {n} bytes "
                f"({self.rec_path})"
            )
        if self._keys and (self._key_set is not None or k <= self._keys[-1]):
            if self._key_set is None:
                self._key_set = set(self._keys)
            if k in self._key_set:
                raise ValueError(f"key {k} was already written to {self.rec_path}")
            self._key_set.add(k)
        if isinstance(payload, bytes):
            data = payload
        else:
            mv = memoryview(payload)
            data = mv.cast("B").tobytes() if mv.ndim != 1 or mv.format != "B" else bytes(mv)
        parts = frame_parts(data)
        offset = self.bytes_written
        self._rec.writelines(parts)
        if self._crcf is not None:
            from stoker._core.crc import crc32c

            self._crcf.write(crc32c(data).to_bytes(4, "little"))
        line = f"{k}\t{offset}\n".encode()
        self._idx.write(line)
        self._sha.update(line)
        self._keys.append(k)
        self.bytes_written = offset + sum(len(p) for p in parts)
        return offset

    def _trailer(self, key: int, stored: dict, fields: Mapping[str, Any] | None) -> bytes:
        if not stored:
            raise ValueError(
                f"{self.rec_path}: key {key}: fields given but the writer's schema stores none "
                "(pass schema= to RecordWriter)"
            )
        fields = fields or {}
        unknown = sorted(set(fields) - set(stored))
        if unknown:
            raise ValueError(f"{self.rec_path}: key {key}: the schema stores no fields {unknown}")
        assert self.schema is not None
        try:
            checked = {n: f.check(fields[n], name=n) for n, f in stored.items() if n in fields}
            return encode_trailer(self.schema, checked)
        except (KeyError, SpecError) as e:
            raise ValueError(f"{self.rec_path}: key {key}: {e}") from None

    # ------------------------------------------------------------------ finishing
    def _close_files(self) -> None:
        for f in (self._rec, self._idx, self._crcf):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._rec = self._idx = self._crcf = None

    def flush(self) -> None:
        """Push buffered bytes to the partial files (for a later ``resume``)."""
        for f in (self._rec, self._crcf, self._idx):  # idx last: it vouches for the others
            if f is not None:
                f.flush()

    def commit(self) -> ShardInfo:
        """fsync the partials and rename them over the final names."""
        if self._done:
            raise ValueError(f"{self.rec_path}: the writer is already committed or aborted")
        try:
            for f in (self._rec, self._crcf, self._idx):
                if f is not None:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            self.abort()
            raise
        self._close_files()
        self._done = True
        for p in (self.rec_path, self.crc_path, self.idx_path):
            if p is not None:
                os.replace(partial_path(p), p)
        for d in {os.path.dirname(os.path.abspath(p)) for p in self._paths()}:
            fsync_dir(d)
        return ShardInfo(
            self.rec_path,
            self.idx_path,
            self.crc_path,
            len(self._keys),
            self.bytes_written,
            self._sha.hexdigest(),
            file_crc32c(self.rec_path),
        )

    def abort(self, *, keep_partial: bool = False) -> None:
        """Stop writing. Removes the partials unless ``keep_partial`` (then they are flushed
        for a later ``resume=True``). Final files are never touched."""
        if self._done:
            return
        if keep_partial:
            with contextlib.suppress(OSError, ValueError):
                self.flush()
        self._close_files()
        self._done = True
        if not keep_partial:
            for p in self._paths():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial_path(p))

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            if not self._done:
                self.commit()
        else:
            self.abort()

    def __del__(self) -> None:  # never leak descriptors when a caller forgets
        with contextlib.suppress(Exception):
            self._close_files()
