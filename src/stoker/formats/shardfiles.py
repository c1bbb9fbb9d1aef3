"""The shards of a set in object storage as pinned local files, for every format's
:class:`~stoker.formats.sharded.ShardedReader` (its shards are whole files).

:class:`RemoteShards` is the opener of the shard layer (``docs/remote.md``): a reader asks it
for shard ``j`` (:meth:`RemoteShards.hold`) and gets the local paths of that shard's files,
each downloaded whole into the node's :class:`~stoker.storage.ShardCache` once per node,
checked against the manifest's size (and CRC32C where the manifest records one) and pinned
until the reader lets go (:meth:`RemoteShards.release`). What it keeps open:

- a reader makes room before it opens another shard (it closes its least recently used one),
  so it never waits for room that its own pins hold; at most ``max_open`` shards stay held:
  every shard when the cache's budget holds the whole set, else what a loader's claim
  allows (:meth:`claim`), else ``prefetch_shards + 2`` (4 at most);
- a process that holds shards outside a loader's plan claims room for them itself and gives
  the claim back once it holds none;
- :meth:`focus` lets go of the shards a chunk of a batch does not read;
- :meth:`read_ahead` downloads the shards of a reading order ahead of the reader
  (:class:`~stoker.storage.AheadFetcher`).

The reader unmaps a shard before its pins go: ``on_release(j)`` is called when this object
decides to let go of shard ``j`` (room, focus, a claim's cap). Picklable as the set's files,
entries and claimed cap; pins and claims are per process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.errors import ManifestError
from stoker.formats.remote import (
    BY_POSITION,
    ReadPlan,
    RemoteFiles,
    check_room_for,
    claim_plan,
    claim_shards,
    fits_all,
    redact,
    with_marks,
)
from stoker.formats.shards import OpenShards, ShardSet

if TYPE_CHECKING:
    from stoker.storage.cache import Pin

__all__ = [
    "MAX_OPEN_REMOTE_SHARDS",
    "RemoteSet",
    "ReadsRemoteShards",
    "RemoteShards",
    "ShardFile",
    "ShardsAhead",
]

#: What a changed shard of a collection ``stoker index`` indexed asks of the user.
REINDEX = ": the collection changed since it was indexed; run `stoker index` again"
#: Shards a reader outside a loader keeps held at most (each pins its cached copy).
MAX_OPEN_REMOTE_SHARDS = 4


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard as its manifest entry gives it: ``name`` (relative to the
    manifest), ``field`` (where the manifest says so, for messages), ``size`` in bytes and
    the CRC32C or sha256 (hex) of the whole file when the manifest records one: a download
    is checked against them before it is read."""

    name: str
    field: str
    size: int
    crc32c: int | None = None
    sha256: str | None = None


