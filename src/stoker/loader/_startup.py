"""A loader's start, in order, and the parts of it that run beside the rest: the batch slots
reserved ahead of their first task, and, in a process's first loader, the workers' start while
the main process makes the first batches itself.

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

While the server is still importing (it was started by this process and has forked no worker
yet: ``_pool.server_booting``), step 3 would leave the main process waiting for most of the
first batch's time. So when everything a sample passes through is stoker's own code and plain
data (:func:`own_code`: a user's transform or source never runs in the main process unless
``workers=0`` asks for it), :class:`PoolStart` starts the workers in a :class:`WorkerStart`
thread, and the main thread makes the next batch itself (:func:`first_here`, which is
:func:`make_local`, the ``workers=0`` path: ``fill_chunk`` into fresh arrays, the same bytes
the workers write) for as long as they are not up. It gives a batch up (the workers make it)
when they come up before half of it is done, and when a sample fails under
``on_error="raise"``, so that a failure is reported by a worker as always. The pool is not
touched on the main thread meanwhile: the first use of ``_pool`` there (dispatching a batch,
``worker_pids()``, ``close()``) waits for the thread and raises what kept a worker from
starting. The thread pickles the source and pipeline for each worker while the main thread
reads through them; both pickle from plain state (``__getstate__`` copies), never from what
a read changes.

Reserving a slot (``posix_fallocate`` of the anonymous file: the kernel allocates and zeroes
its pages) costs tens of milliseconds for a float32 slot. Done one by one on the main thread
it came after the workers' start and beside their first chunks, on the cores they work on;
in the thread, it overlaps the wait for the worker server and the workers' boot (the system
call releases the GIL). A failure (memory ran out since the preflight) is raised on the main
thread when the slot is first wanted; the thread is joined before the ring is closed.
"""

from __future__ import annotations

import errno
import io
import pickle
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from stoker._core.errors import LoaderError
from stoker.loader import _shm
from stoker.loader._compact import compact, compact_fields, dims
from stoker.loader._pool import WorkerPool, server_booting
from stoker.loader._ring import RingLayout
from stoker.loader._worker import Task, fill_chunk
from stoker.loader._worker_errors import rebuild
from stoker.loader.batch import Batch, make_batch

__all__ = [
    "NOT_MADE",
    "NotMade",
    "PoolStart",
    "SlotReservations",
    "WorkerStart",
    "first_here",
    "make_local",
    "own_code",
]


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


class NotMade:
    """:func:`make_local`'s answer when it gave the batch up (see ``cancelled``)."""


NOT_MADE = NotMade()

# modules whose objects the main process may run for the workers while they start: stoker's
# own, and the plain data its objects pickle into (a user's transform or source never runs
# in the main process unless workers=0 asks for it)
_OWN = ("stoker", "numpy", "builtins", "copyreg", "collections", "_codecs", "pathlib", "posixpath")


class _Names(pickle.Pickler):
    """A pickler that notes the module of every object, function and class it meets."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        owner = obj if isinstance(obj, type) else type(obj)
        self.modules.add(getattr(obj, "__module__", None) or owner.__module__ or "")
        self.modules.add(owner.__module__ or "")
        return NotImplemented


def own_code(*objects: Any) -> bool:
    """Whether everything ``objects`` carry (the source, the pipeline) is stoker's own code
    and plain data, found by pickling them as a worker's start does; an object that does not
    pickle counts as not."""
    names = _Names()
    try:
        with _shm.probing():  # shared memory pickles as a placeholder: only inspected
            names.dump(objects)
    except Exception:  # noqa: BLE001
        return False
    return all(m.partition(".")[0] in _OWN for m in names.modules)


class WorkerStart:
    """``pool.start(config, control, count)`` in a daemon thread started at once: the main
    thread meanwhile makes the first batch itself (:func:`make_local`); the loader's pool is
    not used on the main thread before :meth:`join`."""

    def __init__(self, pool: Any, config: Any, control: Any, count: int) -> None:
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(pool, config, control, count), name="stoker-worker-start"
        )
        self.thread.daemon = True
        self.thread.start()

    def _run(self, pool: Any, config: Any, control: Any, count: int) -> None:
        try:
            pool.start(config, control, count)
        except BaseException as e:  # noqa: BLE001 - raised on the main thread by join()
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the start has ended (the workers are up, or it failed)."""
        return self._done.is_set()

    def here(self) -> bool:
        """Whether the caller is the starting thread itself."""
        return threading.current_thread() is self.thread

    def join(self) -> BaseException | None:
        """Wait for the start; what kept it from starting every worker, or ``None``."""
        self.thread.join()
        return self._error


