"""Packed RecordIO records as a source (``.rec``, ``.idx`` or a ``NAME.stoker.json`` manifest):
the RecordIO reader behind the seam (``stoker.formats.recordio.seam``) seen as a source."""

from __future__ import annotations

import os

from stoker.formats.recordio import FORMAT as RECORDIO
from stoker.loader.sources.formats import FormatSource

__all__ = ["RecordSource"]


class RecordSource(FormatSource):
    """Records from a ``.rec`` (with its ``.idx``) or a ``NAME.stoker.json`` manifest.

    The label is the record's IRHeader label (int64 when every label is a whole number, else
    float32); the key is the record key from the index.

    ``checksums=True`` (the default): where the set has its ``.crc32c`` side-car, every
    record read is checked against it in the worker (a mismatch is a
    :class:`~stoker.CorruptRecordError`, raised or skipped as ``on_error`` says); a
    ``.crc32c`` the manifest names but that is missing, or whose size does not fit the
    record count, is an error here. ``checksums=False`` reads without them.
    """

    def __init__(self, path: str | os.PathLike[str], *, checksums: bool = True) -> None:
        if not isinstance(checksums, bool):
            raise TypeError(f"checksums must be True or False, got {checksums!r}")
        super().__init__(path, format=RECORDIO.name, checksums=checksums)
        self.checksums = checksums