class RemoteShards:
    """The shards of one remote set; see the module docstring. ``shards[j]``: the files of
    shard ``j``; ``cap``: the most shards the reader keeps open at all (its own limit)."""

    def __init__(
        self,
        files: RemoteFiles,
        shards: Sequence[Sequence[ShardFile]],
        *,
        cap: int,
        max_open: int | None = None,
        whole: bool | None = None,
        marks: int | None = None,
    ) -> None:
        self.files = files
        self.entries = [tuple(s) for s in shards]
        self.cap = cap
        self.marks = marks  # files per shard the cache reserves markers for (default: most)
        self._planned_open = max_open  # what a loader's claim on the cache allows
        self._planned_whole = whole  # whether that claim is the whole set
        self._setup()

    def _setup(self) -> None:
        self.on_release: Callable[[int], None] | None = None
        self._pins: dict[int, list[Pin]] = {}
        self._held = OpenShards(max(self.cap, 1))
        self._claim: Any = None
        self._keep = False  # holding a shard: a release meanwhile keeps the claim
        per = self.marks or max((len(s) for s in self.entries), default=1)
        self.sizes = with_marks([sum(f.size for f in s) for s in self.entries], per)
        planned = self._planned_whole
        self.whole = fits_all(self.files, self.sizes) if planned is None else planned
        if self.whole:  # every shard may stay held: nothing ever needs evicting
            self.max_open = self.cap
        elif self._planned_open is not None:
            self.max_open = self._planned_open
        else:  # no more pins than the room check() asked the cache for; a loader's process
            # reads one shard at a time while it opens the set (its claim is no larger than
            # the one the loader makes for the run)
            ahead = self.files.options.prefetch_shards
            spare = 1 if self.files.options.loader else 2
            self.max_open = min(MAX_OPEN_REMOTE_SHARDS, ahead + spare, self.cap)

    def __getstate__(self) -> dict:
        return {
            "files": self.files,
            "entries": self.entries,
            "cap": self.cap,
            "marks": self.marks,
            "max_open": self._planned_open,
            "whole": self._planned_whole,
        }

    def __setstate__(self, state: dict) -> None:
        self.files, self.entries, self.cap = state["files"], state["entries"], state["cap"]
        self.marks = state.get("marks")
        self._planned_open, self._planned_whole = state["max_open"], state["whole"]
        self._setup()

    def __len__(self) -> int:
        return len(self.entries)

    # -- at open -----------------------------------------------------------------------------
    def url(self, j: int, k: int = 0) -> str:
        f = self.entries[j][k]
        return self.files.url_of(f.name, f.field)

    def check(self) -> None:
        """What can be checked of every shard before any is read: each file exists (one
        listing per folder, or a HEAD each) with the manifest's size, and the cache can hold
        what reading needs at once (:class:`CacheFullError` otherwise)."""
        files = self.files
        urls = [files.url_of(f.name, f.field) for s in self.entries for f in s]
        listed = files.sizes
        if any(u not in listed for u in urls):  # not yet listed by this opening
            listed = files.list_sizes(urls)
        for s in self.entries:
            for f in s:
                url = files.url_of(f.name, f.field)
                if listed[url] != f.size:
                    indexed = any(g.field.endswith(".index") for g in s)
                    raise ManifestError(
                        f"{redact(files.url)}: {redact(url)} is {listed[url]} bytes but the "
                        f"manifest records {f.size} ({f.field}); the shard was replaced or "
                        f"truncated{REINDEX if indexed else ''}"
                    )
        check_room_for(files, [sum(f.size for f in s) for s in self.entries], self.sizes)

    def location(self, j: int, k: int = 0) -> str:
        """Where file ``k`` of shard ``j`` lives, for messages: its URL (without credentials)."""
        return redact(self.url(j, k))

    def identity(self, j: int) -> str:
        """What shard ``j``'s bytes are filed under in the cache (its files' URLs, sizes and
        CRCs): a format keys what it derives from them (an index) by it."""
        return "\0".join(
            self.files.key(self.url(j, k), crc32c=f.crc32c, sha256=f.sha256)
            for k, f in enumerate(self.entries[j])
        )

    # -- holding shards ----------------------------------------------------------------------
    def hold(self, j: int) -> list[str]:
        """The local paths of shard ``j``'s files, downloaded (once per node) and pinned until
        :meth:`release`; room is made first by letting go of the least recently held."""
        if j in self._held:
            self._held.get(j)  # used now
            return [p.path for p in self._pins[j]]
        self._keep = True
        pins: list[Pin] = []
        try:
            while len(self._held) >= self.max_open:
                self._drop(self._held.oldest())
            if self._claim is None and self._planned_open is None:
                self._claim = self._own_claim()
            for k, f in enumerate(self.entries[j]):
                what = f"shard {j} ({f.name})"
                url = self.url(j, k)
                pins.append(self.files.fetch(url, crc32c=f.crc32c, what=what, sha256=f.sha256))
        except BaseException:
            for p in pins:
                p.close()
            self._keep = False
            self._maybe_unclaim()
            raise
        self._keep = False
        self._pins[j] = pins
        self._held.use(j)
        return [p.path for p in pins]

    def release(self, j: int) -> None:
        """Let go of shard ``j`` (its pins close); the reader has unmapped it."""
        self._held.pop(j)
        for p in self._pins.pop(j, ()):
            p.close()
        self._maybe_unclaim()

    def _drop(self, j: int) -> None:
        """Let go of shard ``j`` at this object's own decision: the reader unmaps it first."""
        try:
            if self.on_release is not None:
                self.on_release(j)
        finally:
            self.release(j)

    def focus(self, shards: set[int]) -> None:
        """Let go of the held shards not in ``shards`` (what a chunk of a batch reads), so the
        cache can evict them; when the cache holds the whole set, keep them all."""
        if self.whole and shards:
            return
        for j in [j for j in self._held if j not in shards]:
            self._drop(j)

    def held(self) -> list[int]:
        return list(self._held)

    # -- claims ------------------------------------------------------------------------------
    def claim(self, plan: ReadPlan) -> Any:
        """Claim the room a loader's ``plan`` needs (:func:`~stoker.formats.remote.
        claim_plan`; :class:`CacheFullError` when it cannot be had) and hold at most as many
        shards as it allows; the processes that read for the loader (its workers) then claim
        nothing of their own. Release the claim with its ``close()``."""
        self._release_claim()  # the loader's claim covers what this process reads
        claim, pinned, self.whole = claim_plan(self.files, self.sizes, plan, self.whole)
        self.max_open = self.cap if self.whole else min(self.cap, pinned)
        self._planned_open, self._planned_whole = self.max_open, self.whole
        while len(self._held) > self.max_open:
            self._drop(self._held.oldest())
        return claim

    def _own_claim(self) -> Any:
        """The claim of a process that holds shards outside a loader's plan: room for the
        shards it keeps held (nothing is downloaded ahead of it). A loader's process opening
        the set reads shards its run reads: a shared claim of the run's group."""
        ahead = self.files.options.prefetch_shards
        span = None if self.whole else max(self.max_open - ahead, 1)
        opening = self.files.options.loader
        plan = ReadPlan(span, opening, BY_POSITION, f"process {os.getpid()}")
        return claim_shards(self.files, self.sizes, plan)[0]

    def _maybe_unclaim(self) -> None:
        if not (self._held or self._keep or self._planned_open is not None):
            self._release_claim()

    def _release_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.close()

    def read_ahead(self, order: np.ndarray, starts: np.ndarray, start: int) -> ShardsAhead | None:
        """Downloads ahead of ``order`` (global positions in reading order; ``starts``: each
        shard's first position, then the total) from position ``start``; ``None`` without
        ``prefetch_shards``."""
        ahead = self.files.options.prefetch_shards
        if ahead == 0 or len(order) == 0:
            return None
        per = max((len(s) for s in self.entries), default=1)
        order = np.asarray(order, dtype=np.int64)
        return ShardsAhead(
            self.files.cache, self._items, order, starts, start, ahead=ahead, per=per
        )

    def _items(self, j: int) -> list[Any]:
        """The downloads of shard ``j``'s files."""
        out = []
        for k, f in enumerate(self.entries[j]):
            what = f"shard {j} ({f.name})"
            out.append(self.files.item(self.url(j, k), crc32c=f.crc32c, what=what, sha256=f.sha256))
        return out

    def close(self) -> None:
        self._release_claim()
        while self._held:
            self._drop(self._held.oldest())


