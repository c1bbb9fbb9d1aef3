"""Timestamps of a loader's start-up, for ``bench_startup.py``: where the time between
``Loader(...)`` and its first batch goes.

``install_main()`` wraps, in the measured process, the steps the main process takes; this
module, imported by the worker server as the last module it preloads (the bench adds it to
the preload), wraps the steps a worker takes and notes when the server finished preloading.
Every step appends ``name pid start end`` (``time.perf_counter()``: CLOCK_MONOTONIC, one
clock for every process of the machine) to the file named by ``STOKER_STARTUP_PROBE``. With
that variable unset, importing this module changes nothing.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

OUT = os.environ.get("STOKER_STARTUP_PROBE")


def note(name: str, start: float, end: float | None = None) -> None:
    """One line for step ``name`` of this process (a single ``write`` with ``O_APPEND``: the
    lines of several processes do not mix)."""
    if OUT is None:
        return
    line = f"{name} {os.getpid()} {start:.6f} {start if end is None else end:.6f}\n"
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def timed(owner: Any, attr: str, name: str, *, first_only: bool = False) -> None:
    """Replace ``owner.attr`` by a wrapper that notes each call (or the first) as ``name``."""
    fn = getattr(owner, attr)
    done = []

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if first_only and done:
            return fn(*args, **kwargs)
        done.append(1)
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            note(name, t, time.perf_counter())

    setattr(owner, attr, wrapper)


def install_main() -> None:
    """The main process's steps: the constructor, the worker server's start, the ring (its
    preflight, the anonymous file, each reservation), each worker's start (in a thread while
    the server is still importing) and each batch the main process makes meanwhile."""
    from stoker.loader import _node, _pool, _shm, _startup, loader

    timed(loader.Loader, "__init__", "main: Loader() constructor")
    timed(_pool, "warm_up", "main: start the worker server (spawn)")
    timed(_node, "preflight_and_register", "main: ring preflight")
    timed(_shm.SharedFd, "create", "main: ring memfd")
    timed(_shm, "reserve", "main: reserve a ring range (fallocate)")
    timed(_pool.WorkerPool, "_spawn", "main: start a worker (connect, server forks)")
    if hasattr(_startup, "LocalBatch"):  # chunks of a batch, made until the workers are up
        timed(_startup.LocalBatch, "fill", "main: a batch made here while the workers start")
    elif hasattr(_startup, "first_here"):  # an older tree (--against); older still: none
        timed(_startup, "first_here", "main: a batch made here while the workers start")


def _install_worker() -> None:
    """In the worker server (inherited by every worker it forks): a worker's entry (after
    the fork and unpickling its configuration), its first page population and its first
    chunk."""
    from stoker.loader import _worker

    note("server: preload done", time.perf_counter())
    main = _worker.worker_main

    @functools.wraps(main)
    def worker_main(cfg: Any, conn: Any) -> None:
        note("worker: entered (forked, configuration unpickled)", time.perf_counter())
        return main(cfg, conn)

    _worker.worker_main = worker_main
    timed(_worker, "populate", "worker: map the rows' pages (first chunk)", first_only=True)
    timed(
        _worker, "fill_chunk", "worker: first chunk (read, decode, augment, write)", first_only=True
    )


if OUT is not None and os.environ.get("STOKER_STARTUP_PROBE_MAIN") != str(os.getpid()):
    _install_worker()
