"""RecordIO behind the seam: a ``.rec``, its ``.idx`` or a ``NAME.stoker.json`` as a sample-level
:class:`~stoker.formats.base.Reader` (the registry's ``open_reader``): a :class:`~stoker.
formats.sharded.ShardedReader` of :class:`~stoker.formats.recordio.shard.RecordIOShard`.

The samples are the image records (an insightface set's header and identity records are not
samples); the label is the record's IRHeader label, of the kind the manifest declares (its
schema's header field; int64 class ids for a manifest with classes and no schema): a record
whose label does not fit it (2.5 in an int64 set, an id outside the classes) is a
``CorruptRecordError`` and never changes the set's dtype. A set without a manifest has its kind
inferred from every label (``inferred_kind``: int64 when most are whole numbers, else
float32), and a label that does not fit it is a corrupt record too. The kind
(:class:`~stoker.formats.recordio.header.LabelKind`) travels in the pickle: a worker reads each
label from the header it parses and never holds the label array (5.8M labels are 46 MB).
Keys are each shard's ``.idx`` keys (keys of different shards may repeat).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any, cast

import numpy as np

from stoker._core.errors import CorruptRecordError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.base import ReadSample, sha
from stoker.formats.recordio.header import (
    DECLARED_INT64,
    INFERRED_INT64,
    LabelKind,
    inferred_kind,
    whole_numbers,
)
from stoker.formats.recordio.hints import AccessHints
from stoker.formats.recordio.insightface import layout_table
from stoker.formats.recordio.manifest import manifest_schema
from stoker.formats.recordio.paths import manifest_path_for
from stoker.formats.recordio.shard import RecordIOShard
from stoker.formats.report import spread
from stoker.formats.sharded import RemoteOptions, ShardedReader, local_path
from stoker.formats.shards import ShardSet

__all__ = ["RecordIOReader", "open_reader", "open_records"]


def declared_labels(labels: np.ndarray, dtype: str, classes: int) -> np.ndarray:
    """``labels`` as ``dtype``: int64 labels that are not whole numbers within int64 (or not
    one of ``classes`` class ids) read as -1 (reading their record raises
    ``CorruptRecordError``); float32 labels as they are."""
    if dtype != "int64":
        return labels.astype(dtype)
    ok = whole_numbers(labels)
    if classes:
        ok &= (labels >= 0) & (labels < classes)
    if ok.ndim > 1:
        ok = np.broadcast_to(np.asarray(ok.all(axis=tuple(range(1, ok.ndim))))[:, None], ok.shape)
    return np.where(ok, labels, -1).astype(np.int64)


class RecordIOReader(ShardedReader):
    """The image records of a RecordIO set as a :class:`Reader`.

    ``checksums=True``: every record read is checked against the ``.crc32c`` side-car where
    the set has one (a ``.crc32c`` the manifest names but that is missing, or whose size does
    not fit the record count, is an error at open); ``False`` reads without it. ``cache``:
    use the index and label caches (:mod:`stoker._core.cache`). ``hints``: the access hints a
    chunk (``reader(indices)``) is read with when the set is larger than the page cache
    (:mod:`stoker.formats.recordio.hints`); an instance may set its own before it is used or
    sent to workers.
    """

    format = "recordio"
    hints: AccessHints = AccessHints()
    marks = 3  # a shard's .rec, .idx and .crc32c, whichever are read
    empty_ok = True

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
        p = os.fspath(path)
        rec = local_path(p)
        if rec.endswith(".idx"):
            rec = rec[:-4] + ".rec"
            if not os.path.exists(rec):
                raise FileNotFoundError(f"{p}: no {os.path.basename(rec)} beside it")
        options = {"checksums": checksums, "cache": bool(cache)}
        super().__init__(
            rec, format="recordio", remote=remote, sibling=manifest_path_for(rec), **options
        )
        self._config["given"] = p  # what the fingerprint sizes

    def _reopen(self, config: dict[str, Any], opened: Any) -> None:
        if not config["options"]["checksums"]:  # no .crc32c fetched or checked
            config = {**config, "roles": ("data", "index")}
        super()._reopen(config, opened)
        self.checksums, self.cache = config["options"]["checksums"], config["options"]["cache"]
        self._kind: LabelKind | None = None  # decided in the process that opens the set
        self._hints_on: bool | None = None  # decided at the first chunk in each process

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "kind": self.label_type(), "hints": self.hints}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._kind, self.hints = state["kind"], state["hints"]

    def _positions(self, src: Any) -> ShardSet:
        """A set of one local shard opens it now: its files checked, insightface's layout
        recognised (its samples are the image records; a malformed layout is an error here)."""
        if len(self._files) != 1 or self._remote is not None:
            return super()._positions(src)
        self._rio(0)._find_layout()
        return ShardSet([len(self._rio(0))])

    def _rio(self, j: int) -> RecordIOShard:
        return cast(RecordIOShard, self.shard(j))

    def _stored_keys(self) -> np.ndarray:
        self._ensure()
        parts = [np.asarray(self._rio(j).keys(), np.int64) for j in range(len(self._files))]
        self._let_go()
        return np.concatenate([np.zeros(0, np.int64), *parts])

    # ------------------------------------------------------------------ labels
    def labels(self) -> np.ndarray:
        if self._labels is None:
            raw, kind = self._raw_labels(), self._declared()
            dtype = inferred_kind(raw) if kind is None else kind.dtype
            self._labels = declared_labels(raw, dtype, 0 if kind is None else kind.classes)
            self._labels.setflags(write=False)
        return self._labels

    def _raw_labels(self) -> np.ndarray:
        """Every IRHeader label as stored (float32); an error names the first record of a
        shard whose records carry another label count than the earlier shards'."""
        self._ensure()
        parts: list[np.ndarray] = []
        first = np.zeros(0, np.float32)  # what a set without a record gives
        for j in range(len(self._files)):
            lab = (sh := self._rio(j)).labels()
            first = lab if j == 0 else first
            if not len(lab):
                continue
            if parts and lab.shape[1:] != parts[0].shape[1:]:
                f, p = sh._file(), sh._at(0)
                counts = [int(a.shape[1]) if a.ndim == 2 else 0 for a in (lab, parts[0])]
                raise CorruptRecordError(
                    f.path,
                    f.offset(p),
                    f"records carry different label counts: this shard's have {counts[0]} "
                    f"(IRHeader flag), earlier shards' {counts[1]} (manifest {self.manifest_path})",
                    key=f.key(p),
                    idx_line=f.idx_line(p),
                )
            parts.append(lab)
        self._let_go()  # a remote set keeps nothing pinned in this process
        return np.concatenate(parts) if parts else first

    def _declared(self) -> LabelKind | None:
        """The label kind the manifest declares: its schema's header field, or int64 class
        ids when it names classes without a schema; ``None``: inferred from the labels."""
        self._ensure()
        classes = len(self._class_names or ())
        declared = manifest_schema(self.manifest) if self.manifest is not None else None
        head = declared.header_name if declared is not None else None
        if declared is None or head is None:
            return LabelKind((), "int64", classes, DECLARED_INT64) if classes else None
        f = declared[head]
        whole = DECLARED_INT64 if f.dtype == "int64" else ""
        return LabelKind(tuple(f.shape), f.dtype, 0 if f.shape else classes, whole)

    def label_type(self) -> LabelKind:
        """The set's :class:`LabelKind`: declared by the manifest, else inferred from every
        label; a set in object storage infers it from its first shard's labels, so opening
        it downloads no more (a later shard is read as that dtype all the same)."""
        if self._kind is None:
            kind = self._declared()
            if kind is None:
                if self._remote is None or self._labels is not None:
                    lab = self.labels()
                else:
                    raw = np.asarray(self._rio(0).labels())
                    self._let_go()
                    lab = declared_labels(raw, inferred_kind(raw), 0)
                whole = INFERRED_INT64 if lab.dtype == np.int64 else ""
                kind = LabelKind(tuple(lab.shape[1:]), lab.dtype.name, 0, whole)
            self._kind = kind
        return self._kind

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        kind = self.label_type()
        return kind.shape, kind.dtype

    @property
    def schema(self) -> Schema:
        """The schema the manifest declares (else an image and its IRHeader label(s), of the
        first record's label count), its header field typed as :meth:`labels` gives it."""
        if self._schema is None:
            self._ensure()
            kind = self.label_type()
            declared = manifest_schema(self.manifest) if self.manifest else None
            if declared is None:  # a set without one: its first record's label count
                declared = self._rio(0).schema if self._files else Schema.classification()
            label = Field.numeric(kind.shape, kind.dtype, header=True)
            head = declared.header_name
            fields = tuple((n, label if n == head else f) for n, f in declared.fields)
            self._schema = declared if head is None else Schema(fields)
            self._let_go()  # a remote set read its first shard for it: nothing stays pinned
        return self._schema

    # ------------------------------------------------------------------ reading
    def _advise(self, rows: dict[int, np.ndarray]) -> bool:
        """Access hints for a chunk's ``rows`` by shard when :attr:`hints` decides for them
        (once per process, on the bytes of :meth:`files`); whether they were given."""
        if self._hints_on is None:
            try:
                size = sum(os.path.getsize(f) for f in self.files())
            except OSError:
                size = 0  # a file gone: reading it names the problem
            self._hints_on = self.hints.decide(size)
        if self._hints_on:
            for j, r in rows.items():
                self._rio(j)._advise(r)
        return self._hints_on

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        """``f(i) -> (image, label, key, fields)``: a set of one local shard reads through its
        shard's reader directly; any other set finds each sample's shard first."""
        self._ensure()
        kind, names = self.label_type(), tuple(fields)
        stored = self.schema.stored if names else ()
        if unknown := [n for n in names if n not in stored]:
            raise SpecError(
                f"{self.path}: no stored fields {unknown}; the set stores {list(stored) or 'none'}"
            )
        rows: dict[int, np.ndarray] = {}
        if indices is not None:
            self._focus(indices)  # a remote set pins only what this chunk reads
            pos = np.asarray(indices, dtype=np.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < len(self))]
            if len(self._files) == 1:
                rows = {0: pos}
            else:
                of = self._set.shard_of(pos)
                rows = {j: pos[of == j] - self._set.starts[j] for j in np.unique(of).tolist()}
            self._advise(rows)
        shard = self._rio
        if len(self._files) == 1 and self._remote is None:
            return shard(0)._samples(rows.get(0), names, kind)
        got: dict[int, ReadSample] = {}
        locate, use, is_open = self._set.locate, self._open.get, self._open.__contains__

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            j, r = locate(i, self.path)
            f = got.get(j)
            if f is None or not is_open(j):
                f = got[j] = shard(j)._samples(rows.get(j), names, kind)
            else:
                use(j)
            return f(r)

        return read

    # ------------------------------------------------------------------ what it is
    def files(self) -> list[str]:
        """The ``.rec`` files that hold the records (every shard of a set)."""
        self._ensure()
        return [f.where for f in self._files]

    def summary(self) -> dict:
        """What ``stoker inspect`` shows of a RecordIO set beyond the samples: every record
        (an insightface set's header and identity records too), shards, ``.rec`` bytes, bytes
        per record, the insightface layout (``identities``; ``metadata_records`` and, by kind,
        ``metadata``: ``header``, ``identity`` and ``other`` records that hold no image), the
        rejects the manifest counts."""
        shards, sizes = [], [np.zeros(0, np.int64)]
        for j in range(len(self._files)):
            shards.append(sh := self._rio(j))
            offs = np.sort(np.asarray(sh._file().offsets, dtype=np.int64))
            sizes.append(np.append(offs[1:], sh.size) - offs)
        self._let_go()
        records = sum(sh.count for sh in shards)
        extra = records - len(self)
        out: dict[str, Any] = {
            "records": records,
            "shards": len(shards),
            "rec_bytes": int(sum(sh.size for sh in shards)),
            "bytes_per_record": spread(np.concatenate(sizes)),
        }
        if extra:
            out["metadata_records"] = extra
        if (layout := shards[0].layout if shards else None) is not None:
            n = out["identities"] = int(len(layout.ranges))
            kinds = {"header": 1, "identity": n, "other": extra - 1 - n}
            out["metadata"] = {k: v for k, v in kinds.items() if v or k != "other"}
        if self.manifest:
            out["rejects"] = self.manifest.get("rejects", {}).get("count")
        return out

    def identity_table(self) -> dict[str, Any] | None:
        """An insightface set's header and identity records as JSON (``layout_table``: what
        ``stoker unpack`` keeps beside the images); ``None`` for any other set."""
        sh = self._rio(0) if len(self.shard_sizes()) == 1 else None
        return None if sh is None or sh.layout is None else layout_table(sh._file(), sh.layout)

    def fingerprint(self) -> dict:
        self._ensure()
        out = {"type": "records", "len": len(self)}
        if self._remote is not None:  # the manifest pins every shard (size, .idx digest, CRC)
            with open(self._remote.files.manifest_copy(), "rb") as f:
                return {**out, "manifest_sha": hashlib.sha256(f.read()).hexdigest()[:32]}
        given = self._config.get("given", self.path)
        size = os.path.getsize(given) if os.path.isfile(given) else 0
        return {**out, "bytes": size, "sha": sha(self.keys().tobytes(), self.labels().tobytes())}


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
    """Deprecated (goes in the next release): the :class:`RecordIOReader` that
    ``stoker.formats.open(path)`` gives (``verify_checksums``: any but ``False`` checks the
    ``.crc32c`` where the set has one)."""
    warnings.warn(
        "open_records is deprecated and goes in the next release: stoker.formats.open(path) "
        "gives the same Reader",
        DeprecationWarning,
        stacklevel=2,
    )
    checksums = verify_checksums is not False
    return RecordIOReader(path, checksums=checksums, cache=cache, remote=remote)
