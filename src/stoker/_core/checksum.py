"""CRC32C (Castagnoli) and sha256 of whole files: what a manifest records of each shard
(``rec_crc32c``, a tar's ``sha256``) and what a downloaded or uploaded copy is checked
against."""

from __future__ import annotations

import hashlib
import os
from typing import Any, BinaryIO

from stoker._core.crc import crc32c

__all__ = ["file_crc32c", "file_crc32c_md5", "file_sha256", "stream_crc32c"]

_CHUNK = 4 << 20


def stream_crc32c(f: BinaryIO, *, md5: Any = None) -> int:
    """The CRC32C of what is left to read in ``f``, read in 4 MiB chunks (fed to ``md5`` too,
    a ``hashlib`` object, when given)."""
    value = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):  # type: ignore[attr-defined]
        value = crc32c(view[:n], value=value)
        if md5 is not None:
            md5.update(view[:n])
    return value


def file_crc32c(path: str | os.PathLike[str]) -> int:
    """The CRC32C of the whole file at ``path``."""
    with open(os.fspath(path), "rb", buffering=0) as f:
        return stream_crc32c(f)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the whole file at ``path``, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(os.fspath(path), "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_crc32c_md5(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The CRC32C and the hex MD5 of the file at ``path``, in one read (an object store's
    ETag of a single-part upload is its MD5)."""
    md5 = hashlib.md5(usedforsecurity=False)
    with open(os.fspath(path), "rb", buffering=0) as f:
        return stream_crc32c(f, md5=md5), md5.hexdigest()
