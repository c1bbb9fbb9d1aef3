"""The worker pool: every file's result in list order, with a crashed worker's files retried
alone so that a crash costs only the file that caused it.

Chunks are submitted in order and collected in the same order; at most ``4 * workers`` chunks
are in flight (a bounded reorder window), so the main process sees results in record order
whatever the number of workers.

A worker that dies (segfault, OOM kill) breaks the pool. Chunks that had finished keep their
results; chunks that were running are retried item by item, each alone in a fresh one-worker
pool, and an item that kills that worker too is rejected ``decoder_crash``; chunks that never
ran go to a fresh pool, which carries on.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from stoker.pack._procs import pool_context
from stoker.pack.plan.listing import ListingItem
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.scan import Item
from stoker.pack.run.worker import Task, init_worker, process_task

__all__ = ["Pool", "results"]


class Pool:
    """A process pool that can be replaced after a worker died, and torn down for sure."""

    def __init__(
        self,
        workers: int,
        source: Any = None,
        *,
        initializer: Callable[..., None] = init_worker,
        start_method: str | None = None,
    ) -> None:
        self.workers = workers
        self.source = source  # given to each worker's initializer (a shard job), if any
        self.initializer = initializer  # called with (main pid, source) in each worker
        self.start_method = start_method  # None: the platform's default (``_procs``)
        self.pool: ProcessPoolExecutor | None = None

    def get(self) -> ProcessPoolExecutor:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                self.workers,
                mp_context=pool_context(self.start_method),
                initializer=self.initializer,
                initargs=(os.getpid(),) if self.source is None else (os.getpid(), self.source),
            )
        return self.pool

    def close(self, *, grace: float = 30.0) -> None:
        """Stop the pool: queued chunks are cancelled, workers finish the chunk they hold
        and exit; a worker still busy after ``grace`` seconds is killed (``terminate()`` of a
        process of ``_procs.pool_context``: workers ignore SIGTERM). (Killing first
        could cut a result half sent, or leave the executor's queue feeder blocked on a pipe
        nobody reads, and its shutdown hanging.)"""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(grace)
            if manager.is_alive():
                for p in procs:
                    with contextlib.suppress(Exception):
                        p.terminate()
                manager.join(10)
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(5)


def _chunks(n: int, size: int) -> Generator[tuple[int, int], None, None]:
    for a in range(0, n, size):
        yield a, min(n, a + size)


def _task(items: Sequence[Item], options: PackOptions, upright: bool) -> Task:
    """The task of a chunk of items: their paths, and a listing's masks (a convert's: the
    source positions)."""
    paths = tuple(it.path for it in items)
    if not any(isinstance(it, ListingItem) and it.masks for it in items):
        return Task(paths, options, upright=upright)
    masks = tuple(it.masks if isinstance(it, ListingItem) else () for it in items)
    return Task(paths, options, masks, upright)


def _isolate(
    items: Sequence[Item], options: PackOptions, upright: bool, start_method: str | None
) -> list[tuple]:
    """Run each item alone in a one-worker pool; one that kills it is ``decoder_crash``."""
    out: list[tuple] = []
    single = Pool(1, start_method=start_method)
    try:
        for it in items:
            try:
                task = _task([it], options, upright)
                out.append(single.get().submit(process_task, task).result()[0])
            except BrokenProcessPool:
                single.close()
                out.append((1, "decoder_crash", "the worker process died twice on this file"))
    finally:
        single.close()
    return out


class _NotSubmitted(Exception):
    """Internal: the pool was already broken when this chunk was handed to it."""


def results(
    items: Sequence[Item],
    options: PackOptions,
    pool: Pool,
    *,
    upright: bool = False,
) -> Generator[tuple[int, tuple], None, None]:
    """(position, result) for every item in order, from ``pool``'s workers (``upright``:
    reject EXIF-turned images, see :class:`~stoker.pack.run.worker.Task`). The pool is the
    caller's: it stays up for the next items (a broken one is replaced)."""
    workers = pool.workers
    chunk = max(1, min(64, len(items) // (workers * 8) or 1))
    window = 4 * workers
    todo = _chunks(len(items), chunk)
    retry: collections.deque[tuple[int, int]] = collections.deque()
    pending: collections.deque[tuple[int, int, Future]] = collections.deque()

    def submit() -> bool:
        nxt = retry.popleft() if retry else next(todo, None)
        if nxt is None:
            return False
        a, b = nxt
        try:
            fut = pool.get().submit(process_task, _task(items[a:b], options, upright))
        except BrokenProcessPool:
            fut = Future()
            fut.set_exception(_NotSubmitted())
        pending.append((a, b, fut))
        return True

    try:
        while len(pending) < window and submit():
            pass
        while pending:
            a, b, fut = pending[0]
            try:
                res = fut.result()
            except (BrokenProcessPool, _NotSubmitted):
                # a worker died: keep what finished, retry what ran one file at a time,
                # and hand what never ran to a fresh pool
                entries = list(pending)
                pending.clear()
                pool.close()
                for a2, b2, f2 in entries:
                    exc = f2.exception()
                    if isinstance(exc, _NotSubmitted):
                        retry.append((a2, b2))
                        continue
                    r2 = f2.result() if exc is None else None
                    if r2 is None:
                        r2 = _isolate(items[a2:b2], options, upright, pool.start_method)
                    for i, r in enumerate(r2):
                        yield a2 + i, r
                while len(pending) < window and submit():
                    pass
                continue
            pending.popleft()
            submit()
            for i, r in enumerate(res):
                yield a + i, r
    finally:
        if pending:  # left early: what is queued is dropped with the pool
            pool.close()
