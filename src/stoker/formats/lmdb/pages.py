"""LMDB's two meta pages, read with plain file reads and checked against the file before liblmdb
maps it.

liblmdb trusts its meta pages: a file shorter than the pages they count is mapped anyway, and
reading past its end kills the process with SIGBUS. So the file is checked first: both meta
pages, the page size, and that the file holds every page up to the last one committed.

Layout of a meta page (64-bit liblmdb, little-endian; byte offsets in the page)::

    offset  size  field
    0       8     page number
    10      2     page flags: P_META (0x08) on a meta page
    16      4     magic 0xBEEFC0DE
    20      4     data version = 1
    40      4     page size (the free database's md_pad)
    88      48    the main database: flags u16 at 92, depth u16 at 94, entries u64 at 120,
                  root page u64 at 128 (all ones: empty)
    136     8     last page number in use
    144     8     transaction id

Page 0 and page 1 (at byte ``page size``) are the two meta pages; liblmdb uses the one with the
higher transaction id (page 0 on a tie), and so does this check.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from stoker._core.errors import CorruptRecordError
from stoker.formats.lmdb.location import LmdbFormatError

__all__ = ["Meta", "read_meta"]

_P_META = 0x08
_MAGIC = 0xBEEFC0DE
_VERSION = 1
_EMPTY = (1 << 64) - 1  # P_INVALID: the root of an empty database
_SIZE = 152  # the page header and the meta record: what liblmdb reads of each meta page
_HEAD = struct.Struct("<QHHHHIIQQIHHQQQQQIHHQQQQQQQ")


@dataclass(frozen=True)
class Meta:
    """What the meta page liblmdb uses says: page size, last page, transaction id, and the
    main database's root page, depth and entry count."""

    psize: int
    last_pg: int
    txnid: int
    root: int
    depth: int
    entries: int
    which: int  # 0 or 1: the meta page in use

    @property
    def committed(self) -> int:
        """Bytes the committed pages span: what the file must hold."""
        return (self.last_pg + 1) * self.psize


def _unpack(buf: bytes) -> dict[str, int]:
    f = _HEAD.unpack_from(buf)
    return {
        "flags": f[2],
        "magic": f[5],
        "version": f[6],
        "psize": f[9],
        "depth": f[19],
        "entries": f[23],
        "root": f[24],
        "last_pg": f[25],
        "txnid": f[26],
    }


def read_meta(data_file: str, name: str) -> Meta:
    """The meta page liblmdb will use, after checking the file against it.

    :class:`LmdbFormatError` naming the database ``name`` when page 0 is not an LMDB meta page
    (the file is not an LMDB database); :class:`CorruptRecordError` naming the file and the
    byte offset of the field at fault when the second meta page, the page size, the data
    version, the last page, the root page or the file's length is wrong."""
    with open(data_file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(_SIZE)
        if len(first) < _SIZE:
            raise LmdbFormatError(
                name, f"not a readable LMDB database: {size} bytes, shorter than a meta page"
            )
        m0 = _unpack(first)
        if not m0["flags"] & _P_META or m0["magic"] != _MAGIC:
            raise LmdbFormatError(
                name, "not a readable LMDB database: byte 0 does not start an LMDB meta page"
            )
        psize = m0["psize"]
        _check_page(data_file, m0, 0)
        if not 256 <= psize <= 65536 or psize & (psize - 1):
            raise CorruptRecordError(
                data_file,
                40,
                f"meta page 0 gives a page size of {psize} "
                "(LMDB's is a power of two from 256 to 65536)",
            )
        f.seek(psize)
        second = f.read(_SIZE)
    if len(second) < _SIZE:
        raise CorruptRecordError(
            data_file, psize, f"the file ends ({size} bytes) inside meta page 1 (page size {psize})"
        )
    m1 = _unpack(second)
    if not m1["flags"] & _P_META or m1["magic"] != _MAGIC:
        raise CorruptRecordError(data_file, psize, "meta page 1 is not an LMDB meta page")
    _check_page(data_file, m1, psize)
    which = 1 if m1["txnid"] > m0["txnid"] else 0
    m = (m0, m1)[which]
    if m["psize"] != psize:
        raise CorruptRecordError(
            data_file,
            which * psize + 40,
            f"meta page {which} gives a page size of {m['psize']}, meta page 0 {psize}",
        )
    meta = Meta(psize, m["last_pg"], m["txnid"], m["root"], m["depth"], m["entries"], which)
    at = which * psize
    if meta.last_pg < 1:  # pages 0 and 1 are the meta pages, even in an empty database
        raise CorruptRecordError(
            data_file, at + 136, f"meta page {which} gives {meta.last_pg} as the last page"
        )
    if size < meta.committed:
        raise CorruptRecordError(
            data_file,
            at + 136,
            f"truncated: meta page {which} counts {meta.last_pg + 1} pages of {psize} bytes "
            f"({meta.committed} bytes), the file holds {size}",
        )
    if meta.root != _EMPTY and not 2 <= meta.root <= meta.last_pg:
        raise CorruptRecordError(
            data_file,
            at + 128,
            f"meta page {which} puts the root page at {meta.root}, outside pages 2..{meta.last_pg}",
        )
    return meta


def _check_page(data_file: str, m: dict[str, int], at: int) -> None:
    if m["version"] != _VERSION:
        raise CorruptRecordError(
            data_file,
            at + 20,
            f"meta page {at and 1} has data version {m['version']}; liblmdb reads version 1",
        )
