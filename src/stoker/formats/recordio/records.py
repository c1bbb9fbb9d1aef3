"""The contract every RecordIO reader object keeps, so that callers never guess at attributes.

:func:`~stoker.formats.recordio.open_records` returns a :class:`Records` (a ``RecordFile`` for
one ``.rec``, a ``RecordSet`` for a manifest of several shards), and ``images()`` returns one
too. Every one has ``len``, ``key(i)``, ``read(i)`` (the record's payload as a memoryview, valid
until ``close``), ``close()`` (and closes on leaving a ``with`` block), and:

- ``keys``: int64 keys in position order; ``read_header(i)``: ``(IRHeader, image bytes)``
  (the image alone: a record's field trailer is cut off); ``read_fields(i, names=None)``:
  ``(IRHeader, image bytes, {name: value})`` of the stored fields (``stoker.formats.fields``);
  ``schema``: the manifest's declared :class:`~stoker._core.schema.Schema`, else an image and
  its float32 label(s);
  ``labels(positions=None)``: float32 ``(N,)`` or ``(N, k)`` without decoding images;
- ``shards``: the single-file readers (``RecordFile``, each with ``path``, ``size``,
  ``offsets`` and ``offset(i)``) that hold the records, in position order; a single file is
  its own one shard;
- ``manifest``: the ``NAME.stoker.json`` dict it was opened with, or ``None``;
  ``class_names``: the class names in id order, or ``None``;
- ``identity_ranges``, ``image_keys``, ``image_positions``: the insightface layout (see
  ``insightface.py``), ``None`` for every other set; ``images()``: the image records only
  (``self`` unless the set has that layout);
- ``plain_reader(positions=None)``: a reader for hot loops over single-part records with one
  label (it checks each record's bounds and, with checksums on, its CRC32C), or ``None``
  where there is none (several shards, a shrunk file): the caller then reads with
  ``read_header``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.schema import Schema
from stoker.formats.recordio.header import IRHeader
from stoker.formats.recordio.manifest import manifest_schema

__all__ = ["PlainRead", "Records"]

#: ``f(i)`` of :meth:`Records.plain_reader`: ``(label, image bytes, key)`` or ``None``.
PlainRead = Callable[[int], tuple[float, memoryview, int] | None]


class Records(abc.ABC):
    """A RecordIO reader: one ``.rec``, several shards read as one, or a view of either
    (see the module docstring for what every one has). A context manager: ``close`` on exit."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def key(self, i: int) -> int: ...

    @abc.abstractmethod
    def read(self, i: int) -> memoryview:
        """Record ``i``'s payload, valid until ``close``."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record position {i} out of range for {n} records")
        return i + n if i < 0 else i

    manifest: dict | None
    class_names: list[str] | None

    @property
    @abc.abstractmethod
    def keys(self) -> np.ndarray:
        """int64 keys in position order."""

    @property
    @abc.abstractmethod
    def shards(self) -> Sequence[Any]:
        """The single-file readers holding the records, in position order (a
        ``RecordSet`` opens them as they are asked for)."""

    @abc.abstractmethod
    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        """``(IRHeader, image bytes)`` of position ``i``."""

    @abc.abstractmethod
    def read_fields(
        self, i: int, names: Sequence[str] | None = None
    ) -> tuple[IRHeader, memoryview, dict[str, Any]]:
        """``(IRHeader, image bytes, fields)``: the stored fields ``names`` (all when ``None``)
        of position ``i``, each as ``Field.check`` gives it (a mask as its PNG bytes)."""

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

    @abc.abstractmethod
    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Labels of all records (or of ``positions``) without decoding images."""

    def images(self) -> Records:
        """The image records only: ``self`` unless the set has the insightface layout."""
        return self

    @property
    def identity_ranges(self) -> np.ndarray | None:
        """insightface layout: int64 ``(n_identities, 2)`` ``[start_key, end_key)``; else None."""
        return None

    @property
    def image_keys(self) -> np.ndarray | None:
        """insightface layout: the keys that are images; else None."""
        return None

    @property
    def image_positions(self) -> np.ndarray | None:
        """insightface layout: the positions of the image records; else None."""
        return None

    def plain_reader(self, positions: Sequence[int] | np.ndarray | None = None) -> PlainRead | None:
        """A fast reader of single-part, one-label records, or ``None`` where there is none."""
        return None
