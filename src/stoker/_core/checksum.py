"""CRC32C (Castagnoli) of whole files: what a manifest records of each shard
(``rec_crc32c``) and what a downloaded or uploaded copy is checked against."""

from __future__ import annotations

import os

import crc32c

__all__ = ["file_crc32c"]

_CHUNK = 4 << 20


def file_crc32c(path: str | os.PathLike[str]) -> int:
    """The CRC32C of the whole file at ``path``, read in 4 MiB chunks."""
    value = 0
    with open(os.fspath(path), "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            value = crc32c.crc32c(view[:n], value=value)
    return value
