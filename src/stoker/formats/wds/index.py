"""The member index of one tar shard: built with one pass over the headers (image and field
data are never read; only the few bytes of each ``.cls`` label), cached in the cache directory.

Grouping follows WebDataset (``layout``): consecutive members with one key form a sample; a
key that appears again later is an error naming both offsets, as is a suffix twice in one
sample, a sample without exactly one image, an unreadable ``.cls``, a set where only some
samples have a ``.cls``, a link, device or FIFO member, and a name that is absolute, holds
``..`` or a NUL. Folders are skipped; so are names WebDataset skips (no dot, hidden,
``__meta__``) and suffixes stoker does not use.

The cache entry (``cache_file("wds-index", tar, ".stkwds")``), all little-endian::

    magic       8 bytes   b"STKWDS\\x00\\x01"
    tar_size    uint64    the tar's size when indexed
    n, m        uint64 x2 samples, members
    key_bytes   uint64    length of the key blob
    suf_bytes   uint64    length of the suffix blob
    flags       uint64    0 (reserved)
    starts      int64[n+1]  first member row of each sample (the last: m)
    headers     int64[n]    byte offset of each sample's first header
    labels      int64[n]    the ``.cls`` value (0 without one)
    has_cls     uint8[n]    1 when the sample has a ``.cls``, padded with zeros to 8 bytes
    key_offs    int64[n+1]  offsets of each key in the key blob
    m_data      int64[m]    byte offset of each member's data
    m_size      int64[m]    its size
    m_suffix    int32[m]    its suffix (a row of the suffix list), padded to 8 bytes
    keys        key_bytes   the raw key names, concatenated
    suffixes    suf_bytes   the suffixes in UTF-8, each ended by a NUL

A cache entry is keyed by the tar's real path, size, modification time and inode, so a
changed file is indexed again; an entry that does not parse is rebuilt, never trusted.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file
from stoker._core.errors import CorruptRecordError
from stoker.formats.wds.layout import (
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    MAX_CLS_BYTES,
    parse_cls,
    split_name,
)
from stoker.formats.wds.tarfmt import DIRECTORY, TarError, Walk, walk

__all__ = ["OnProblem", "TarIndex", "build_index", "index_file", "load_index", "name_problem"]

MAGIC = b"STKWDS\x00\x01"
_HEAD = struct.Struct("<8s6Q")
#: ``on_problem(offset, reason)``: raise (a reader) or record (verify).
OnProblem = Callable[[int, str], None]


def refusing(path: str) -> OnProblem:
    """The ``on_problem`` of a reader: each finding a ``CorruptRecordError`` naming ``path``."""

    def refuse(offset: int, reason: str) -> None:
        raise CorruptRecordError(path, offset, reason)

    return refuse


def shown(name: bytes) -> str:
    return repr(name.decode("utf-8", "backslashreplace"))


def name_problem(name: bytes) -> str | None:
    """Why a member name is refused (absolute, ``..``, NUL, empty), or ``None``."""
    if not name:
        return "an empty member name"
    if b"\x00" in name:
        return f"member name {shown(name)} holds a NUL byte"
    if name.startswith((b"/", b"\\")) or name[1:3] in (b":/", b":\\"):
        return f"member name {shown(name)} is an absolute path"
    if b".." in name.replace(b"\\", b"/").split(b"/"):
        return f"member name {shown(name)} holds '..' (it would point outside the archive)"
    return None


@dataclass
class TarIndex:
    """The samples of one tar (see the module docstring for each array)."""

    tar_size: int
    starts: np.ndarray
    headers: np.ndarray
    labels: np.ndarray
    has_cls: np.ndarray
    key_offs: np.ndarray
    keys: bytes
    m_data: np.ndarray
    m_size: np.ndarray
    m_suffix: np.ndarray
    suffixes: list[str]

    def __len__(self) -> int:
        return int(self.headers.shape[0])

    def key_name(self, j: int) -> str:
        raw = self.keys[int(self.key_offs[j]) : int(self.key_offs[j + 1])]
        return raw.decode("utf-8", "backslashreplace")

    def column(self, suffixes: frozenset[str] | set[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per sample, the data offset and size of its member with one of ``suffixes``
        (``-1``, ``0`` when it has none)."""
        ids = [i for i, s in enumerate(self.suffixes) if s in suffixes]
        n = len(self)
        off = np.full(n, -1, dtype=np.int64)
        size = np.zeros(n, dtype=np.int64)
        if ids:
            rows = np.flatnonzero(np.isin(self.m_suffix, ids))
            owner = np.searchsorted(self.starts, rows, side="right") - 1
            off[owner] = self.m_data[rows]
            size[owner] = self.m_size[rows]
        return off, size

    def max_size(self, suffix: str) -> int | None:
        """The largest member with ``suffix``, ``None`` when there is none."""
        if suffix not in self.suffixes:
            return None
        sel = self.m_suffix == self.suffixes.index(suffix)
        return int(self.m_size[sel].max()) if sel.any() else None

    # ------------------------------------------------------------------ cache bytes
    def chunks(self) -> list[bytes]:
        n, m = len(self), int(self.m_data.shape[0])
        suf = b"".join(s.encode("utf-8") + b"\x00" for s in self.suffixes)
        head = _HEAD.pack(MAGIC, self.tar_size, n, m, len(self.keys), len(suf), 0)
        return [
            head,
            self.starts.astype("<i8").tobytes(),
            self.headers.astype("<i8").tobytes(),
            self.labels.astype("<i8").tobytes(),
            _pad8(self.has_cls.astype(np.uint8).tobytes()),
            self.key_offs.astype("<i8").tobytes(),
            self.m_data.astype("<i8").tobytes(),
            self.m_size.astype("<i8").tobytes(),
            _pad8(self.m_suffix.astype("<i4").tobytes()),
            self.keys,
            suf,
        ]


