"""A binary cache of every record's label, in the cache directory (:mod:`stoker._core.cache`:
an entry ``recordio-labels/<hash>.stklab`` keyed by the ``.rec``'s real path, size, mtime and
inode; never beside the data, so read-only and shared sets get it too).

Labels live in the record headers, spread over the whole ``.rec``: reading them all touches
one page per record, which for MS1M (5.8M records, tens of GB) is a pass over the file on
every open, and a long one when the file is not in the page cache. The loader needs them up
front (the label dtype, class-balanced samplers), so the first computation is kept here and
later opens read 4 bytes per label. It holds the labels of one run of positions
``first .. first + N - 1``: every record (``first = 0``), or the image records of an
insightface set (``1 .. M``: its header and identity records carry other label counts).

Layout (little-endian)::

    offset  size  field
    0       8     magic b"STKLAB\\x00\\x01"
    8       4     version (uint32) = 2
    12      4     k: labels per record (uint32; 0: one scalar label, flag 0)
    16      8     N records (uint64)
    24      8     .rec size (uint64)
    32      8     .rec mtime_ns (int64)
    40      8     .rec inode (uint64)
    48      8     .idx size (uint64; 0 without an .idx)
    56      8     .idx mtime_ns (int64)
    64      8     .idx inode (uint64)
    72      8     first: the position of the first label (uint64)
    80      4·N·max(k, 1)   labels (float32), in .idx order

It is used only when every recorded size, mtime and inode matches; a file modified less than
two seconds ago is not cached (coarse mtimes could hide an in-place rewrite). Written under a
unique temporary name and renamed; skipped when the cache directory cannot be made or written;
never unpickled.
"""

from __future__ import annotations

import os
import struct
import time

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file
from stoker.formats.recordio.index import RACY_NS, stat_sig  # the index cache's rules

__all__ = ["LABEL_CACHE_SUFFIX", "label_cache_path", "read_label_cache", "write_label_cache"]

LABEL_CACHE_SUFFIX = ".stklab"
_MAGIC = b"STKLAB\x00\x01"
_VERSION = 2
_HEAD = struct.Struct("<8sIIQQqQQqQQ")  # 80 bytes


def label_cache_path(rec_path: str) -> str | None:
    """The cache entry of ``rec_path`` as it is now, or ``None`` when there is no usable
    cache directory (or the ``.rec`` cannot be read)."""
    try:
        return cache_file("recordio-labels", rec_path, LABEL_CACHE_SUFFIX)
    except OSError:
        return None


def _sig(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return (0, 0, 0)
    try:
        return stat_sig(os.stat(path))
    except OSError:
        return None


def read_label_cache(
    rec_path: str, idx_path: str | None, n: int, first: int = 0
) -> np.ndarray | None:
    """The cached labels of positions ``first .. first + n - 1`` (float32 ``(n,)`` or
    ``(n, k)``), or ``None`` when absent, stale or kept for other positions."""
    rec_sig, idx_sig = _sig(rec_path), _sig(idx_path)
    if rec_sig is None or idx_sig is None:
        return None
    cpath = label_cache_path(rec_path)
    if cpath is None:
        return None
    try:
        with open(cpath, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size:
                return None
            magic, version, k, count, *sigs, start = _HEAD.unpack(head)
            if magic != _MAGIC or version != _VERSION or count != n or k > 1 << 20:
                return None
            if tuple(sigs[:3]) != rec_sig or tuple(sigs[3:6]) != idx_sig or start != first:
                return None
            width = max(k, 1)
            body = f.read(4 * n * width + 1)
    except OSError:
        return None
    if len(body) != 4 * n * width:
        return None
    labels = np.frombuffer(body, dtype="<f4").astype(np.float32)
    return labels if k == 0 else labels.reshape(n, k)


def write_label_cache(
    rec_path: str, idx_path: str | None, labels: np.ndarray, first: int = 0
) -> None:
    """Keep ``labels`` (of positions ``first ..``, .idx order) in the cache entry of
    ``rec_path``; best effort. They replace the labels of any other positions kept there."""
    rec_sig, idx_sig = _sig(rec_path), _sig(idx_path)
    if rec_sig is None or idx_sig is None:
        return
    now = time.time_ns()
    if now - rec_sig[1] < RACY_NS or (idx_path is not None and now - idx_sig[1] < RACY_NS):
        return  # too fresh to tell an in-place rewrite from this version
    lab = np.ascontiguousarray(labels, dtype="<f4")
    k = 0 if lab.ndim == 1 else int(lab.shape[1])
    head = _HEAD.pack(_MAGIC, _VERSION, k, int(lab.shape[0]), *rec_sig, *idx_sig, int(first))
    cpath = label_cache_path(rec_path)
    if cpath is not None:
        write_cache_file(cpath, [head, lab.tobytes()])  # best effort
