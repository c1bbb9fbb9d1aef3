"""Atomic writer of dmlc RecordIO files (``.rec`` + ``.idx`` [+ ``.crc32c``]).

Records go to ``NAME.rec.partial``, ``NAME.idx.partial`` (and ``NAME.crc32c.partial``); for
each record the ``.rec`` bytes are written first, then its checksum, then its ``.idx`` line.
``commit()`` flushes, fsyncs and renames the partials over the final names, so a killed run
never leaves a complete-looking file (pack writes a shard that is not whole again from
scratch: ``docs/pack.md``, "Resume").
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from stoker._core.atomic import fsync_dir, partial_path
from stoker._core.checksum import file_crc32c
from stoker._core.errors import (
    OutputExistsError,
    SpecError,
)
from stoker._core.schema import Schema
from stoker.formats.fields import encode_trailer
from stoker.formats.recordio.framing import (
    MAGIC,
    MAX_RECORD_BYTES,
    frame_parts,
)
from stoker.formats.recordio.paths import default_crc_path, default_idx_path

__all__ = ["RecordWriter", "ShardInfo"]

_KEY_LIMIT = 1 << 63
_PADS = (b"", b"\x00", b"\x00\x00", b"\x00\x00\x00")  # by (-length) & 3


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


class RecordWriter:
    """Write records to ``rec_path`` + ``idx_path`` (default ``NAME.idx``) atomically.

    ``write(key, payload) -> offset`` appends one record (``payload`` is the whole dmlc
    payload, e.g. from :func:`pack_header`); keys are distinct non-negative integers.
    ``checksums=True`` also writes ``NAME.crc32c`` (CRC32C of each payload, little-endian
    uint32, in ``.idx`` order). ``overwrite=False`` refuses existing outputs with
    :class:`OutputExistsError`; with ``overwrite=True`` the old files stay intact until
    ``commit``.

    As a context manager: ``commit`` on success, ``abort`` on an exception.
    """

    def __init__(
        self,
        rec_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | None = None,
        *,
        overwrite: bool = False,
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
        self._start()

    # ------------------------------------------------------------------ opening
    def _paths(self) -> list[str]:
        return [p for p in (self.rec_path, self.idx_path, self.crc_path) if p is not None]

    def _start(self) -> None:
        try:
            self._rec = open(partial_path(self.rec_path), "wb", buffering=1 << 20)  # noqa: SIM115
            self._idx = open(partial_path(self.idx_path), "wb", buffering=1 << 16)  # noqa: SIM115
            if self.crc_path is not None:
                from stoker._core.crc import crc32c

                self._crc = crc32c
                self._crcf = open(partial_path(self.crc_path), "wb", buffering=1 << 16)  # noqa: SIM115
        except BaseException:
            self._close_files()
            raise

    # ------------------------------------------------------------------ writing
    @property
    def count(self) -> int:
        """Records written so far."""
        return len(self._keys)

    @property
    def keys_written(self) -> np.ndarray:
        """int64 keys written so far, in order."""
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
            self._crcf.write(self._crc(data).to_bytes(4, "little"))
        line = f"{k}\t{offset}\n".encode()
        self._idx.write(line)
        self._sha.update(line)
        self._keys.append(k)
        self.bytes_written = offset + sum(map(len, parts))
        return offset

    def write_batch(
        self, keys: np.ndarray, heads: bytes, width: int, images: Sequence[bytes]
    ) -> bool:
        """Append one record per key whose payload is ``heads[j * width : (j + 1) * width]``
        followed by ``images[j]``, the bytes :meth:`write` writes for each, in one join and
        one write per file. ``False``, with nothing written, when the batch needs
        :meth:`write` record by record: keys not increasing past the last one written, a
        record over the size limit, a payload that holds the magic at an aligned offset (a
        record dmlc splits into parts), or a schema that stores fields."""
        if self._done or self._rec is None:
            raise ValueError(f"{self.rec_path}: the writer is already committed or aborted")
        n = len(images)
        k = np.asarray(keys, dtype=np.int64)
        if n == 0 or (self.schema is not None and self.schema.stored) or k.shape != (n,):
            return n == 0
        last = self._keys[-1] if self._keys else -1
        if self._key_set is not None or k[0] <= last or (n > 1 and np.diff(k).min() <= 0):
            return False
        length = np.fromiter(map(len, images), np.int64, n) + width
        if int(length.max()) > MAX_RECORD_BYTES or len(heads) != n * width:
            return False
        step = 8 + width
        front = np.empty((n, step), np.uint8)
        words = front[:, :8].view("<u4")
        words[:, 0] = MAGIC
        words[:, 1] = length  # cflag 0: one part
        front[:, 8:] = np.frombuffer(heads, np.uint8).reshape(n, width)
        fb = front.tobytes()
        parts: list[Any] = [None] * (3 * n)
        parts[0::3] = [fb[o : o + step] for o in range(0, n * step, step)]
        parts[1::3] = images
        parts[2::3] = [_PADS[p] for p in ((-length) & 3).tolist()]
        out = b"".join(parts)
        # every record starts on a 4-byte boundary: a magic at an aligned offset besides the
        # framing's own is one in a payload, where dmlc splits the record
        if np.count_nonzero(np.frombuffer(out, "<u4") == MAGIC) != n:
            return False
        framed = 8 + ((length + 3) & ~3)
        starts = np.cumsum(framed) - framed
        mv = memoryview(out)
        if self._crcf is not None:
            crc = self._crc
            sums = [crc(mv[a : a + m]) for a, m in zip((starts + 8).tolist(), length.tolist())]
            self._crcf.write(np.asarray(sums, "<u4").tobytes())
        mv.release()
        offsets = starts + self.bytes_written
        cols: list[int] = [0] * (2 * n)
        cols[0::2] = k.tolist()
        cols[1::2] = offsets.tolist()
        lines = (("%d\t%d\n" * n) % tuple(cols)).encode()
        self._rec.write(out)
        self._idx.write(lines)
        self._sha.update(lines)
        self._keys.frombytes(k.tobytes())
        self.bytes_written += len(out)
        return True

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

    def abort(self) -> None:
        """Stop writing and remove the partials. Final files are never touched."""
        if self._done:
            return
        self._close_files()
        self._done = True
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