def _pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def parse_cache(raw: bytes, tar_size: int) -> TarIndex | None:
    """The index a cache entry holds, or ``None`` when it is not a sound one for a tar of
    ``tar_size`` bytes."""
    if len(raw) < _HEAD.size:
        return None
    magic, size, n, m, kb, sb, _flags = _HEAD.unpack_from(raw)
    if magic != MAGIC or size != tar_size or n > m or m > size // 512 or kb > size or sb > 1 << 20:
        return None
    lens = [
        8 * (n + 1),
        8 * n,
        8 * n,
        n + (-n % 8),
        8 * (n + 1),
        8 * m,
        8 * m,
        4 * m + (-4 * m % 8),
    ]
    if len(raw) != _HEAD.size + sum(lens) + kb + sb:
        return None
    parts, pos = [], _HEAD.size
    for k in lens:
        parts.append(raw[pos : pos + k])
        pos += k
    i8 = [np.frombuffer(p, "<i8").astype(np.int64) for p in (parts[0], parts[1], parts[2])]
    starts, headers, labels = i8
    has_cls = np.frombuffer(parts[3], np.uint8, count=n).astype(bool)
    key_offs = np.frombuffer(parts[4], "<i8").astype(np.int64)
    m_data = np.frombuffer(parts[5], "<i8").astype(np.int64)
    m_size = np.frombuffer(parts[6], "<i8").astype(np.int64)
    m_suffix = np.frombuffer(parts[7], "<i4", count=m).astype(np.int32)
    keys = raw[pos : pos + kb]
    blob = raw[pos + kb : pos + kb + sb]
    if not blob.endswith(b"\x00") and sb:
        return None
    try:
        suffixes = [s.decode("utf-8") for s in blob[:-1].split(b"\x00")] if sb else []
    except UnicodeDecodeError:
        return None
    ok = (
        starts[0] == 0
        and starts[-1] == m
        and bool(np.all(np.diff(starts) >= 1))
        and key_offs[0] == 0
        and key_offs[-1] == kb
        and bool(np.all(np.diff(key_offs) >= 1))
        and bool(np.all((m_data >= 0) & (m_size >= 0) & (m_data + m_size <= size)))
        and bool(np.all((m_suffix >= 0) & (m_suffix < len(suffixes))))
        and bool(np.all((headers >= 0) & (headers < size)))
    )
    if not ok:
        return None
    return TarIndex(
        size, starts, headers, labels, has_cls, key_offs, keys, m_data, m_size, m_suffix, suffixes
    )


