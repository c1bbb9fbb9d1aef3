"""The key list: every LMDB key in database order, so sample ``i`` is one B-tree lookup away.

LMDB has no "i-th record"; a cursor only walks. The list is built once with one cursor pass over
the keys alone (values are not touched) and cached in the cache directory
(``stoker._core.cache``, kind ``lmdb-keys``, keyed by ``data.mdb``'s real path, size,
modification time and inode), so later opens and every worker map the file instead of walking.

Cache layout (little-endian)::

    offset      size      field
    0           8         magic b"STKLMK\\x00\\x01"
    8           4         version (uint32) = 1
    12          4         reserved (uint32) = 0
    16          8         count N (uint64)
    24          8         key bytes B (uint64)
    32          8         LMDB last transaction id when built (uint64)
    40          8(N+1)    offsets (uint64): key i is blob[offsets[i]:offsets[i+1]];
                          offsets[0] = 0, strictly increasing, offsets[N] = B
    48+8N       B         blob: the keys, concatenated in database order (sorted bytes)

A cache is used only when its size is exactly what its header says, its offsets are valid,
and its count and transaction id are the database's own (so a database written again, even
within one mtime tick, gets a new list). It is written to a temporary name and renamed; an
unwritable cache directory means building the list in memory on every open.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
from array import array
from typing import Any

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file
from stoker._core.oscompat import BINARY
from stoker.formats.lmdb.location import damaged, import_lmdb

__all__ = ["KeyList", "load_keys"]

_MAGIC = b"STKLMK\x00\x01"
_VERSION = 1
_HEAD = struct.Struct("<8sIIQQQ")  # 40 bytes
SUFFIX = ".stklmk"


class KeyList:
    """Keys by position: ``len``, ``key(i) -> bytes``, ``digest()``."""

    def __init__(self, offsets: np.ndarray, blob: memoryview, keep: Any = None) -> None:
        self.offsets = offsets
        self.blob = blob
        self._keep = keep  # the mmap the arrays view, when they came from the cache

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def key(self, i: int) -> bytes:
        return bytes(self.blob[int(self.offsets[i]) : int(self.offsets[i + 1])])

    def digest(self) -> bytes:
        h = hashlib.sha256()
        h.update(self.offsets.tobytes())
        h.update(self.blob)
        return h.digest()

    def close(self) -> None:
        keep, self._keep = self._keep, None
        self.offsets = np.zeros(1, dtype=np.uint64)
        self.blob = memoryview(b"")
        if keep is not None:
            with contextlib.suppress(BufferError):
                keep.close()  # a view still held elsewhere keeps the map until it goes


def _db_state(env: Any) -> tuple[int, int]:
    """(entries, last transaction id) of the main database."""
    return int(env.stat()["entries"]), int(env.info()["last_txnid"])


def build_keys(env: Any, data_file: str) -> KeyList:
    """One cursor pass over the keys alone; liblmdb's errors name the position reached."""
    blob = bytearray()
    ends = array("Q", [0])
    lmdb = import_lmdb()
    with env.begin(buffers=True) as txn:
        try:
            for k in txn.cursor().iternext(keys=True, values=False):
                blob += k
                ends.append(len(blob))
        except lmdb.Error as e:
            raise damaged(data_file, e, position=len(ends) - 1) from None
    return KeyList(np.frombuffer(ends, dtype=np.uint64).copy(), memoryview(bytes(blob)))


def _read_cache(path: str, entries: int, txnid: int) -> KeyList | None:
    try:
        fd = os.open(path, os.O_RDONLY | BINARY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < _HEAD.size:
            return None
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    magic, version, _, n, b, built_txn = _HEAD.unpack_from(mm, 0)
    if (
        magic != _MAGIC
        or version != _VERSION
        or n != entries
        or built_txn != txnid
        or size != _HEAD.size + 8 * (n + 1) + b  # checked before any array is made
    ):
        mm.close()
        return None
    offsets = np.frombuffer(mm, dtype="<u8", count=n + 1, offset=_HEAD.size)
    ok = offsets[0] == 0 and offsets[-1] == b and bool(np.all(offsets[1:] > offsets[:-1]))
    if not ok:
        del offsets
        mm.close()
        return None
    return KeyList(offsets, memoryview(mm)[_HEAD.size + 8 * (n + 1) :], keep=mm)


def _chunks(keys: KeyList, txnid: int) -> list[bytes]:
    head = _HEAD.pack(_MAGIC, _VERSION, 0, len(keys), len(keys.blob), txnid)
    return [head, keys.offsets.astype("<u8").tobytes(), bytes(keys.blob)]


def load_keys(env: Any, data_file: str) -> KeyList:
    """The key list of ``env`` (whose data file is ``data_file``): from the cache when it is
    valid, else built and cached."""
    entries, txnid = _db_state(env)
    path = None
    with contextlib.suppress(OSError):
        path = cache_file("lmdb-keys", data_file, SUFFIX)
    if path is not None:
        cached = _read_cache(path, entries, txnid)
        if cached is not None:
            return cached
    keys = build_keys(env, data_file)
    if path is not None and len(keys) == entries:
        write_cache_file(path, _chunks(keys, txnid))
    return keys
