"""The shard layer: what every format made of shards shares, kept once.

A set is a sequence of shards; a shard is a :class:`ShardEntry` (its files by role, its record
count, bytes and checksum). A :class:`ShardSet` over the entries owns:

- the positions: ``len``, each shard's first position (``starts``), :meth:`ShardSet.locate`
  (a global position -> ``(shard, position inside it)``) and :meth:`ShardSet.shard_of` for a
  batch of positions; ``shard_sizes()`` (records per shard, what ``shuffle="shards"`` deals);
- the one LRU of open shards (:class:`OpenShards`, at most :data:`MAX_OPEN_SHARDS` per set and
  process): a reader marks the shard it reads (``use``) and closes what it hands back, so a set
  of 100,000 shards read by 8 workers stays within ``ulimit -n`` and ``vm.max_map_count``;
- :func:`digest`: the sha256 a reader's fingerprint is made of.

A format gives the rest: how one shard's files are opened (its ``FORMAT.open_shard``) and read.
A set in object storage is opened by :class:`~stoker.formats.shardfiles.RemoteShards` (sizes
checked and fitted to the shard cache, shards read ahead), which hands out local paths or
pinned cached copies: a reader never opens a URL.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import ManifestError
from stoker._core.files import inside

__all__ = ["MAX_OPEN_SHARDS", "OpenShards", "ShardEntry", "ShardSet", "digest"]

#: Shards a set keeps open at once per process; the least recently used one is closed when
#: another must open (an open shard holds a file descriptor and a memory map or two).
MAX_OPEN_SHARDS = 64


@dataclass(frozen=True)
class ShardEntry:
    """One shard as a manifest lists it: ``files`` by role (``{"data": "x-00000.rec",
    "index": ...}``, names relative to the manifest), ``records``, ``bytes`` (of its data
    file, ``None`` where unknown) and ``checksums`` by name (``{"index.sha256": "<hex>",
    "data.crc32c": 1234}``: ``ROLE.ALGORITHM``, where recorded)."""

    records: int
    files: Mapping[str, str] = field(default_factory=dict)
    bytes: int | None = None
    checksums: Mapping[str, str | int] = field(default_factory=dict)

    def path(self, role: str, folder: str) -> str | None:
        """The file of ``role`` resolved against ``folder`` (the manifest's), or ``None``
        when the entry names none; ``ManifestError`` when a symlink takes it out of
        ``folder``: a set's files stay in its folder (``docs/pack.md``, as pack's
        ``outside_root``)."""
        name = self.files.get(role)
        if name is None:
            return None
        out = os.path.join(folder, name)
        if not inside(real := os.path.realpath(out), os.path.realpath(folder)):
            raise ManifestError(
                f"{out}: a symlink to {real}, outside the set's folder {folder}; a set's files "
                "stay in its folder: copy the file there in place of the link"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """The entry as the manifest writes it."""
        out: dict[str, Any] = {"files": dict(self.files), "records": int(self.records)}
        if self.bytes is not None:
            out["bytes"] = int(self.bytes)
        out["checksums"] = dict(self.checksums)
        return out


class OpenShards:
    """The open shards of one set in one process, least recently used first. :meth:`use`
    marks shard ``j`` used and returns the shards to close to stay within ``limit`` (never
    ``j``); the caller closes them: it knows how."""

    def __init__(self, limit: int = MAX_OPEN_SHARDS) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1 open shard, got {limit}")
        self.limit = limit
        self._open: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, j: object) -> bool:
        return j in self._open

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._open))

    def get(self, j: int) -> None:
        """Mark open shard ``j`` used (nothing when it is not open)."""
        if j in self._open:
            self._open.move_to_end(j)

    def use(self, j: int) -> list[int]:
        """Mark shard ``j`` used; the shards beyond the limit, least recently used first, are
        forgotten and returned for the caller to close."""
        self._open[j] = None
        self._open.move_to_end(j)
        return self.over(self.limit)

    def over(self, limit: int) -> list[int]:
        """Forget and return the least recently used shards beyond ``limit``."""
        out = []
        while len(self._open) > max(limit, 0):
            out.append(self._open.popitem(last=False)[0])
        return out

    def oldest(self) -> int:
        return next(iter(self._open))

    def pop(self, j: int) -> None:
        self._open.pop(j, None)

    def clear(self) -> list[int]:
        """Forget every shard; returns them for the caller to close."""
        return self.over(0)


class ShardSet:
    """The positions and sizes of a set's shards (see the module docstring): ``entries`` in
    position order, or plain record ``counts``."""

    def __init__(self, entries: Sequence[ShardEntry] | Sequence[int] | np.ndarray) -> None:
        items = list(entries)
        self.entries: list[ShardEntry] = [
            e if isinstance(e, ShardEntry) else ShardEntry(int(e)) for e in items
        ]
        counts = np.asarray([e.records for e in self.entries], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.starts.setflags(write=False)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shards(self) -> int:
        return len(self.entries)

    def shard_sizes(self) -> np.ndarray:
        """int64 records per shard, in position order."""
        return np.diff(self.starts)

    def locate(self, i: int, what: str = "") -> tuple[int, int]:
        """``(shard, position inside it)`` of global position ``i`` (negative counts from the
        end); ``IndexError`` naming ``what`` (the set) when out of range."""
        n = int(self.starts[-1])
        if not -n <= i < n:
            where = f" of {what}" if what else ""
            raise IndexError(f"position {i} out of range for {n} records{where}")
        i = i + n if i < 0 else i
        j = int(np.searchsorted(self.starts, i, side="right")) - 1
        return j, i - int(self.starts[j])

    def shard_of(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """The shard of each of ``positions`` (in range, non-negative)."""
        pos = np.asarray(positions, dtype=np.int64)
        return np.searchsorted(self.starts, pos, side="right") - 1

    def shards_read(self, positions: np.ndarray | Sequence[int] | None) -> set[int]:
        """The shards that ``positions`` read from."""
        if positions is None:
            return set()
        return set(self.shard_of(np.asarray(positions, dtype=np.int64).reshape(-1)).tolist())


def digest(parts: Iterable[Any]) -> str:
    """The sha256 (hex) of ``parts`` (bytes, or arrays as their bytes), in order."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes | memoryview) else np.ascontiguousarray(p).tobytes())
    return h.hexdigest()
