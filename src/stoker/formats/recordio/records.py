"""The contract every RecordIO reader object keeps, so that callers never guess at attributes.

:func:`~stoker.formats.recordio.open_records` returns a :class:`Records` (a ``RecordFile`` for
one ``.rec``, a ``RecordSet`` for a manifest of several shards), and ``images()`` returns one
too. Beyond the :class:`~stoker.formats.base.Reader` basics (``len``, ``key``, ``read``,
``close``) every one has:

- ``keys``: int64 keys in position order; ``read_header(i)``: ``(IRHeader, image bytes)``;
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
from typing import TYPE_CHECKING

import numpy as np

from stoker.formats.base import Reader
from stoker.formats.recordio.header import IRHeader

if TYPE_CHECKING:
    from stoker.formats.recordio.reader import RecordFile

__all__ = ["PlainRead", "Records"]

#: ``f(i)`` of :meth:`Records.plain_reader`: ``(label, image bytes, key)`` or ``None``.
PlainRead = Callable[[int], tuple[float, memoryview, int] | None]


class Records(Reader):
    """A RecordIO reader: one ``.rec``, several shards read as one, or a view of either
    (see the module docstring for what every one has)."""

    manifest: dict | None
    class_names: list[str] | None

    @property
    @abc.abstractmethod
    def keys(self) -> np.ndarray:
        """int64 keys in position order."""

    @property
    @abc.abstractmethod
    def shards(self) -> Sequence[RecordFile]:
        """The single-file readers holding the records, in position order (a
        ``RecordSet`` opens them as they are asked for)."""

    @abc.abstractmethod
    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        """``(IRHeader, image bytes)`` of position ``i``."""

    @abc.abstractmethod
    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Labels of all records (or of ``positions``) without decoding images."""

    @abc.abstractmethod
    def images(self) -> Records:
        """The image records only: ``self`` unless the set has the insightface layout."""

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
