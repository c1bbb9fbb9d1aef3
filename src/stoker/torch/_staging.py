"""The pinned staging buffers of ``CudaPrefetcher``: reused across batches, and bounded.

A buffer is keyed by (shape, dtype). It is *taken* while a launch fills it and queues the copy
that reads it, then *lent* to that copy's event: it is free again once the event has completed.
A launch that fails after queueing a copy lends its buffers to an event recorded after the
failure (or, when no event can be recorded, the buffers are dropped and never reused); one that
fails before queueing anything gives them back at once.

Bounds: at most ``per_key`` buffers per key (more only while one batch needs more buffers of
one shape than that), and at most ``max_keys`` keys (raised by ``fit`` to two batches' worth
when a batch has more distinct shapes than half of it): when a new shape arrives (a partial last
batch, per-batch widths), the least recently used keys whose buffers are all free are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from stoker.torch.backend import Backend

__all__ = ["MAX_SHAPES", "Pinned", "StagingPools"]

MAX_SHAPES = 4  # (shape, dtype) keys kept; the least recently used idle ones are dropped

_Key = tuple[tuple[int, ...], torch.dtype]


@dataclass(eq=False)
class Pinned:
    """One page-locked buffer and what still reads it."""

    buf: torch.Tensor
    launch: int = -1  # the launch that last used it (the oldest is waited for first)
    event: Any = None  # the copy event of that launch; None once seen complete
    taken: bool = False  # being filled by a launch that has not recorded its copy event yet


class StagingPools:
    """Pinned buffers per (shape, dtype), shared by every iteration of one prefetcher."""

    def __init__(self, backend: Backend, *, per_key: int, max_keys: int = MAX_SHAPES) -> None:
        self._be = backend
        self.per_key = per_key
        self.max_keys = max_keys
        self._pools: OrderedDict[_Key, list[Pinned]] = OrderedDict()

    def fit(self, keys: int) -> None:
        """Room for two batches of ``keys`` distinct (shape, dtype) each (a batch with fields
        has more than an image and a label), so that a steady run never drops a key it is
        about to use again."""
        self.max_keys = max(self.max_keys, 2 * keys)

    def sizes(self) -> dict[_Key, int]:
        """Buffers held per key (least recently used first)."""
        return {k: len(v) for k, v in self._pools.items()}

    def _idle(self, p: Pinned) -> bool:
        if p.taken:
            return False
        if p.event is not None:
            if not self._be.event_done(p.event):
                return False
            p.event = None
        return True

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> Pinned:
        """A free buffer for (shape, dtype), taken (waits for the oldest copy if needed)."""
        key = (tuple(shape), dtype)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = []
            self._trim(keep=key)
        else:
            self._pools.move_to_end(key)
        while True:
            for p in pool:
                if self._idle(p):
                    p.taken = True
                    return p
            waitable = [p for p in pool if not p.taken]  # each has a pending copy event
            if len(pool) < self.per_key or not waitable:
                p = Pinned(self._be.pinned_empty(key[0], key[1]), taken=True)
                pool.append(p)
                return p
            self._be.event_wait(min(waitable, key=lambda q: q.launch).event)

    def lend(self, taken: list[Pinned], event: Any, launch: int) -> None:
        """The copies that read ``taken`` are queued; they are free once ``event`` completed."""
        for p in taken:
            p.taken, p.event, p.launch = False, event, launch

    def give_back(self, taken: list[Pinned]) -> None:
        """Nothing that reads ``taken`` was queued: free at once."""
        for p in taken:
            p.taken, p.event = False, None

    def drop(self, taken: list[Pinned]) -> None:
        """A queued copy may read ``taken`` and no event says when it is done: never reuse."""
        gone = {id(p) for p in taken}
        for pool in self._pools.values():
            pool[:] = [p for p in pool if id(p) not in gone]

    def _trim(self, keep: _Key) -> None:
        for key in list(self._pools):
            if len(self._pools) <= self.max_keys:
                return
            if key != keep and all(self._idle(p) for p in self._pools[key]):
                del self._pools[key]
