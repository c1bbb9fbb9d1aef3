"""The ``.idx`` file (text lines ``key<TAB>offset``) and its binary cache.

Parsing is vectorised: one ``bytes.translate`` checks that the separators are exactly
``\\t`` and ``\\n`` (or ``\\r\\n``) in alternation, then ``np.fromstring`` reads every number
in one C loop. Anything unusual (blank lines, spaces, signs, junk) falls back to a line-by-line
parser that names the offending line. The validated result is cached in the cache directory
(:mod:`stoker._core.cache`: an entry ``recordio-index/<hash>.stkidx`` keyed by the ``.idx``'s
real path, size, mtime and inode; nothing is written beside the data, so read-only and shared
sets get their cache too), and later opens read it instead of parsing (timings in
``docs/format.md``, "Opening a large ``.idx``").

Cache layout (little-endian)::

    offset  size  field
    0       8     magic b"STKIDX\\x00\\x01"
    8       4     version (uint32) = 1
    12      4     flags (uint32): bit 0 line numbers stored, bit 1 sha256 stored
    16      8     count N (uint64)
    24      8     .idx size (uint64)
    32      8     .idx mtime_ns (int64)
    40      8     .idx inode (uint64)
    48      8     .rec size the offsets were validated against (uint64)
    56      32    sha256 of the .idx bytes (zeros unless flag bit 1)
    88      8N    keys (int64)
    88+8N   8N    offsets (int64)
    88+16N  8N    .idx line numbers (int64), only with flag bit 0

The cache is rebuilt whenever the ``.idx`` size, mtime or inode, or the ``.rec`` size, differ
from what it records (an ``.idx`` younger than two seconds is not cached at all, since its
mtime may not yet tell an in-place rewrite apart); it is written to a unique temporary name
and renamed, so concurrent openers never see a torn cache. A cache directory that cannot be
made or written is skipped: the ``.idx`` is parsed on every open instead.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import warnings
from dataclasses import dataclass

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file
from stoker._core.errors import IndexFormatError
from stoker._core.oscompat import OWN_FILE, read_at

__all__ = [
    "CACHE_SUFFIX",
    "RACY_NS",
    "IndexTable",
    "cache_path",
    "fast_parse",
    "load_index",
    "parse_idx",
    "sha256_file",
    "slow_parse",
    "stat_sig",
]

CACHE_SUFFIX = ".stkidx"
_CACHE_MAGIC = b"STKIDX\x00\x01"
_CACHE_VERSION = 1
_CACHE_HEAD = struct.Struct("<8sIIQQqQQ32s")  # 88 bytes
FLAG_LINES = 1
FLAG_SHA = 2
_MAX_DIGITS = 18  # every 18-digit number fits int64
_INT64_MAX = np.iinfo(np.int64).max
# File systems stamp mtimes with a coarse clock: an .idx rewritten in place within the same
# tick keeps size and mtime. Like git's "racily clean" rule, an .idx modified less than this
# long ago is parsed but not cached; the next open caches it.
RACY_NS = 2_000_000_000


@dataclass(frozen=True, eq=False)
class IndexTable:
    """A validated ``.idx``: ``keys[i]`` and ``offsets[i]`` of position ``i``.

    ``lines`` holds the 1-based ``.idx`` line of each position when it differs from
    ``i + 1`` (blank lines present), else ``None``. ``sha256`` is the hex digest of the
    ``.idx`` bytes when it was computed.
    """

    keys: np.ndarray
    offsets: np.ndarray
    lines: np.ndarray | None = None
    sha256: str | None = None

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def line_of(self, i: int) -> int:
        return int(self.lines[i]) if self.lines is not None else i + 1


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file."""
    from stoker._core.checksum import file_sha256

    return file_sha256(path)


def cache_path(idx_path: str | os.PathLike[str]) -> str | None:
    """The cache entry of ``idx_path`` as it is now (its identity names the entry), or
    ``None`` when there is no usable cache directory (or the ``.idx`` cannot be read)."""
    try:
        return cache_file("recordio-index", idx_path, CACHE_SUFFIX)
    except OSError:
        return None


# --------------------------------------------------------------------------- parsing