def make_local(
    loader: Any, ep: Any, number: int, cancelled: Callable[[], bool] | None = None
) -> Batch | None | NotMade:
    """Batch ``number`` of ``ep`` made in this process into fresh arrays, as a worker makes it
    (``fill_chunk``: the same bytes), or ``None`` when every sample of it was skipped. With
    ``workers=0`` the loader makes every batch so. At a loader's start (``cancelled`` given),
    :data:`NOT_MADE` when ``cancelled()`` turned true or a sample failed: the workers then
    make the batch, and report a failure as they report any."""
    bidx, width, height, half, rows = loader._batch_plan(ep, number)
    pipeline, label_spec = loader.pipeline, loader._label_spec
    shape = (rows, *pipeline.row_shape(width, height))
    images = np.empty(shape, dtype=pipeline.dtype)
    labels = np.empty((rows, *dims(label_spec)), dtype=label_spec.dtype)
    keys = np.empty(rows, dtype=np.int64)
    indices = np.empty(rows, dtype=np.int64)
    fields = None
    if loader._fields is not None:
        fields = loader._fields.arrays(rows, pipeline.frame(width, height))
    task = Task(ep.generation, number, -1, ep.epoch, width, rows, 0, bidx, half, height)
    status, payload = fill_chunk(
        task,
        source=loader.source,
        pipeline=pipeline,
        seed=loader.seed,
        views=(images, labels, keys, indices),
        on_error=loader.on_error,
        cancelled=cancelled,
        fields=fields,
    )
    if cancelled is not None and status != "done":
        return NOT_MADE
    if status == "error":
        raise rebuild(payload, None)
    views = compact((images, labels, keys, indices), payload, half)
    fields = compact_fields(fields, payload)
    loader._account(ep.epoch, payload)
    if len(views[0]) == 0:
        return None
    return make_batch(views, fields, ep.epoch, number)


def first_here(loader: Any, start: WorkerStart, ep: Any, number: int) -> Batch | None | NotMade:
    """:func:`make_local` while ``start`` brings the workers up: given up (:data:`NOT_MADE`)
    when they are up before half its samples are done (they make it faster), and when a
    sample fails under ``on_error="raise"``."""
    rows, seen = loader._per_batch, [0]

    def cancelled() -> bool:
        seen[0] += 1
        return start.done() and seen[0] <= rows // 2

    return make_local(loader, ep, number, cancelled)


class PoolStart:
    """The part of :class:`~stoker.loader._feed.RingFeed` that starts its workers: at once,
    or, while the worker server is still importing, in a :class:`WorkerStart` thread while
    the main thread makes the first batch (:meth:`_made_here`)."""

    _starting: WorkerStart | None = None  # the workers being started in a thread
    workers: int
    pipeline: Any
    _per_batch: int

    if TYPE_CHECKING:

        @property
        def source(self) -> Any: ...

        @property
        def _engine(self) -> Any: ...

        def _teardown_workers(self, grace: float = ...) -> None: ...

    @property
    def _pool(self) -> WorkerPool:
        """The workers; while a thread starts them, the first use on the main thread waits
        for it, and raises what kept a worker from starting."""
        start = self._starting
        if start is not None and not start.here():
            self._join_start(start)
        return self.__dict__["_pool_"]

    @_pool.setter
    def _pool(self, pool: WorkerPool) -> None:
        self.__dict__["_pool_"] = pool

    def _join_start(self, start: WorkerStart) -> None:
        """Wait for the workers' start in ``start``; raise what kept one from starting."""
        self._starting = None
        error = start.join()
        if error is not None:
            self._start_failed(error)

    def _abandon_start(self) -> None:
        """Wait for a start in flight without raising what it met (a teardown stops whatever
        of the pool started)."""
        start, self._starting = self._starting, None
        if start is not None and not start.here():
            start.join()

    def _start_pool(self, config: Any, control: np.ndarray) -> None:
        """Start the workers of ``config``: in a thread when the server is still importing
        and the main process may run the samples (:func:`own_code`), else here."""
        if server_booting() and not self._engine.portable and own_code(self.source, self.pipeline):
            self._starting = WorkerStart(self._pool, config, control, self.workers)
            return
        try:
            self._pool.start(config, control, self.workers)
        except BaseException as e:
            self._start_failed(e)

    def _start_failed(self, e: BaseException) -> NoReturn:
        """The workers' start raised ``e``: stop those that started, and raise (too many open
        files said as such)."""
        started = len(self._pool.handles)
        self._teardown_workers(grace=0.2)
        if isinstance(e, OSError) and e.errno == errno.EMFILE:
            import resource

            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            raise LoaderError(
                f"cannot start loader worker {started} of {self.workers}: too many open "
                f"files (the limit, ulimit -n, is {soft}); raise it or use fewer workers"
            ) from e
        raise e

    def _made_here(self, ep: Any, number: int) -> Batch | None | NotMade:
        """Batch ``number``, the next to dispatch, made in this process while the workers
        start (:func:`first_here`), or :data:`NOT_MADE`."""
        start = self._starting
        if start is None or start.done() or not ep.pending or ep.pending[0] != number:
            return NOT_MADE
        made = first_here(self, start, ep, number)
        if made is NOT_MADE:
            self._join_start(start)  # the workers make it
        else:
            ep.pending.popleft()
        return made