class _Builder:
    """Collects members into samples during one walk (see the module docstring)."""

    def __init__(self, view: memoryview, on_problem: OnProblem) -> None:
        self.view, self.problem = view, on_problem
        self.starts: list[int] = []
        self.headers: list[int] = []
        self.labels: list[int] = []
        self.has_cls: list[bool] = []
        self.key_offs: list[int] = [0]
        self.keys: list[bytes] = []
        self.m_data: list[int] = []
        self.m_size: list[int] = []
        self.m_suffix: list[int] = []
        self.suffix_ids: dict[str, int] = {}
        self.first_seen: dict[bytes, int] = {}
        self.key: bytes | None = None
        self.in_sample: set[str] = set()
        self.skipping = False

    def add(self, header: int, data: int, size: int, key: bytes, suffix: str) -> None:
        if key != self.key:
            self.close()
            self.key = key
            if key in self.first_seen:
                self.skipping = True
                self.problem(
                    header,
                    f"key {shown(key)} appears again at byte offset {header}; its sample "
                    f"starts at byte offset {self.first_seen[key]}: the members of one sample "
                    "must be consecutive",
                )
                return
            self.skipping = False
            self.first_seen[key] = header
            self.starts.append(len(self.m_data))
            self.headers.append(header)
            self.labels.append(0)
            self.has_cls.append(False)
            self.keys.append(key)
            self.key_offs.append(self.key_offs[-1] + len(key))
            self.in_sample = set()
        if self.skipping:
            return
        if suffix in self.in_sample:
            self.problem(header, f"sample {shown(key)} has two '.{suffix}' members")
            return
        self.in_sample.add(suffix)
        if suffix == LABEL_SUFFIX:
            label = (
                parse_cls(bytes(self.view[data : data + size])) if size <= MAX_CLS_BYTES else None
            )
            if label is None:
                self.problem(header, f"sample {shown(key)}: its .cls is not a decimal integer")
            else:
                self.labels[-1], self.has_cls[-1] = label, True
        self.m_data.append(data)
        self.m_size.append(size)
        self.m_suffix.append(self.suffix_ids.setdefault(suffix, len(self.suffix_ids)))

    def close(self) -> None:
        """Check the sample just finished: exactly one image."""
        if self.key is None or self.skipping:
            return
        images = sorted(self.in_sample & IMAGE_SUFFIXES)
        if len(images) != 1:
            what = "no image member" if not images else f"{len(images)} images ({images})"
            self.problem(
                self.headers[-1],
                f"sample {shown(self.key)} has {what}; a sample has exactly one image "
                f"(one of {sorted(IMAGE_SUFFIXES)})",
            )

    def finish(self, tar_size: int, *, torn: bool = False) -> TarIndex:
        """The index; ``torn``: the walk broke off, so the last sample may lack members and
        is not judged (the break itself is the finding)."""
        if not torn:
            self.close()
        has = np.array(self.has_cls, dtype=bool)
        judged = has[:-1] if torn else has
        if judged.any() and not judged.all():
            j = int(np.flatnonzero(~judged)[0])
            self.problem(
                self.headers[j],
                f"sample {shown(self.keys[j])} has no .cls while others have one: a set is "
                "labelled throughout or not at all",
            )
        i8 = np.int64
        return TarIndex(
            tar_size,
            np.array([*self.starts, len(self.m_data)], dtype=i8),
            np.array(self.headers, dtype=i8),
            np.array(self.labels, dtype=i8),
            has,
            np.array(self.key_offs, dtype=i8),
            b"".join(self.keys),
            np.array(self.m_data, dtype=i8),
            np.array(self.m_size, dtype=i8),
            np.array(self.m_suffix, dtype=np.int32),
            list(self.suffix_ids),
        )


def build_index(view: memoryview, size: int, on_problem: OnProblem, state: Walk) -> TarIndex:
    """One pass over the headers of the tar in ``view``. Each finding goes to
    ``on_problem``; a header that cannot be trusted ends the walk after being reported."""
    b = _Builder(view, on_problem)
    try:
        for m in walk(view, size, state):
            if not m.regular:
                if m.type != DIRECTORY:
                    link = f" -> {shown(m.link)}" if m.link else ""
                    on_problem(
                        m.header,
                        f"{m.kind} member {shown(m.name)}{link}: stoker reads regular members "
                        "only (links, devices and FIFOs are refused)",
                    )
                continue
            why = name_problem(m.name)
            if why is not None:
                on_problem(m.header, why)
                continue
            split = split_name(m.name)
            if split is not None:
                b.add(m.header, m.data, m.size, *split)
    except TarError as e:
        on_problem(e.offset, e.reason)
        return b.finish(size, torn=True)
    if state.end is None:
        on_problem(
            size,
            "no end-of-archive marker (two zero blocks): the file ends right after a member, "
            "so it was probably cut short",
        )
    return b.finish(size)


def load_index(
    path: str,
    view: memoryview | None,
    size: int,
    *,
    cache: bool = True,
    identity: str | None = None,
) -> TarIndex | None:
    """The index of tar ``path`` (mapped as ``view``): from the cache when a sound entry
    exists, else built (its first problem a ``CorruptRecordError``: an index with problems is
    never cached) and cached when the cache directory is writable. ``identity``: what the
    bytes are filed under instead of the file's stat (:func:`~stoker._core.cache.cache_file`);
    ``view=None`` only looks in the cache (``None`` when the entry is not there)."""
    entry = cache_file("wds-index", path, ".stkwds", identity=identity) if cache else None
    if entry is not None and os.path.exists(entry):
        try:
            with open(entry, "rb") as f:
                # every member costs the tar at least a 512-byte header, and the entry
                # far less than that: a larger entry is not one of ours and is not read
                fits = os.fstat(f.fileno()).st_size <= 2 * size + (1 << 16)
                raw = f.read() if fits else b""
        except OSError:
            raw = b""
        found = parse_cache(raw, size)
        if found is not None:
            return found
    if view is None:
        return None
    index = build_index(view, size, refusing(path), Walk(path, size))
    if entry is not None:
        write_cache_file(entry, index.chunks())
    return index


def index_file(path: str, where: str) -> TarIndex:
    """The index of the tar at local ``path`` (what ``stoker index`` writes beside a tar it
    did not write); the first problem a reader would refuse is a ``CorruptRecordError``
    naming ``where`` (the tar's URL or path) and its byte offset."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CorruptRecordError(where, 0, "an empty file, not a tar")
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return build_index(view, size, refusing(where), Walk(where, size))
            finally:
                view.release()
