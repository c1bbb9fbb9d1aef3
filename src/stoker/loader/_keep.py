"""Worker pools kept by the process after their loader closed, for the next loader with the
same configuration (``Loader(keep_workers=SECONDS)``).

A kept pool is idle: its workers hold no batch ring (they unmapped it when parked) and no
open source (they closed theirs; it reopens on the next read), only their processes and
pipes. The next loader whose :func:`pool_key` is the same takes it and hands its workers its
own new ring (``WorkerPool.adopt``), so its first batch waits for no process start. A pool
nobody takes within its loader's ``keep_workers`` seconds is stopped by a timer thread, and
every kept pool is stopped at exit (``Loader``'s atexit hook) or by :func:`release_workers`;
workers also die with the process (``_worker._die_with_parent``), however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stoker.loader._shm import probing

if TYPE_CHECKING:
    from stoker.loader._pool import WorkerPool
    from stoker.loader.sources import Source
    from stoker.pipeline import Pipeline

__all__ = ["MAX_KEPT", "check_keep", "kept_count", "park", "pool_key", "release_workers", "take"]

#: Pools kept at once; parking one more stops the one parked longest ago.
MAX_KEPT = 4


@dataclass
class _Kept:
    pool: WorkerPool
    timer: threading.Timer


_kept: dict[bytes, _Kept] = {}
_lock = threading.Lock()
_owner = os.getpid()


def _after_fork_in_child() -> None:
    global _owner, _lock
    _owner = os.getpid()
    _kept.clear()  # a fork owns none of its parent's workers
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def pool_key(
    source: Source, pipeline: Pipeline, seed: int, on_error: str, workers: int
) -> bytes | None:
    """What fixes what a worker holds, as a digest: the source's pickled configuration (what
    a worker unpickles) and its fingerprint (the data it names), the pipeline, the seed,
    ``on_error`` and the worker count. ``None`` when that cannot be pickled here (the pool is
    then neither kept nor taken)."""
    try:
        with probing():  # shared memory pickles as its size: this pickle is only compared
            blob = pickle.dumps(
                (type(source), source, source.fingerprint(), pipeline, seed, on_error, workers),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
    except Exception:  # noqa: BLE001
        return None
    return hashlib.sha256(blob).digest()


def park(key: bytes, pool: WorkerPool, seconds: float) -> None:
    """Keep ``pool`` (already parked: idle, no ring) under ``key`` for ``seconds``; a pool
    already kept under that key, or the oldest beyond :data:`MAX_KEPT`, is stopped."""
    timer = threading.Timer(seconds, _expire, args=(key, pool))
    timer.daemon = True
    timer.name = "stoker-kept-workers"
    old: list[WorkerPool] = []
    with _lock:
        if os.getpid() != _owner:
            old.append(pool)
        else:
            prev = _kept.pop(key, None)
            if prev is not None:
                prev.timer.cancel()
                old.append(prev.pool)
            _kept[key] = _Kept(pool, timer)
            while len(_kept) > MAX_KEPT:
                first = next(iter(_kept))
                gone = _kept.pop(first)
                gone.timer.cancel()
                old.append(gone.pool)
            timer.start()
    for p in old:
        _stop(p)


def take(key: bytes) -> WorkerPool | None:
    """The pool kept under ``key`` (no longer kept), if every one of its workers is alive;
    a kept pool that lost a worker is stopped and ``None`` returned."""
    with _lock:
        if os.getpid() != _owner:
            return None
        got = _kept.pop(key, None)
        if got is None:
            return None
        got.timer.cancel()
    if all(w.proc.is_alive() for w in got.pool.handles):
        return got.pool
    _stop(got.pool)
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
        pools = [k.pool for k in _kept.values()]
        for k in _kept.values():
            k.timer.cancel()
        _kept.clear()
    for p in pools:
        _stop(p)


def _expire(key: bytes, pool: WorkerPool) -> None:
    with _lock:
        got = _kept.get(key)
        if got is None or got.pool is not pool:
            return  # taken, or replaced, in the meantime
        del _kept[key]
    _stop(pool)


def _stop(pool: WorkerPool) -> None:
    with contextlib.suppress(Exception):
        pool.stop()


def check_keep(value: object) -> float:
    """``keep_workers``: seconds >= 0 (0: stop the workers at ``close()``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"keep_workers must be a number of seconds, got {value!r}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"keep_workers must be >= 0 seconds (finite), got {value}")
    return float(value)
