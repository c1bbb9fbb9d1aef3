"""Packed RecordIO records as a source (``.rec``, ``.idx`` or a ``NAME.stoker.json`` manifest)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.schema import Field, Schema
from stoker.loader.sources.base import Source, integral_labels, sha

__all__ = ["RecordSource"]


def _no_records(path: str) -> Exception:
    """The error for a set without a single (image) record: nothing to load."""
    from stoker._core.errors import CorruptRecordError, ManifestError

    reason = "0 records: the set is empty, there is nothing to load"
    if path.endswith(".json"):
        return ManifestError(f"{path}: {reason}")
    return CorruptRecordError(path, None, reason)


class RecordSource(Source):
    """Records from a ``.rec`` (with its ``.idx``) or a ``NAME.stoker.json`` manifest.

    The label is the record's IRHeader label (int64 when every label is a whole number, else
    float32); the key is the record key from the index.

    ``checksums=True`` (the default): where the set has its ``.crc32c`` side-car, every
    record read is checked against it in the worker (a mismatch is a
    :class:`~stoker.CorruptRecordError`, raised or skipped as ``on_error`` says); a
    ``.crc32c`` the manifest names but that is missing, or whose size does not fit the
    record count, is an error here. ``checksums=False`` reads without them.
    """

    encoded = True

    def __init__(self, path: str | os.PathLike[str], *, checksums: bool = True) -> None:
        self.path = os.fspath(path)
        if not isinstance(checksums, bool):
            raise TypeError(f"checksums must be True or False, got {checksums!r}")
        self.checksums = checksums
        self._rec: Any = None
        self._labels: np.ndarray | None = None
        self._label_dtype = ""  # set when unpickled in a worker (see __getstate__)
        self._label_shape: tuple[int, ...] = ()
        self._keys: np.ndarray | None = None
        self._schema: Schema | None = None
        self._len = len(self._records())
        if self._len == 0:
            self.close()
            raise _no_records(self.path)

    def _records(self) -> Any:
        if self._rec is None:
            from stoker.formats.recordio import open_records

            # the image records only: an insightface set's header and identity records
            # (record 0 and those after the images) are not samples
            self._rec = open_records(
                self.path, verify_checksums="auto" if self.checksums else False
            ).images()
        return self._rec

    def __getstate__(self) -> dict:
        # Not the label array: a worker reads each label from the header it parses anyway,
        # so its start-up and memory do not grow with the dataset (5.8M labels are 46 MB).
        lab = self.labels()
        return {
            "path": self.path,
            "checksums": self.checksums,
            "_len": self._len,
            "_label_dtype": lab.dtype.name,
            "_label_shape": tuple(lab.shape[1:]),
        }

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self.checksums = state["checksums"]
        self._len = state["_len"]
        self._label_dtype = state["_label_dtype"]
        self._label_shape = state["_label_shape"]
        self._labels = None
        self._rec = None
        self._keys = None
        self._schema = None

    def __len__(self) -> int:
        return self._len

    def key(self, i: int) -> int:
        return int(self._records().key(i))

    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._keys = np.asarray(self._records().keys, dtype=np.int64)
        return self._keys

    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._labels = integral_labels(np.asarray(self._records().labels()))
        return self._labels

    def read(self, i: int) -> tuple[Any, Any]:
        header, image = self._records().read_header(i)
        return image, self._label(i, header)

    def _label(self, i: int, header: Any) -> Any:
        """The label of position ``i`` as ``labels()`` gives it, from its parsed header."""
        if not self._label_dtype:  # the process that opened the source holds every label
            return self.labels()[i]
        # a worker: as labels() gives it (int64 class ids when the dataset's labels are whole)
        if self._label_shape:
            return np.asarray(header.label, self._label_dtype).reshape(self._label_shape)
        return self._scalar_label(header.label)

    @property
    def schema(self) -> Schema:
        """The schema the set's manifest declares (an image and its label for a set without
        one), its header field typed as :meth:`labels` gives it (int64 class ids when every
        label is a whole number, else float32)."""
        if self._schema is None:
            if self._label_dtype:  # a worker: from the state it was sent, not every label
                dtype, shape = self._label_dtype, self._label_shape
            else:
                lab = self.labels()
                dtype, shape = lab.dtype.name, tuple(lab.shape[1:])
            declared = self._records().schema
            head = declared.header_name
            label = Field.numeric(shape, dtype, header=True)
            if head is None:
                self._schema = declared
            else:
                self._schema = Schema(
                    tuple((n, label if n == head else f) for n, f in declared.fields)
                )
        return self._schema

    def field_reader(
        self, names: tuple[str, ...], indices: np.ndarray | None = None
    ) -> Callable[[int], tuple[Any, Any, int, dict[str, Any]]]:
        """``f(i) -> (payload, label, key, fields)``: the image bytes, the label, the key and
        the stored fields ``names`` read from the record's trailer (a mask as its PNG bytes);
        with no names, :meth:`reader` (the fast path) and ``{}``."""
        if not names:
            return super().field_reader(names, indices)
        names = tuple(names)
        rec = self._records()
        stored = rec.schema.stored
        unknown = [n for n in names if n not in stored]
        if unknown:
            raise SpecError(
                f"{self.path}: no stored fields {unknown}; the set stores {list(stored) or 'none'}"
            )
        key = rec.key

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            header, image, fields = rec.read_fields(i, names)
            return image, self._label(i, header), key(i), fields

        return read

    @property
    def _scalar_label(self) -> Any:
        """A worker's conversion of a one-float header label to what ``labels()`` holds."""
        return int if self._label_dtype == "int64" else np.float32

    def reader(self, indices: np.ndarray | None = None) -> Callable[[int], tuple[Any, Any, int]]:
        # In a worker, single-part records with one label take RecordFile.plain_reader: one
        # unpack for both headers, no per-sample fstat. Any other record (and every error)
        # goes the way of read().
        slow = super().reader()
        if not self._label_dtype or self._label_shape:
            return slow
        plain = self._records().plain_reader(indices)  # None on sets of several shards
        if plain is None:
            return slow
        as_label = self._scalar_label

        def get(i: int) -> tuple[Any, Any, int]:
            got = plain(i)
            if got is None:
                return slow(i)
            label, image, key = got
            return image, as_label(label), key

        return get

    @property
    def class_names(self) -> list[str] | None:
        names = self._records().class_names
        return list(names) if names else None

    def describe(self, i: int) -> str:
        rec = self._records()
        where = f"key {rec.key(i)} (position {i}) of {self.path}"
        try:
            where += f", byte offset {rec.offset(i)}"
        except Exception:  # noqa: BLE001 - best effort for a message
            pass
        return where

    def fingerprint(self) -> dict:
        size = 0
        rec_path = self.path
        try:
            size = os.path.getsize(rec_path)
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
            self._rec = None
