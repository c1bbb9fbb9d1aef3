"""LMDB's on-disk pages, parsed in Python for the tests that damage them: where the meta pages,
the root, the branch, leaf and overflow pages of the main database are (64-bit liblmdb layout;
see ``src/stoker/formats/lmdb/pages.py`` for the byte offsets)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA = 0x01
HDR = 16  # page header: pgno u64, pad u16, flags u16, lower u16, upper u16


@dataclass
class Tree:
    """The main database's pages by kind (page numbers), its page size and chosen meta page."""

    psize: int
    meta: int  # 0 or 1: the meta page liblmdb uses (the higher transaction id)
    root: int
    last_pg: int
    branches: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    overflow: list[int] = field(default_factory=list)
    keys: dict[int, list[bytes]] = field(default_factory=dict)  # leaf page -> its keys
    nodes: dict[int, list[int]] = field(default_factory=dict)  # branch or leaf -> node offsets
    lower: dict[int, int] = field(default_factory=dict)  # branch or leaf -> end of its pointers

    def offset(self, pgno: int) -> int:
        return pgno * self.psize


def _meta(buf: bytes, at: int) -> tuple[int, int, int, int]:
    """(page size, main root, last page, transaction id) of the meta page at byte ``at``."""
    psize = struct.unpack_from("<I", buf, at + 40)[0]
    root = struct.unpack_from("<Q", buf, at + 128)[0]
    last_pg, txnid = struct.unpack_from("<QQ", buf, at + 136)
    return psize, root, last_pg, txnid


def tree(path: str | os.PathLike[str]) -> Tree:
    """Walk the main database's B-tree of ``path`` (a ``data.mdb``)."""
    with open(path, "rb") as f:
        buf = f.read()  # small test databases
    psize = _meta(buf, 0)[0]
    m0, m1 = _meta(buf, 0), _meta(buf, psize)
    which = 1 if m1[3] > m0[3] else 0
    _, root, last_pg, _ = (m0, m1)[which]
    t = Tree(psize, which, root, last_pg)

    def visit(pgno: int) -> None:
        at = pgno * psize
        flags, lower = struct.unpack_from("<HH", buf, at + 10)
        ptrs = struct.unpack_from(f"<{(lower - HDR) // 2}H", buf, at + HDR)
        t.nodes[pgno], t.lower[pgno] = list(ptrs), lower
        if flags & P_BRANCH:
            t.branches.append(pgno)
            for p in ptrs:
                lo, hi, fl = struct.unpack_from("<HHH", buf, at + p)
                visit(lo | hi << 16 | fl << 32)
        elif flags & P_LEAF:
            t.leaves.append(pgno)
            t.keys[pgno] = []
            for p in ptrs:
                fl, ksize = struct.unpack_from("<HH", buf, at + p + 4)
                t.keys[pgno].append(buf[at + p + 8 : at + p + 8 + ksize])
                if fl & F_BIGDATA:
                    (ov,) = struct.unpack_from("<Q", buf, at + p + 8 + ksize)
                    t.overflow.append(ov)

    visit(root)
    return t


def patch(path: str | os.PathLike[str], offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` of the file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
