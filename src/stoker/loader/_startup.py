"""A loader's start, in order, and the part of it that runs beside the rest: the batch slots
reserved ahead of their first task.

The start of a loader with workers (the measured steps: docs/loader.md, "The first batch"):

1. ``Loader()``: the worker server is started first (``_pool.warm_up``: a fresh interpreter
   importing what every worker needs), so that it boots while the constructor opens the
   source and builds the pipeline, and after that while the caller builds its model.
2. The first ``iter``: the ring is laid out and made (``RingFeed._ensure_running``: preflight,
   an anonymous file, its control block reserved), then the first ``prefetch`` slots are
   reserved by :class:`SlotReservations`, in a thread, while
3. the workers are started (``WorkerPool.start``: each forked by the server, which answers
   once its imports are done); each maps the ring, takes its first task and maps the rows
   it writes.
4. Each slot's first task is sent once its reservation is done (``RingFeed._reserve_slot``
   waits for it): no task names an unreserved slot, as before.

Reserving a slot (``posix_fallocate`` of the anonymous file: the kernel allocates and zeroes
its pages) costs tens of milliseconds for a float32 slot. Done one by one on the main thread
it came after the workers' start and beside their first chunks, on the cores they work on;
in the thread, it overlaps the wait for the worker server and the workers' boot (the system
call releases the GIL). A failure (memory ran out since the preflight) is raised on the main
thread when the slot is first wanted; the thread is joined before the ring is closed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from stoker.loader import _shm
from stoker.loader._ring import RingLayout

__all__ = ["SlotReservations"]


class SlotReservations:
    """``posix_fallocate`` of the given ``slots`` of ``ring``, one after another, in a daemon
    thread started at once; :meth:`wait` for one of them on the main thread."""

    def __init__(self, ring: Any, layout: RingLayout, slots: Iterable[int]) -> None:
        self._ring, self._layout = ring, layout
        self._done = {s: threading.Event() for s in slots}
        self._failed: dict[int, BaseException] = {}  # a slot -> why it is not reserved
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="stoker-ring-reserve", daemon=True)
        self._thread.start()

    def __contains__(self, slot: int) -> bool:
        return slot in self._done

    def _run(self) -> None:
        error: BaseException | None = None
        for slot, done in self._done.items():
            try:
                if error is None and not self._stop:
                    offset = self._layout.slot_offset(slot)
                    _shm.reserve(self._ring, offset, self._layout.slot_bytes)
            except BaseException as e:  # noqa: BLE001 - raised on the main thread by wait()
                error = e
            if error is not None:  # this slot failed, or one before it did: not reserved
                self._failed[slot] = error
            done.set()

    def wait(self, slot: int) -> None:
        """Block until ``slot`` is reserved; raise what kept it from being reserved (its own
        reservation's failure, or an earlier slot's, after which none was tried)."""
        self._done[slot].wait()
        error = self._failed.get(slot)
        if error is not None:
            raise error

    def join(self) -> None:
        """Skip what is not reserved yet and wait for the thread: the ring may be closed
        afterwards."""
        self._stop = True
        self._thread.join()
