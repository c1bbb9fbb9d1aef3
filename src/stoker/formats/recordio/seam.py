"""RecordIO behind the seam: a ``.rec``, its ``.idx`` or a ``NAME.stoker.json`` as a sample-level
:class:`~stoker.formats.base.Reader` (what the registry's ``open_reader`` returns), and the
registry's ``verify``.

The samples are the image records (an insightface set's header and identity records are not
samples); the label is the record's IRHeader label, of the kind the manifest declares (its
schema's header field; int64 class ids for a manifest with classes and no schema): a record
whose label does not fit it (2.5 in an int64 set, an id outside the classes) is a
``CorruptRecordError`` and never changes the set's dtype. A set without a manifest has its kind
inferred from every label (``inferred_kind``: int64 when most are whole numbers, else
float32), and a label that does not fit it is a corrupt record too.
:meth:`RecordIOReader.labels` gives the same in every process. A worker never holds
the label array: it reads each label from the header it parses anyway, so its start-up and
memory do not grow with the set (5.8M labels are 46 MB); the label's dtype and shape travel in
the pickle instead.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from math import isfinite
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.base import Reader, ReadSample, sha
from stoker.formats.recordio.header import (
    DECLARED_INT64,
    INFERRED_INT64,
    inferred_kind,
    label_problem,
    whole_numbers,
)
from stoker.formats.recordio.hints import AccessHints
from stoker.formats.recordio.insightface import layout_table
from stoker.formats.recordio.manifest import manifest_schema
from stoker.formats.recordio.recordset import RecordSet
from stoker.formats.recordio.verify import verify_records
from stoker.formats.remote import RemoteOptions, local_path, remote_url
from stoker.formats.report import VerifyReport, spread
from stoker.formats.shardfiles import ReadsRemoteShards
from stoker.formats.shards import ShardSet

__all__ = ["RecordIOReader", "open_reader", "open_records", "verify"]


def declared_kind(records: RecordSet) -> tuple[tuple[int, ...], str, int] | None:
    """``(shape, dtype, classes)`` of the labels the set's manifest declares: its schema's
    header field, or int64 class ids when it names classes without a schema (every folder
    packed before schemas were written); ``None`` for a set without a manifest, whose kind is
    inferred from its labels (``inferred_kind``)."""
    names = records.class_names or ()
    if records.manifest is None:
        return None
    declared = manifest_schema(records.manifest)
    head = declared.header_name if declared is not None else None
    if declared is not None and head is not None:
        f = declared[head]
        return tuple(f.shape), f.dtype, len(names) if not f.shape else 0
    return ((), "int64", len(names)) if names else None


def declared_labels(labels: np.ndarray, dtype: str, classes: int) -> np.ndarray:
    """``labels`` as the manifest declares them: int64 labels that are not whole numbers
    within int64 (or not class ids, with ``classes``) read as -1 (reading their record raises
    ``CorruptRecordError``); float32 labels as they are."""
    if dtype != "int64":
        return labels.astype(dtype)
    ok = whole_numbers(labels)
    if classes:
        ok &= (labels >= 0) & (labels < classes)
    if ok.ndim > 1:
        ok = np.broadcast_to(np.asarray(ok.all(axis=tuple(range(1, ok.ndim))))[:, None], ok.shape)
    return np.where(ok, labels, -1).astype(np.int64)


def _record_sizes(shards: Sequence[Any]) -> np.ndarray:
    """Each record's bytes on disk (framing and padding included), from the offsets."""
    parts = []
    for s in shards:
        offs = np.asarray(s.offsets, dtype=np.int64)
        if offs.size == 0:
            continue
        order = np.sort(offs)
        parts.append(np.append(order[1:], s.size) - order)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class RecordIOReader(ReadsRemoteShards, Reader):
    """The image records of a RecordIO set as a :class:`Reader`.

    ``checksums=True``: every record read is checked against the ``.crc32c`` side-car where
    the set has one (a ``.crc32c`` the manifest names but that is missing, or whose size does
    not fit the record count, is an error at open); ``False`` reads without it. ``cache``:
    use the index and label caches (:mod:`stoker._core.cache`).

    ``hints``: the access hints a chunk (``reader(indices)``) is read with when the set is
    larger than the page cache (:mod:`stoker.formats.recordio.hints`); an instance may set
    its own :class:`AccessHints` before it is used or sent to workers.
    """

    format = "recordio"
    hints: AccessHints = AccessHints()

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        checksums: bool = True,
        cache: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        if not isinstance(checksums, bool):
            raise TypeError(f"checksums must be True or False, got {checksums!r}")
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions, got {type(remote).__name__}")
        self.path = os.fspath(path)
        self.remote = remote if remote_url(self.path) is not None else None
        if self.remote is None and remote_url(self.path) is not None:
            self.remote = RemoteOptions()
        self.checksums = checksums
        self.cache = bool(cache)
        self._rec: RecordSet | None = None
        self._remote = None  # the open set's opener (a set in object storage)
        self._labels: np.ndarray | None = None
        self._keys: np.ndarray | None = None
        self._schema: Schema | None = None
        self._label_dtype = ""  # set when unpickled (see __getstate__)
        self._label_shape: tuple[int, ...] = ()
        self._classes = 0  # class ids a declared int64 label must be one of (0: any)
        self._whole_labels = ""  # why labels are int64 (a fraction is corrupt); "": need not be
        self._hints_on: bool | None = None  # decided at the first chunk in each process
        self._files = None
        self._len = len(self.records)

    @property
    def records(self) -> RecordSet:
        """The set's image records, opened on first use in this process."""
        if self._rec is None:
            self._rec = RecordSet(
                self.path,
                verify_checksums="auto" if self.checksums else False,
                cache=self.cache,
                remote=self.remote,
                files=self._files,
                max_open=getattr(self, "_max_open", None),
                whole=getattr(self, "_cache_whole", None),
                images=True,
            )
            self._remote = self._rec.remote
        return self._rec

    def _shard_set(self) -> ShardSet:
        return self.records._set

    def __getstate__(self) -> dict:
        shape, dtype = self.label_kind()
        return {
            "path": self.path,
            "checksums": self.checksums,
            "cache": self.cache,
            "_len": self._len,
            "_label_dtype": dtype,
            "_label_shape": shape,
            "_classes": self._classes,
            "_whole_labels": self._whole_labels,
            "hints": self.hints,
            "remote": self.remote,
            # a remote set travels with what its opening learnt (sizes, the manifest's copy)
            # and how many shards a loader's claim on the cache lets each reader keep open
            # (and whether it claimed the whole set)
            "_files": getattr(self._rec, "files", None),
            "_max_open": getattr(self._remote, "_planned_open", None),
            "_cache_whole": getattr(self._remote, "_planned_whole", None),
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)  # what __getstate__ gives; the rest reopens here
        self._hints_on = self._rec = self._remote = None
        self._labels = self._keys = self._schema = None

    def __len__(self) -> int:
        return self._len

    def key(self, i: int) -> int:
        return int(self.records.key(i))

    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._keys = np.asarray(self.records.keys, dtype=np.int64)
            self.let_go()
        return self._keys

    def labels(self) -> np.ndarray:
        if self._labels is None:
            raw = np.asarray(self.records.labels())
            kind = declared_kind(self.records)
            dtype = inferred_kind(raw) if kind is None else kind[1]
            self._labels = declared_labels(raw, dtype, 0 if kind is None else kind[2])
            if kind is None:
                self._whole_labels = INFERRED_INT64 if dtype == "int64" else ""
            self.let_go()
        return self._labels

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        """``(shape, dtype)`` of one label: what the manifest declares (:func:`declared_kind`).
        A set without a declaration, local: from every label (:meth:`labels`); in object
        storage: from its first shard's labels, so opening it does not download every
        shard (a later shard whose labels are not whole numbers where the first shard's are
        is read as that dtype all the same)."""
        if not self._label_dtype:
            kind = declared_kind(self.records)
            if kind is not None:  # stated by the manifest: never inferred from the records
                self._label_shape, self._label_dtype, self._classes = kind
                self._whole_labels = DECLARED_INT64 if self._label_dtype == "int64" else ""
            elif self.remote is None or self._labels is not None:
                lab = self.labels()
                return tuple(lab.shape[1:]), lab.dtype.name
            else:
                raw = np.asarray(self.records.shard(0).labels())
                lab = declared_labels(raw, inferred_kind(raw), 0)
                self.let_go()  # the main process keeps nothing pinned
                self._label_dtype, self._label_shape = lab.dtype.name, tuple(lab.shape[1:])
                self._whole_labels = INFERRED_INT64 if lab.dtype == np.int64 else ""
        return self._label_shape, self._label_dtype

    @property
    def class_names(self) -> list[str] | None:
        names = self.records.class_names
        return list(names) if names else None

    @property
    def schema(self) -> Schema:
        """The schema the manifest declares (an image and its label without one), its header
        field typed as :meth:`labels` gives it."""
        if self._schema is None:
            if self._label_dtype:  # unpickled: from the state it was sent, not every label
                dtype, shape = self._label_dtype, self._label_shape
            else:
                shape, dtype = self.label_kind()
            declared = self.records.schema
            head = declared.header_name
            label = Field.numeric(shape, dtype, header=True)
            if head is None:
                self._schema = declared
            else:
                self._schema = Schema(
                    tuple((n, label if n == head else f) for n, f in declared.fields)
                )
            self.let_go()  # a remote set read its first shard for it: nothing stays pinned
        return self._schema

    def _label(self, i: int, header: Any) -> Any:
        """The label of position ``i`` as :meth:`labels` gives it, from its parsed header;
        ``CorruptRecordError`` naming the file, key and offset when it is NaN or infinite."""
        bad = label_problem(header, self._classes, whole=self._whole_labels)
        if bad is not None:
            path, off = self.locate(i) or (self.path, None)
            raise CorruptRecordError(path, off, bad, key=int(self.records.key(i)))
        if not self._label_dtype:  # the process that opened the set holds every label
            return self.labels()[i]
        if self._label_shape:
            return np.asarray(header.label, self._label_dtype).reshape(self._label_shape)
        return self._scalar_label(header.label)

    @property
    def _scalar_label(self) -> Callable[[Any], Any]:
        """An unpickled reader's conversion of a one-float header label to the label dtype."""
        return int if self._label_dtype == "int64" else np.float32

    def advise(self, indices: np.ndarray) -> bool:
        """Access hints for the chunk ``indices`` when :attr:`hints` decides for them (once
        per process, on the bytes of :meth:`files`); whether they were given."""
        if self._hints_on is None:
            try:
                size = sum(os.path.getsize(f) for f in self.files())
            except OSError:
                size = 0  # a file gone: reading it names the problem
            self._hints_on = self.hints.decide(size)
        if self._hints_on:
            for shard, pos in self.records.chunks(indices):
                shard.advise(pos)
        return self._hints_on

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        self.label_kind()  # what a label must be, decided in this process too
        if indices is not None:
            self._focus(indices)  # a remote set pins only what this chunk reads
            self.advise(indices)
        if fields:
            return self._field_reader(tuple(fields))
        rec, key, label_of = self.records, self.records.key, self._label

        def slow(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            k = key(i)
            header, image = rec.read_header(i)
            return image, label_of(i, header), k, {}

        # Unpickled (a worker), single-part records with one label take plain_reader: one
        # unpack for both headers, no per-sample fstat. Any other record, and every error,
        # goes the slow way, which names what is wrong.
        if not self._label_dtype or self._label_shape:
            return slow
        plain = rec.plain_reader(indices)  # None on sets of several shards
        if plain is None:
            return slow
        as_label, ok = self._scalar_label, self._label_ok()

        def get(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            got = plain(i)
            if got is None:
                return slow(i)
            label, image, k = got
            if not ok(label):
                return slow(i)  # which names the record
            return image, as_label(label), k, {}

        return get

    def _label_ok(self) -> Callable[[float], bool]:
        """The fast path's one test of a one-float label: finite, and where the labels are
        int64 (declared or inferred) a whole number within int64 (or one of its class ids). A label
        that fails goes the slow way, whose ``label_problem`` names what is wrong."""
        if not self._whole_labels:
            return isfinite
        lo, hi = (0.0, float(self._classes)) if self._classes else (-(2.0**63), 2.0**63)
        if self._classes:
            return lambda v: lo <= v < hi and v.is_integer()  # NaN and inf compare False
        return lambda v: lo < v < hi and v.is_integer()

    def _field_reader(self, names: tuple[str, ...]) -> ReadSample:
        rec = self.records
        stored = rec.schema.stored
        unknown = [n for n in names if n not in stored]
        if unknown:
            raise SpecError(
                f"{self.path}: no stored fields {unknown}; the set stores {list(stored) or 'none'}"
            )
        key, label_of = rec.key, self._label

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            header, image, vals = rec.read_fields(i, names)
            return image, label_of(i, header), key(i), vals

        return read

    def locate(self, i: int) -> tuple[str, int] | None:
        """``(file, byte offset)`` of sample ``i``: the shard ``.rec`` and the record's offset."""
        j, k = self.records.locate(i)
        shard = self.records.shard(j)
        return shard.path, int(shard.offset(k))

    def shard_sizes(self) -> np.ndarray:
        """Image records per shard: a manifest's record counts, in manifest order; a single
        ``.rec`` is one shard."""
        return self.records.shard_sizes()

    def files(self) -> list[str]:
        """The ``.rec`` files that hold the records (every shard of a set)."""
        rec = self.records
        return [rec.shard_location(j) for j in range(len(rec.shards))]

    def summary(self) -> dict:
        """What ``stoker inspect`` shows of a RecordIO set beyond the samples: every record
        (an insightface set's header and identity records too), shards, ``.rec`` bytes, bytes
        per record, the insightface layout (``identities``; ``metadata_records`` and, by kind,
        ``metadata``: ``header``, ``identity`` and ``other`` records that hold no image), the
        rejects the manifest counts."""
        full = RecordSet(self.path, verify_checksums=False, cache=self.cache, remote=self.remote)
        try:
            shards = full.shards
            out: dict[str, Any] = {
                "records": len(full),
                "shards": len(shards),
                "rec_bytes": int(sum(s.size for s in shards)),
                "bytes_per_record": spread(_record_sizes(shards)),
            }
            if len(full) != self._len:
                out["metadata_records"] = len(full) - self._len
            if full.identity_ranges is not None:
                n = int(len(full.identity_ranges))
                out["identities"] = n
                kinds = {"header": 1, "identity": n, "other": len(full) - self._len - 1 - n}
                out["metadata"] = {k: v for k, v in kinds.items() if v or k != "other"}
            if full.manifest:
                out["rejects"] = full.manifest.get("rejects", {}).get("count")
            return out
        finally:
            full.close()

    def identity_table(self) -> dict[str, Any] | None:
        """An insightface set's header and identity records as JSON (``layout_table``: what
        ``stoker unpack`` keeps beside the images); ``None`` for any other set."""
        return layout_table(self.records)

    def describe(self, i: int) -> str:
        rec = self.records
        where = f"key {rec.key(i)} (position {i}) of {self.path}"
        try:
            where += f", byte offset {rec.offset(i)}"
        except Exception:  # noqa: BLE001 - best effort for a message
            pass
        return where

    def fingerprint(self) -> dict:
        rec = self._rec
        if rec is not None and rec.files is not None:
            # the manifest pins every shard (size, .idx digest, CRC): its digest is the set's
            with open(rec.files.manifest_copy(), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:32]
            return {"type": "records", "len": self._len, "manifest_sha": digest}
        size = 0
        try:
            size = os.path.getsize(self.path)
        except OSError:
            pass
        return {
            "type": "records",
            "len": self._len,
            "bytes": size,
            "sha": sha(self.keys().tobytes(), self.labels().tobytes()),
        }

    def close(self) -> None:
        if self._rec is not None:
            self._rec.close()
            self._rec = self._remote = None


def open_reader(
    path: str | os.PathLike[str],
    *,
    checksums: bool = True,
    cache: bool = True,
    remote: RemoteOptions | None = None,
) -> RecordIOReader:
    """The registry's opener: a ``.rec``, its ``.idx`` or a ``NAME.stoker.json`` (a path or
    a URL; ``remote``: how to reach and cache it) as a :class:`RecordIOReader`."""
    return RecordIOReader(path, checksums=checksums, cache=cache, remote=remote)


def open_records(
    path: str | os.PathLike[str],
    *,
    verify_checksums: bool | str = False,
    cache: bool = True,
    remote: RemoteOptions | None = None,
) -> RecordIOReader:
    """Deprecated (goes in the next release): RecordIO's :class:`RecordIOReader`, as
    ``stoker.formats.open(path)`` gives it (``verify_checksums``: any but ``False`` checks
    the ``.crc32c`` where the set has one). ``RecordSet(path)`` reads records by position."""
    warnings.warn(
        "open_records is deprecated and goes in the next release: stoker.formats.open(path) "
        "gives the same Reader; stoker.formats.recordio.RecordSet(path) reads records",
        DeprecationWarning,
        stacklevel=2,
    )
    checksums = verify_checksums is not False
    return RecordIOReader(path, checksums=checksums, cache=cache, remote=remote)


def verify(
    path: str | os.PathLike[str],
    *,
    idx_path: str | os.PathLike[str] | None = None,
    remote: RemoteOptions | None = None,
    **kw: Any,
) -> VerifyReport:
    """The registry's ``verify``: :func:`~stoker.formats.recordio.verify_records` on ``path``
    (an ``.idx`` is verified with the ``.rec`` beside it), with its options ``kw``
    (``checksums``, ``decode``, ``max_problems``, ``progress``, ``allow_missing_checksums``). A
    manifest's URL is verified shard by shard through the shard cache (``remote``: how to
    reach and cache it; see :func:`~stoker.formats.recordio.verify_remote.verify_remote`)."""
    url = remote_url(os.fspath(path))
    if url is not None:
        if idx_path is not None:
            raise ValueError("idx_path is for a local .rec; a set in object storage has a manifest")
        from stoker.formats.recordio.verify_remote import verify_remote

        return verify_remote(url, remote=remote, **kw)
    return verify_records(local_path(os.fspath(path)), idx_path=idx_path, **kw)
