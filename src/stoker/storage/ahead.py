"""Downloads ahead of the reader: one daemon thread keeps the next ``ahead`` shards of a
planned order downloaded into a :class:`~stoker.storage.cache.ShardCache` and pinned, so that
in steady state decoding never waits on the network.

NOTE: the protocol

State lives under one condition variable: the plan (``items``), the first item still needed
(``pos``), the pins the thread holds (key -> :class:`~stoker.storage.cache.Pin`, only for keys
in ``items[pos : pos + ahead]``, so never more than ``ahead``), the keys whose fetch failed,
the errors, and ``closed``. The caller's methods (:meth:`AheadFetcher.plan`,
:meth:`AheadFetcher.reached`) hold the lock only to update that state, release the pins that
fell out of the window (one ``close(2)`` each, which never waits; done under the lock, so the
thread never starts a download while an unwanted pin is still held) and wake the thread: they
never wait on a download.

Each of ``threads`` threads takes the first item of the window that is neither pinned, failed
nor being downloaded by another thread and calls ``cache.try_get`` outside the lock, so up to
``threads`` downloads run at once, started in plan order (an object store serves several
connections faster than one, and each request's latency overlaps the others'). When it
returns, the window may have moved on: a pin nobody wants any more is released at once. A
``None`` (every candidate for eviction is pinned) makes the thread wait for the next
``reached``/``plan`` or 0.1 s, then try again. A fetch that raises is kept in
:attr:`AheadFetcher.errors` and its key is not tried again until the next ``plan``; the
reader's own ``get`` of that shard raises it in the reader.

:meth:`AheadFetcher.close` marks it closed, wakes the thread and joins it (a download
already running finishes first, bounded by the fetch's own timeouts; a ``try_get`` without
room returns at once), then releases every pin, so the room they free starts no download.
Then it raises the first error a background fetch raised, if any.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from stoker.storage.cache import Pin, ShardCache

__all__ = ["AheadFetcher", "Item"]

_RETRY_NO_ROOM = 0.1  # seconds between tries while the cache has no unpinned room


@dataclass(frozen=True)
class Item:
    """One shard of the plan: what :meth:`ShardCache.get` needs to download and check it."""

    key: str
    size: int
    crc32c: int | None
    name: str
    fetch: Callable[[BinaryIO], None]
    sha256: str | None = None

    def get(self, cache: ShardCache) -> Pin:
        """A pinned, checked copy of this shard in ``cache``, downloaded when missing
        (:meth:`ShardCache.get`: waits for room)."""
        return cache.get(self.key, **self._checks())

    def try_get(self, cache: ShardCache) -> Pin | None:
        """As :meth:`get`, or ``None`` when the room is pinned (:meth:`ShardCache.try_get`)."""
        return cache.try_get(self.key, **self._checks())

    def _checks(self) -> dict[str, Any]:
        """What the cache checks a download against, and how it downloads."""
        return {k: getattr(self, k) for k in ("size", "crc32c", "fetch", "name", "sha256")}


class AheadFetcher:
    """Keeps ``items[i : i + ahead]`` of the plan downloaded and pinned after ``reached(i)``;
    see the module's NOTE. A context manager (``close`` on exit)."""

    def __init__(self, cache: ShardCache, *, ahead: int = 2, threads: int = 1) -> None:
        if type(ahead) is not int or ahead < 0:
            raise ValueError(f"ahead must be an int >= 0 (shards to download ahead), got {ahead!r}")
        if type(threads) is not int or threads < 1:
            raise ValueError(f"threads must be an int >= 1 (downloads at once), got {threads!r}")
        self._cache = cache
        self._ahead = ahead
        self._threads_wanted = threads
        self._busy: set[str] = set()  # keys a thread is downloading
        self._cond = threading.Condition()
        self._items: tuple[Item, ...] = ()
        self._pos = 0
        self._pins: dict[str, Pin] = {}
        self._failed: set[str] = set()
        self._errors: list[BaseException] = []
        self._closed = False
        self._raised = False
        self._threads: list[threading.Thread] = []

    def plan(self, items: Sequence[Item]) -> None:
        """The order shards will be read in; replaces the plan before and starts at item 0."""
        items = tuple(items)
        for item in items:
            if not isinstance(item, Item):
                raise TypeError(f"plan() takes a sequence of Item, got {type(item).__name__}")
        with self._cond:
            if self._closed:
                raise RuntimeError("AheadFetcher.plan() after close()")
            self._items, self._pos = items, 0
            self._failed.clear()
            self._trim()
            if not self._threads and self._ahead > 0:
                for k in range(min(self._threads_wanted, self._ahead)):
                    t = threading.Thread(target=self._run, name=f"stoker-ahead-{k}", daemon=True)
                    t.start()
                    self._threads.append(t)
            self._cond.notify_all()

    def reached(self, i: int) -> None:
        """Items before ``i`` are done with: their pins go, and the thread keeps
        ``items[i : i + ahead]`` downloaded and pinned. Never waits on a download."""
        if type(i) is not int or i < 0:
            raise ValueError(f"reached() takes an item index >= 0, got {i!r}")
        with self._cond:
            self._pos = i
            self._trim()
            self._cond.notify_all()

    @property
    def errors(self) -> list[BaseException]:
        """What background fetches raised, oldest first."""
        with self._cond:
            return list(self._errors)

    def close(self) -> None:
        """Stop the thread (after the download in progress, if any), release every pin, and
        raise the first error a background fetch raised."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:  # first, so that the room the pins free starts nothing
            t.join()
        with self._cond:
            for pin in self._pins.values():
                pin.close()
            self._pins.clear()
            first = self._errors[0] if self._errors and not self._raised else None
            self._raised = True
        if first is not None:
            raise first

    def __enter__(self) -> AheadFetcher:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the exception on its way out, not a fetch error
            self.close()

    # -- the thread -------------------------------------------------------------------------

    def _window(self) -> tuple[Item, ...]:
        return self._items[self._pos : self._pos + self._ahead]

    def _wanted(self) -> set[str]:
        return {item.key for item in self._window()}

    def _trim(self) -> None:
        """Release the pins of keys outside the window (under the lock, so that the thread
        starts no download while a pin it no longer wants is still held)."""
        wanted = self._wanted()
        for key in [key for key in self._pins if key not in wanted]:
            self._pins.pop(key).close()

    def _next(self) -> Item | None:
        for item in self._window():
            key = item.key
            if key not in self._pins and key not in self._failed and key not in self._busy:
                return item
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                item = self._next()
                while not self._closed and item is None:
                    self._cond.wait()
                    item = self._next()
                if self._closed or item is None:
                    return
                self._busy.add(item.key)
            pin: Pin | None = None
            error: BaseException | None = None
            try:
                pin = item.try_get(self._cache)
            except Exception as exc:  # kept for close(); the reader's own get raises it too
                error = exc
            with self._cond:
                self._busy.discard(item.key)
                if error is not None:
                    self._errors.append(error)
                    self._failed.add(item.key)
                elif pin is None:
                    self._cond.wait(_RETRY_NO_ROOM)  # woken early by reached()/plan()/close()
                elif not self._closed and item.key in self._wanted() and item.key not in self._pins:
                    self._pins[item.key] = pin
                else:  # the reader moved past it meanwhile
                    pin.close()
