"""Packed RecordIO records for the loader (``.rec``, ``.idx`` or a ``NAME.stoker.json``
manifest): RecordIO's reader with the loader's defaults."""

from __future__ import annotations

import os

from stoker.formats.recordio.seam import RecordIOReader

__all__ = ["RecordSource"]


class RecordSource(RecordIOReader):
    """Records from a ``.rec`` (with its ``.idx``) or a ``NAME.stoker.json`` manifest: the
    RecordIO :class:`~stoker.formats.Reader`, refused when it holds no record.

    The label is the record's IRHeader label (int64 when every label is a whole number, else
    float32); the key is the record key from the index.

    ``checksums=True`` (the default): where the set has its ``.crc32c`` side-car, every
    record read is checked against it in the worker (a mismatch is a
    :class:`~stoker.CorruptRecordError`, raised or skipped as ``on_error`` says); a
    ``.crc32c`` the manifest names but that is missing, or whose size does not fit the
    record count, is an error here. ``checksums=False`` reads without them.
    """

    def __init__(self, path: str | os.PathLike[str], *, checksums: bool = True) -> None:
        super().__init__(path, checksums=checksums)
        if len(self) == 0:
            from stoker.loader.sources.opening import empty_set_error

            self.close()
            raise empty_set_error(self.path)