class ShardsAhead:
    """The shards a reading order needs, downloaded ``ahead`` shards ahead of the reader in
    the order their first record is read (:class:`~stoker.storage.AheadFetcher` in this
    process); ``reached(p)`` says the records before position ``p`` of the order are handed
    out. ``items_of(j)``: the downloads of shard ``j`` (its files' ``Item``); ``starts``: each
    shard's first position, then the total; ``per``: the most files a shard has."""

    def __init__(
        self,
        cache: Any,
        items_of: Callable[[int], list[Any]],
        order: np.ndarray,
        starts: np.ndarray,
        start: int,
        *,
        ahead: int,
        per: int,
    ) -> None:
        from stoker.storage.ahead import AheadFetcher

        shard = np.searchsorted(starts, order, side="right") - 1
        seq, first = np.unique(shard, return_index=True)
        seq = seq[np.argsort(first)]  # shards by their first read
        rank = np.zeros(len(starts) - 1, dtype=np.int64)
        rank[seq] = np.arange(len(seq))
        self._rank = np.maximum.accumulate(rank[shard])  # the latest shard begun at each position
        items: list[Any] = []
        begins = []
        for j in seq.tolist():
            begins.append(len(items))
            items.extend(items_of(j))
        self._begins = np.asarray([*begins, len(items)], dtype=np.int64)
        # as many downloads at once as files ahead: the requests' latencies overlap
        self._fetcher = AheadFetcher(cache, ahead=per * ahead, threads=per * ahead)
        self._fetcher.plan(items)
        self.reached(start)

    def reached(self, p: int) -> None:
        """The records before position ``p`` are handed out: the shards they begin are the
        readers' to hold, and the downloads ahead are the next ``ahead`` shards not begun yet."""
        begun = 0 if p <= 0 else int(self._rank[min(p, len(self._rank)) - 1]) + 1
        self._fetcher.reached(int(self._begins[begun]))

    def close(self) -> None:
        """Stop the downloads; a background download's error is not raised here (the reader
        that needs that shard downloads it itself and raises what it meets)."""
        with contextlib.suppress(Exception):
            self._fetcher.close()


