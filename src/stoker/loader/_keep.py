"""Worker pools kept by the process after their loader closed, for the next loader with the
same configuration (``Loader(keep_workers=SECONDS)``).

A kept pool is idle: its workers hold no open source (they closed theirs; it reopens on the
next read), only their processes, pipes and the batch ring they map, kept with them. The next
loader whose :func:`pool_key` is the same takes it, so its first batch waits for no process
start. It takes the ring too when the ring has its byte layout and no batch view of the
loader that closed is alive (its pages are mapped already: nothing to reserve or fault in);
otherwise the kept ring is closed and the workers get the new loader's over their pipes
(``WorkerPool.adopt``). A pool
nobody takes within its loader's ``keep_workers`` seconds is stopped by a timer thread, and
every kept pool is stopped at exit (``Loader``'s atexit hook) or by :func:`release_workers`;
workers also die with the process (``_worker._die_with_parent``), however it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stoker._core.oscompat import at_fork_child
from stoker.loader._shm import Mapping, SharedFd, probing, process_start_time

if TYPE_CHECKING:
    from stoker.loader._pool import WorkerPool
    from stoker.loader._ring import RingLayout
    from stoker.loader.sources import Source
    from stoker.pipeline import Pipeline

__all__ = [
    "MAX_KEPT",
    "Kept",
    "check_keep",
    "kept_count",
    "park",
    "pool_key",
    "release_workers",
    "take",
]

#: Pools kept at once; parking one more stops the one parked longest ago.
MAX_KEPT = 4


@dataclass
class Kept:
    """A kept pool and the batch ring its workers still map (``None``: none kept)."""

    pool: WorkerPool
    timer: threading.Timer
    ring: SharedFd | Any = None  # the engine's ring (a SharedFd, or a NamedRing)
    mapping: Mapping | None = None
    layout: RingLayout | None = None
    unreserved: frozenset[int] = frozenset()

    def ring_fits(self, layout: RingLayout) -> bool:
        """Whether the kept ring serves ``layout`` as it is: the same byte layout (the
        pipeline and fields are the same under the same key), and nothing but this object
        refers to its mapping: no batch view of the loader that closed is alive."""
        old = self.layout
        if old is None or not isinstance(self.mapping, Mapping):
            # (a Windows mapping: its views refer to the mmap, not to it, so a live view
            # cannot be told from none; the workers get a new ring)
            return False
        same = dataclasses.replace(old, pipeline=layout.pipeline, fields=layout.fields) == layout
        # references: this attribute and getrefcount's argument; a view adds its array
        return same and sys.getrefcount(self.mapping) <= 2

    def drop_ring(self) -> None:
        """Close the kept ring here (its memory goes with the workers' mappings)."""
        ring, self.ring, self.mapping, self.layout = self.ring, None, None, None
        if ring is not None:
            ring.close()


_kept: dict[bytes, Kept] = {}
_lock = threading.Lock()
_owner = os.getpid()


def _after_fork_in_child() -> None:
    global _owner, _lock
    _owner = os.getpid()
    _kept.clear()  # a fork owns none of its parent's workers
    _lock = threading.Lock()


at_fork_child(_after_fork_in_child)


def pool_key(
    source: Source, pipeline: Pipeline, on_error: str, workers: int, engine: str = "linux"
) -> bytes | None:
    """What fixes what a worker holds, as a digest: the source's pickled configuration (what
    a worker unpickles) and its fingerprint (the data it names), the pipeline, ``on_error``,
    the worker count (the seed travels with each task) and the engine (how the workers
    started and map their ring). ``None`` when that cannot be pickled here (the pool is then
    neither kept nor taken)."""
    try:
        with probing():  # shared memory pickles as its size: this pickle is only compared
            blob = pickle.dumps(
                (type(source), source, source.fingerprint(), pipeline, on_error, workers, engine),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
    except Exception:  # noqa: BLE001
        return None
    return hashlib.sha256(blob).digest()


def park(
    key: bytes,
    pool: WorkerPool,
    seconds: float,
    ring: tuple[SharedFd | Any, Mapping, RingLayout, frozenset[int]] | None = None,
) -> None:
    """Keep ``pool`` (already parked: idle, its source closed) and the ``ring`` its workers
    map (its descriptor, main's mapping, layout and slots not yet reserved) under ``key``
    for ``seconds``; a pool already kept under that key, or the oldest beyond
    :data:`MAX_KEPT`, is stopped."""
    timer = threading.Timer(seconds, _expire, args=(key, pool))
    timer.daemon = True
    timer.name = "stoker-kept-workers"
    kept = Kept(pool, timer)
    if ring is not None:
        kept.ring, kept.mapping, kept.layout, kept.unreserved = ring
    old: list[Kept] = []
    with _lock:
        if os.getpid() != _owner:
            old.append(kept)
        else:
            prev = _kept.pop(key, None)
            if prev is not None:
                prev.timer.cancel()
                old.append(prev)
            _kept[key] = kept
            while len(_kept) > MAX_KEPT:
                gone = _kept.pop(next(iter(_kept)))
                gone.timer.cancel()
                old.append(gone)
            timer.start()
    for k in old:
        _stop(k)


def take(key: bytes) -> Kept | None:
    """The pool kept under ``key`` with its ring (no longer kept), if every one of its
    workers is alive; a kept pool that lost a worker is stopped and ``None`` returned."""
    with _lock:
        if os.getpid() != _owner:
            return None
        got = _kept.pop(key, None)
        if got is None:
            return None
        got.timer.cancel()
    if all(_alive(w.proc) for w in got.pool.handles):
        return got
    _stop(got)
    return None


def kept_count() -> int:
    """How many pools this process keeps now."""
    with _lock:
        return len(_kept) if os.getpid() == _owner else 0


def release_workers() -> None:
    """Stop every worker pool this process keeps for later loaders (``keep_workers``) now.
    Loaders in use are not touched. Called at exit too."""
    with _lock:
        if os.getpid() != _owner:
            return
        kept = list(_kept.values())
        for k in kept:
            k.timer.cancel()
        _kept.clear()
    for k in kept:
        _stop(k)


def _alive(proc: Any) -> bool:
    """Alive and not a zombie (a worker's parent, the fork server, reaps it a moment later)."""
    return bool(proc.is_alive()) and process_start_time(proc.pid) is not None


def _expire(key: bytes, pool: WorkerPool) -> None:
    with _lock:
        got = _kept.get(key)
        if got is None or got.pool is not pool:
            return  # taken, or replaced, in the meantime
        del _kept[key]
    _stop(got)


def _stop(kept: Kept) -> None:
    """Stop the workers, then close the ring (the memory goes with the last mapping)."""
    with contextlib.suppress(Exception):
        kept.pool.stop()
    kept.drop_ring()


def check_keep(value: object) -> float:
    """``keep_workers``: seconds >= 0 (0: stop the workers at ``close()``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"keep_workers must be a number of seconds, got {value!r}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"keep_workers must be >= 0 seconds (finite), got {value}")
    return float(value)