def fast_parse(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """Both columns, or ``None`` when the text is anything but clean ``digits\\tdigits`` lines."""
    seps = data.translate(None, b"0123456789")
    nl = seps.count(b"\n")
    for pat in (b"\t\n", b"\t\r\n"):
        body = pat * nl
        if seps == body or seps == body + b"\t" or seps == body + b"\t\r":
            n = nl + (seps != body)
            break
    else:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nums = np.fromstring(data, dtype=np.int64, sep=" ")
    except (ValueError, DeprecationWarning):
        return None
    if nums.shape[0] != 2 * n or (n and int(nums.max()) >= _INT64_MAX):
        return None
    return nums[0::2], nums[1::2]  # strided views: no second copy of 2N numbers


def _field(path: str, lineno: int, raw: bytes, what: str) -> int:
    text = raw.strip()
    if not text:
        raise IndexFormatError(path, lineno, f"empty {what}")
    if text.startswith(b"-") and text[1:].isdigit():
        raise IndexFormatError(path, lineno, f"negative {what} {text.decode('ascii')}")
    if not (text.isdigit() and text.isascii()):
        shown = text[:40].decode("ascii", "backslashreplace")
        raise IndexFormatError(path, lineno, f"{what} is not a non-negative integer: {shown!r}")
    if len(text.lstrip(b"0")) > _MAX_DIGITS:
        raise IndexFormatError(path, lineno, f"{what} has too many digits ({len(text)})")
    return int(text)


def slow_parse(data: bytes, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys, offsets and 1-based lines, line by line; :class:`IndexFormatError` names the
    first line that is not ``key<TAB>offset`` (blank lines are skipped)."""
    keys: list[int] = []
    offsets: list[int] = []
    lines: list[int] = []
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip() and b"\t" not in line:
            continue  # blank lines (and a trailing newline) are tolerated; a lone tab is not
        parts = line.split(b"\t")
        if len(parts) != 2:
            shown = line[:60].decode("ascii", "backslashreplace")
            what = "no tab" if len(parts) == 1 else f"{len(parts) - 1} tabs"
            raise IndexFormatError(
                path, lineno, f"expected 'key<TAB>offset', found {what}: {shown!r}"
            )
        keys.append(_field(path, lineno, parts[0], "key"))
        offsets.append(_field(path, lineno, parts[1], "offset"))
        lines.append(lineno)
    return (
        np.asarray(keys, dtype=np.int64),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(lines, dtype=np.int64),
    )


def parse_idx(
    data: bytes, path: str | os.PathLike[str], *, rec_size: int | None = None
) -> IndexTable:
    """Parse and validate ``.idx`` text.

    Raises :class:`IndexFormatError` naming the line for a missing tab, a non-integer or
    negative field, an offset that is not 4-byte aligned, lies past the end of a
    ``rec_size``-byte ``.rec`` or is not after the previous line's (each record once, in
    file order), and duplicate keys (naming both lines). CRLF line ends, a
    missing final newline and blank lines are accepted.
    """
    path = os.fspath(path)
    fast = fast_parse(data)
    lines: np.ndarray | None
    if fast is not None:
        keys, offsets = fast
        lines = None
    else:
        keys, offsets, lines = slow_parse(data, path)
        if lines.shape[0] and bool(np.all(lines == np.arange(1, lines.shape[0] + 1))):
            lines = None
    for arr in (keys, offsets):
        arr.flags.writeable = False
    table = IndexTable(keys, offsets, lines)
    validate_table(table, path, rec_size=rec_size)
    return table


def validate_table(table: IndexTable, path: str, *, rec_size: int | None) -> None:
    """:class:`IndexFormatError` naming the first line with an unaligned offset, an offset
    at or past the end of a ``rec_size``-byte ``.rec``, a key seen before, or an offset not
    after the line before it."""
    keys, offsets = table.keys, table.offsets
    n = keys.shape[0]
    if n == 0:
        return

    def refuse_first(bad: np.ndarray, what: str) -> None:
        hits = np.flatnonzero(bad)
        if hits.size:
            i = int(hits[0])
            raise IndexFormatError(
                path, table.line_of(i), f"offset {int(offsets[i])} of key {int(keys[i])} {what}"
            )

    refuse_first(
        offsets & 3, "is not a multiple of 4 (RecordIO records start on 4-byte boundaries)"
    )
    if rec_size is not None:
        refuse_first(
            offsets >= rec_size,
            f"is past the end of the .rec ({rec_size} bytes): the .rec was cut short or this "
            ".idx belongs to another file",
        )
    if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        dup = np.flatnonzero(sk[1:] == sk[:-1])
        if dup.size:
            # report the duplicate whose second occurrence comes first in the file
            firsts = order[dup]
            seconds = order[dup + 1]
            j = int(np.argmin(seconds))
            a, b = int(firsts[j]), int(seconds[j])
            raise IndexFormatError(
                path,
                table.line_of(b),
                f"duplicate key {int(keys[b])} (also on line {table.line_of(a)}); "
                "each key must appear once",
            )
    if n > 1 and not bool(np.all(offsets[1:] > offsets[:-1])):
        # records are written one after another and each is listed once, so the offsets of
        # a .idx in its writer's order only grow; one repeated would read a record twice
        i = int(np.flatnonzero(offsets[1:] <= offsets[:-1])[0]) + 1
        raise IndexFormatError(
            path,
            table.line_of(i),
            f"offset {int(offsets[i])} of key {int(keys[i])} is not after line "
            f"{table.line_of(i - 1)}'s {int(offsets[i - 1])}: a .idx lists each record once, "
            "in file order",
        )


# --------------------------------------------------------------------------- cache


def stat_sig(st: os.stat_result) -> tuple[int, int, int]:
    """``(size, mtime_ns, inode)``: what a cache records of the file it was derived from."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def _read_cache(cpath: str, idx_st: os.stat_result, rec_size: int) -> IndexTable | None:
    try:
        fd = os.open(cpath, os.O_RDONLY | OWN_FILE)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < _CACHE_HEAD.size:
            return None
        head = read_at(fd, _CACHE_HEAD.size, 0)
        magic, version, flags, n, isz, imt, ino, rsz, sha = _CACHE_HEAD.unpack(head)
        if magic != _CACHE_MAGIC or version != _CACHE_VERSION or flags & ~3:
            return None
        if (isz, imt, ino) != stat_sig(idx_st) or rsz != rec_size:
            return None
        cols = 3 if flags & FLAG_LINES else 2
        if n > (1 << 40) or size != _CACHE_HEAD.size + 8 * n * cols:
            return None
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return IndexTable(empty, empty.copy(), None, sha.hex() if flags & FLAG_SHA else None)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    # Arrays are views of the shared, read-only mapping: worker processes share the pages.
    body = np.frombuffer(mm, dtype="<i8", offset=_CACHE_HEAD.size, count=n * cols)
    keys, offsets = body[:n], body[n : 2 * n]
    lines = body[2 * n :] if flags & FLAG_LINES else None
    return IndexTable(keys, offsets, lines, sha.hex() if flags & FLAG_SHA else None)


def _write_cache(cpath: str, table: IndexTable, idx_st: os.stat_result, rec_size: int) -> None:
    flags = (FLAG_LINES if table.lines is not None else 0) | (FLAG_SHA if table.sha256 else 0)
    head = _CACHE_HEAD.pack(
        _CACHE_MAGIC,
        _CACHE_VERSION,
        flags,
        len(table),
        *stat_sig(idx_st),
        rec_size,
        bytes.fromhex(table.sha256) if table.sha256 else bytes(32),
    )
    body = [
        head,
        np.ascontiguousarray(table.keys, dtype="<i8").tobytes(),
        np.ascontiguousarray(table.offsets, dtype="<i8").tobytes(),
    ]
    if table.lines is not None:
        body.append(np.ascontiguousarray(table.lines, dtype="<i8").tobytes())
    write_cache_file(cpath, body)  # best effort: an unwritable cache runs without one


def load_index(
    idx_path: str | os.PathLike[str],
    *,
    rec_size: int,
    cache: bool = True,
    want_sha256: bool = False,
) -> IndexTable:
    """The validated index of ``idx_path`` for a ``rec_size``-byte ``.rec``.

    With ``cache`` the binary cache in the cache directory is used when fresh and
    (re)written otherwise. ``want_sha256`` makes sure ``IndexTable.sha256`` is filled in.
    """
    path = os.fspath(idx_path)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        cpath = cache_path(path) if cache else None
        if cpath is not None:
            table = _read_cache(cpath, st, rec_size)
            if table is not None and (table.sha256 or not want_sha256):
                return table
        data = f.read()
    if len(data) != st.st_size:
        raise IndexFormatError(path, 0, "the .idx changed size while it was being read")
    table = parse_idx(data, path, rec_size=rec_size)
    if want_sha256 or cache:
        table = IndexTable(table.keys, table.offsets, table.lines, hashlib.sha256(data).hexdigest())
    if cpath is not None and time.time_ns() - st.st_mtime_ns > RACY_NS:
        _write_cache(cpath, table, st, rec_size)
    return table