class RemoteSet:
    """What the loader asks of a set read through the node's shard cache (the reader's
    ``remote()``): ``claim(plan)`` the room its order needs (:meth:`RemoteShards.claim`;
    ``CacheFullError`` when it cannot be had), ``read_ahead(order, start)`` (downloads ahead
    of the reading order, ``None`` without ``prefetch_shards``), ``probe_positions(n)`` (the
    first ``n``: its first shard, which the loader reads anyway, not a spread that fetches a
    shard per probe), ``let_go()`` (this process keeps none of its shards held) and ``shards``
    (the :class:`RemoteShards`: each shard's files, URLs and sizes)."""

    def __init__(self, shards: RemoteShards, positions: ShardSet) -> None:
        self.shards, self._set = shards, positions

    def claim(self, plan: ReadPlan) -> Any:
        return self.shards.claim(plan)

    def read_ahead(self, order: np.ndarray, start: int = 0) -> ShardsAhead | None:
        return self.shards.read_ahead(order, self._set.starts, start)

    def probe_positions(self, probes: int) -> list[int]:
        return list(range(min(probes, len(self._set))))

    def let_go(self) -> None:
        self.shards.focus(set())


class ReadsRemoteShards:
    """A reader over :class:`RemoteShards` (every format's set made of shards): ``remote()``,
    ``_let_go()`` and ``_focus`` for each chunk it reads. A reader sets ``_remote`` (``None``
    for a local set) and gives its shards' positions (``_shard_set``, opened). It pickles as
    the arguments that open it (``_config``) and what opening a set in object storage learnt
    (``_remote``: the sizes, the manifest's copy, the room a loader claimed), so that no
    worker lists or checks the set again; unpickling hands both to ``_reopen``."""

    _config: dict[str, Any]
    _remote: RemoteShards | None

    def __getstate__(self) -> dict:
        return {"config": self._config, "opened": self._remote}

    def __setstate__(self, state: dict) -> None:
        self._reopen(dict(state["config"]), state["opened"])

    def _reopen(self, config: dict[str, Any], opened: RemoteShards | None) -> None:
        raise NotImplementedError

    def _shard_set(self) -> ShardSet:
        raise NotImplementedError

    def remote(self) -> RemoteSet | None:
        """A set in object storage: what the loader asks of it (:class:`RemoteSet`); ``None``
        for a local set."""
        positions = self._shard_set()  # opened
        return None if self._remote is None else RemoteSet(self._remote, positions)

    def _let_go(self) -> None:
        """This process reads no more for now: a remote set keeps none of its shards held."""
        if self._remote is not None:
            self._remote.focus(set())

    def _focus(self, indices: np.ndarray | None) -> None:
        """A remote set about to read ``indices`` (a chunk of a batch) lets go of the other
        shards it holds, so that their cached copies can make room."""
        if self._remote is None or indices is None:
            return
        self._remote.focus(self._shard_set().shards_read(indices))
