"""The shard cache's file-level pieces: entry and temporary file names, folder listings,
disk preallocation, marker reading and the check of a downloaded file. The protocol that uses
them is the NOTE in :mod:`stoker.storage.cache`."""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from stoker._core.checksum import file_crc32c, file_sha256
from stoker._core.oscompat import OWN_FILE, libc_function

__all__: list[str] = []  # private to stoker.storage.cache

_KEY = re.compile(r"[A-Za-z0-9._-]{1,200}")
DATA, MARK, PART, MARK_TMP = ".data", ".ok", ".part", ".mark"
NOFOLLOW = OWN_FILE
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
LOCK_FILE = os.O_RDWR | os.O_CREAT | NOFOLLOW
_FALLOC_FL_KEEP_SIZE = 1


def is_key(key: object) -> bool:
    """A cache key: 1 to 200 of ``A-Za-z0-9._-``, and not ``.`` or ``..``."""
    return isinstance(key, str) and bool(_KEY.fullmatch(key)) and key not in (".", "..")


def check_file(path: str, size: int, crc: int | None, sha256: str | None = None) -> str | None:
    """What is wrong with the downloaded file, or None."""
    got = os.stat(path).st_size
    if got != size:
        return f"{got} bytes written, {size} expected"
    if crc is not None:
        value = file_crc32c(path)
        if value != crc:
            return f"CRC32C {value:08x}, expected {crc:08x}"
    if sha256 is not None:
        digest = file_sha256(path)
        if digest != sha256:
            return f"sha256 {digest}, expected {sha256}"
    return None


@functools.cache
def _fallocate() -> Any:
    return libc_function(
        "fallocate", ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    )


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for ``fd`` without changing its size (so a short
    download still shows as short); OSError(ENOSPC) when the disk cannot hold them. Where the
    filesystem cannot preallocate, check the free space instead."""
    if size <= 0:
        return
    fn = _fallocate()
    if fn is not None:
        if fn(fd, _FALLOC_FL_KEEP_SIZE, 0, size) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err))
    if not hasattr(os, "fstatvfs"):  # Windows: the write itself reports a full disk
        return
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < size:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def listing(folder: str) -> Iterator[tuple[str, os.stat_result]]:
    """(name, lstat) of each file in ``folder``; files that vanish meanwhile are skipped."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        try:
            st = os.lstat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            yield name, st


def split_entry(name: str) -> tuple[str, str]:
    for suffix in (DATA, MARK):
        key = name[: -len(suffix)]
        if name.endswith(suffix) and is_key(key):
            return key, suffix
    return "/" + name, ""  # not an entry's file: evicted first


def parse_tmp(name: str) -> tuple[str, int] | None:
    """(key, reserved bytes) of a temporary file's name, or None when it is not ours."""
    if name.endswith(PART):
        parts = name[: -len(PART)].rsplit(".", 3)
        if len(parts) == 4 and parts[1].isdigit() and is_key(parts[0]):
            return parts[0], int(parts[1])
    elif name.endswith(MARK_TMP):
        parts = name[: -len(MARK_TMP)].rsplit(".", 2)
        if len(parts) == 3 and is_key(parts[0]):
            return parts[0], 0
    return None


def read_marker(path: str) -> dict[str, Any]:
    """The marker's fields; empty when it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        try:
            marker = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}
