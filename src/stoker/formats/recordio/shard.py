"""One RecordIO shard (:class:`~stoker.formats.base.Shard`): a ``.rec`` read through its ``.idx``
(:class:`~stoker.formats.recordio.reader.RecordFile`), checked against its manifest entry when
it opens (the ``.rec``'s size, the ``.idx``'s sha256; the set checks the record count), and
the samples it holds: every record, or in insightface's layout (:mod:`~stoker.formats.recordio.
insightface`, recognised in a set of one local shard) the image records alone (``rows``: their
positions in the file).

The file is mapped when first read and again after :meth:`RecordIOShard.close` (a remote
shard's pinned copies are held again). :meth:`RecordIOShard.samples` reads a chunk: single-part
records with one label through :meth:`RecordFile.plain_reader` (one unpack for both headers,
no per-sample ``fstat``), any other record, and every error, the slow way, which names what
is wrong. The label comes from the header read (a :class:`~stoker.formats.recordio.header.
LabelKind` says its type), so a worker never holds the set's label array.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError
from stoker._core.schema import Schema
from stoker.formats.base import ReadRecord, ReadSample, Shard
from stoker.formats.recordio.header import LabelKind
from stoker.formats.recordio.index import sha256_file
from stoker.formats.recordio.insightface import Layout, detect_layout
from stoker.formats.recordio.paths import default_crc_path, default_idx_path
from stoker.formats.recordio.reader import RecordFile
from stoker.formats.sharded import SetPlan, ShardFiles

__all__ = ["RAW", "RecordIOShard"]

#: How to read a set whose manifest names a checksum file that is gone.
NO_CRC = "; open with checksums=False (RecordSource(path, checksums=False)) to read without them"
#: The IRHeader's labels as stored (float32), the kind a shard reads without a set.
RAW = LabelKind((), "float32")


class RecordIOShard(Shard):
    """One ``.rec`` with its ``.idx`` (and ``.crc32c``); see the module docstring."""

    @classmethod
    def plan(
        cls, manifest: dict | None, where: str, *, checksums: bool = True, cache: bool = True
    ) -> SetPlan:
        roles = ("index", "data", "crc") if checksums else ("index", "data")
        return SetPlan((checksums, cache, manifest, where), roles=roles, extra={"hint": NO_CRC})

    def __init__(self, files: ShardFiles, plan: SetPlan) -> None:
        self.files, self.path = files, files.where
        self.checksums, self.cache, self.manifest, self.where_ = plan.read
        self.rows: np.ndarray | None = None
        self.layout: Layout | None = None
        self.file: RecordFile | None = None
        f = self._file()
        self.count, self.size = len(f), f.size
        e = files.entry
        if e is not None:
            try:
                self._check(f, e)
            except BaseException:
                self.close()
                raise

    def _check(self, f: RecordFile, e: Any) -> None:
        """The files against their entry: the ``.rec``'s size, the ``.idx``'s sha256."""
        if f.size != e.bytes:
            raise ManifestError(
                f"{self.where_}: {f.path} is {f.size} bytes but the manifest records "
                f"{e.bytes}; the .rec was replaced or truncated"
            )
        sha = f.idx_sha256
        if sha is None and f.idx_path is not None:
            sha = sha256_file(f.idx_path)
        if sha != e.checksums.get("index.sha256"):
            raise ManifestError(
                f"{self.where_}: idx does not match rec: the sha256 of {f.idx_path} differs "
                "from the one recorded when the shard was written"
            )

    def _file(self) -> RecordFile:
        """The :class:`RecordFile`, mapped (again, after a close)."""
        if self.file is not None:
            return self.file
        files = self.files
        rec = files.path("data")
        assert rec is not None
        if files.entry is None:  # a bare .rec: its side files beside it, where they exist
            idx, crc = default_idx_path(rec), default_crc_path(rec)
            idx_path = idx if os.path.exists(idx) else None
            crc_path, check = (crc if os.path.exists(crc) else None), self.checksums
        else:  # a .crc32c the entry names must exist; none named: nothing to check
            idx_path, crc_path = files.path("index"), files.path("crc")
            check = self.checksums and crc_path is not None
        try:
            f = RecordFile(
                rec,
                idx_path,
                crc_path=crc_path,
                verify_checksums="auto" if check else False,
                cache=self.cache,
            )
        except BaseException:
            files.let_go()
            raise
        f.manifest = self.manifest  # its schema says whether records end in a field trailer
        self.file = f
        return f

    def _find_layout(self) -> None:
        """Recognise insightface's layout: the samples are then the image records alone."""
        self.layout = detect_layout(self._file())
        if self.layout is not None:
            self.rows = self.layout.image_positions

    def close(self) -> None:
        f, self.file = self.file, None
        if f is not None:
            f.close()
            self.files.let_go()

    # ------------------------------------------------------------------ the contract
    def __len__(self) -> int:
        return self.count if self.rows is None else int(self.rows.shape[0])

    def _at(self, r: int) -> int:
        """The file position of sample ``r``."""
        return r if self.rows is None else int(self.rows[r])

    def keys(self) -> np.ndarray:
        keys = np.asarray(self._file().keys, dtype=np.int64)
        return keys if self.rows is None else keys[self.rows]

    def labels(self) -> np.ndarray:
        """The IRHeader labels as stored: float32 ``(N,)``, or ``(N, k)`` for ``k`` labels a
        record (the set types them, :class:`LabelKind`)."""
        f, rows = self._file(), self.rows
        if rows is None:
            return f.labels()  # through the label cache
        if rows.shape[0] and bool(np.all(np.diff(rows) == 1)):
            return f.labels_span(int(rows[0]), int(rows.shape[0]))  # as face2rec writes them
        return f.labels(rows)

    @property
    def schema(self) -> Schema:
        return self._file().schema

    def where(self, r: int) -> tuple[int, str]:
        f, p = self._file(), self._at(r)
        return f.offset(p), f"key {f.key(p)}"

    def _advise(self, rows: np.ndarray) -> None:
        self._file().advise(rows if self.rows is None else self.rows[rows])

    def reader(self, rows: np.ndarray | None, fields: tuple[str, ...]) -> ReadRecord:
        get = self._samples(rows, fields, RAW)

        def read(r: int, key: int) -> tuple[Any, Any, dict[str, Any]]:
            image, label, _key, out = get(r)
            return image, label, out

        return read

    def _samples(
        self, rows: np.ndarray | None, fields: tuple[str, ...], kind: LabelKind
    ) -> ReadSample:
        """``f(r) -> (image, label, key, fields)`` of sample ``r`` for a chunk reading ``rows``
        (``None``: any), its label typed as ``kind`` says; a label that does not fit it is a
        ``CorruptRecordError`` naming the file, the key and the offset."""
        f, pos = self._file(), self.rows
        problem, label_of = kind.problem, kind.of

        def slow(r: int) -> tuple[Any, Any, int, dict[str, Any]]:
            p = r if pos is None else int(pos[r])
            if fields:
                header, image, out = f.read_fields(p, fields)
            else:
                (header, image), out = f.read_header(p), {}
            bad = problem(header)
            if bad is not None:
                raise CorruptRecordError(f.path, f.offset(p), bad, key=f.key(p))
            return image, label_of(header), f.key(p), out

        ok = kind.fast()
        if fields or ok is None:
            return slow
        if rows is not None and pos is not None:
            rows = np.asarray(rows, dtype=np.int64).reshape(-1)
            rows = pos[rows[(rows >= 0) & (rows < pos.shape[0])]]
        plain = f.plain_reader(rows)
        if plain is None:
            return slow
        if pos is not None:
            plain = _through(plain, pos)
        as_label = kind.scalar

        def get(r: int) -> tuple[Any, Any, int, dict[str, Any]]:
            got = plain(r)
            if got is None:
                return slow(r)
            label, image, k = got
            if not ok(label):
                return slow(r)  # which names the record
            return image, as_label(label), k, {}

        return get


def _through(read: Callable[[int], Any], pos: np.ndarray) -> Callable[[int], Any]:
    """``read`` of file positions as a read of samples (an insightface set's image records)."""
    n = int(pos.shape[0])

    def image(r: int) -> Any:
        return read(int(pos[r])) if 0 <= r < n else None

    return image
