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
thread, and the main thread makes the next batch itself, a chunk (an eighth, at least 32
samples) at a time (:class:`LocalBatch`: ``fill_chunk`` into fresh arrays, as ``workers=0``
makes every batch, the same bytes the workers write). Once the workers are up, they begin
the next batches, and the batch under way is finished here when less than a quarter of it
is left (sooner than a worker's first chunk starts: it unpickles its configuration and maps
its rows first); a larger rest goes to the workers: the rows made so far are copied into the
batch's ring slot and the rest is dispatched as any batch is. A sample that fails under ``on_error="raise"``
hands its chunk to the workers too, so that a failure is reported by a worker as always.
The pool is not touched on the main thread meanwhile: the first use of ``_pool`` there
(dispatching a batch, ``worker_pids()``, ``close()``) waits for the thread and raises what
kept a worker from starting. The thread pickles the source and pipeline for each worker
while the main thread reads through them; both pickle from plain state (``__getstate__``
copies), never from what a read changes.

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
from stoker.loader._worker import FIRST_BLOCKS_FROM, Task, fill_chunk
from stoker.loader._worker_errors import rebuild
from stoker.loader.batch import Batch, make_batch

__all__ = [
    "NOT_MADE",
    "LocalBatch",
    "NotMade",
    "PoolStart",
    "SlotReservations",
    "WorkerStart",
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
    """``PoolStart._made_here``'s answer when the workers make the batch, or the rest of it."""


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


class LocalBatch:
    """Batch ``number`` of ``ep`` made in this process into fresh arrays as a worker makes it
    (``fill_chunk``: the same bytes), a chunk at a time from its first row (:meth:`fill`);
    ``made`` of its source samples are done."""

    def __init__(self, loader: Any, ep: Any, number: int) -> None:
        self.loader, self.ep, self.number = loader, ep, number
        self.bidx, self.width, self.height, self.half, rows = loader._batch_plan(ep, number)
        pipeline, label_spec = loader.pipeline, loader._label_spec
        self.views = (
            np.empty((rows, *pipeline.row_shape(self.width, self.height)), pipeline.dtype),
            np.empty((rows, *dims(label_spec)), label_spec.dtype),
            np.empty(rows, np.int64),
            np.empty(rows, np.int64),
        )
        self.fields = None
        if loader._fields is not None:
            self.fields = loader._fields.arrays(rows, pipeline.frame(self.width, self.height))
        self.made = 0
        self.bad: list = []  # the skipped samples of the rows made

    def fill(self, step: int, going: Callable[[], bool] = lambda: True) -> Any:
        """Make the next chunks of ``step`` samples while ``going()``; the error of the first
        sample that failed under ``on_error="raise"`` (its chunk is left unmade), else None."""
        loader, ep, n = self.loader, self.ep, len(self.bidx)
        while self.made < n and going():
            stop = min(self.made + step, n)
            task = Task(
                ep.generation, self.number, -1, ep.epoch, self.width, len(self.views[0]),
                self.made, self.bidx[self.made : stop], self.half, self.height,
            )  # fmt: skip
            status, payload = fill_chunk(
                task,
                source=loader.source,
                pipeline=loader.pipeline,
                seed=loader.seed,
                views=self.views,
                on_error=loader.on_error,
                fields=self.fields,
            )
            if status == "error":
                return payload
            self.bad.extend(payload)
            self.made = stop
        return None

    def batch(self) -> Batch | None:
        """The batch of the arrays, every row made (``None``: every sample skipped)."""
        views = compact(self.views, self.bad, self.half)
        fields = compact_fields(self.fields, self.bad)
        self.loader._account(self.ep.epoch, self.bad)
        if len(views[0]) == 0:
            return None
        return make_batch(views, fields, self.ep.epoch, self.number)

    def copy_into(self, views: tuple, fields: Any) -> None:
        """The rows made so far (and their paired rows) into a ring slot's ``views`` and
        field columns ``fields``, before any worker is given the rest."""
        spans = [(0, self.made)] + ([(self.half, self.half + self.made)] if self.half else [])
        ours, theirs = [*self.views], [*views]
        if fields is not None and self.fields is not None:
            ours += [*self.fields.columns.values(), *self.fields.lengths.values()]
            theirs += [*fields.columns.values(), *fields.lengths.values()]
        for dst, src in zip(theirs, ours, strict=True):
            for a, b in spans:
                dst[a:b] = src[a:b]


def make_local(loader: Any, ep: Any, number: int) -> Batch | None:
    """``workers=0``: batch ``number`` of ``ep`` made in this process into fresh arrays, or
    ``None`` when every sample of it was skipped."""
    part = LocalBatch(loader, ep, number)
    error = part.fill(max(len(part.bidx), 1))
    if error is not None:
        raise rebuild(error, None)
    return part.batch()


class PoolStart:
    """The part of :class:`~stoker.loader._feed.RingFeed` that starts its workers: at once,
    or, while the worker server is still importing, in a :class:`WorkerStart` thread while
    the main thread makes the first batches (:meth:`_made_here`)."""

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

        def _send(self, ep: Any, number: int, made: LocalBatch | None = None) -> None: ...

        def _dispatch(self, ep: Any) -> None: ...

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
        start, a chunk at a time. Once they are up, a rest under a quarter of it is made
        here too while they begin the next batches; :data:`NOT_MADE` when they are given a
        larger rest, or the rest from a sample that failed under ``on_error="raise"``
        (``_send``)."""
        start = self._starting
        if start is None or start.done() or not ep.pending or ep.pending[0] != number:
            return NOT_MADE
        ep.pending.popleft()
        part = LocalBatch(self, ep, number)
        n = len(part.bidx)
        # an eighth at a time, even (mixed pairs), and long enough to take the samples' first
        # random blocks at once (as a worker's chunk does)
        step = max(FIRST_BLOCKS_FROM, 2 * -(-n // 16))
        error = part.fill(step, lambda: not start.done())
        if error is None and part.made == n:
            return part.batch()
        self._join_start(start)
        if error is None and 4 * (n - part.made) < n:  # made here sooner than the workers start
            self._dispatch(ep)  # they begin the next batches meanwhile
            error = part.fill(n)
            if error is None:
                return part.batch()
        self._send(ep, number, part)
        return NOT_MADE
