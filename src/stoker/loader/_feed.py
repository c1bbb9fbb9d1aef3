"""The loader's batch ring seen from the main process: slot ownership, chunks handed to the
workers, finished batches collected, and the ring's life (made, reserved, torn down).

NOTE [ Loader ring and shutdown protocol ]

Buffers. One anonymous shared file per loader (``memfd_create("stoker-ring", MFD_CLOEXEC)``,
``_shm.SharedFd``), never a name in ``/dev/shm``: it counts against memory (and the memory
cgroup), not the ``/dev/shm`` mount (Docker's default is 64 MB), and the kernel frees it with
the last process that maps it or holds its descriptor, so no exit, however abrupt, leaves it
behind. A preflight compares its size with the memory available (``MemAvailable`` capped by
the cgroup's room), and each range is reserved with ``posix_fallocate`` before use (memory
that ran out fails there, never as a SIGBUS later). The control block is reserved before the
workers start, the first ``prefetch`` slots in a thread while they start (``_startup.py``),
each other slot just before its first task. No task names an unreserved slot. While the
worker server of a process's first loader is still importing, the workers start in a thread
and the main process makes the batches in fresh arrays, a chunk at a time, until they are up
(``_startup.py``); the part made of a batch with a quarter or more left then is copied into
its slot before the workers are given the rest. Before its first write to a range of rows, a
worker maps those pages in one ``MADV_POPULATE_WRITE`` call.
Ownership of the descriptor: main holds it from creation to teardown (to reserve slots and
to start workers, respawned ones included); each worker gets a duplicate with its start (the
``WorkerConfig`` pickles it through the fork server's fd passing, ``SharedFd.__reduce__``),
maps the whole ring at once and closes it, so a worker holds only its mapping. ``workers=0``
makes no ring (batches are fresh arrays). Named ``/dev/shm/stoker_*`` segments remain for an
array source's copy (``ArraySource.share``): it is made before any worker exists, pickled as
part of the source and may be mapped by processes stoker does not start, so it needs a name;
``stoker cleanup`` and every loader start sweep those whose owner is dead.
The portable engine (``_engine.py``) changes only the ring's kind and the workers' start: a
named ``multiprocessing.shared_memory`` segment (``_named.NamedRing``; main creates, registers
and unlinks it; workers map it by name, unregistered) and ``spawn``; the rest holds as written.
Layout (see ``_ring.py``): a 64-byte control block (int64 *generation*: the live iteration;
then, per worker, the global index it is processing, so a death names its sample) and
``Loader.slots`` (``prefetch + 2``) slots; each slot holds ``batch_size`` rows of images
(pipeline dtype and layout, sized for the widest and tallest batch), labels, record keys and
global indices, and, when the batches carry fields, a column per field (padded to the
schema's ``max_len``, with an int32 lengths column for variable ones; see ``_fields.py``). Batches being built: at most ``prefetch``; the one the consumer holds: 1; a spare for
a batch kept by ``Batch.retain()`` (the GPU prefetcher holds one while its copy runs): 1,
reserved only when a retained batch first leaves no other slot free.

Messages. Each worker has its own duplex pipe. Main -> worker: a :class:`Task` (generation,
batch number, slot, epoch, width, first row, chunk indices, seed), or ``None`` to stop.
Worker -> main: ``(status, generation, number, row0, payload, seconds, usage)``, status
``done`` (payload: the skipped samples), ``error`` (type, message, traceback text, key, index)
or ``cancelled``; ``seconds``: the chunk's wall time in the worker; ``usage``: its thread CPU
seconds and minor page faults inside ``fill_chunk`` and the CPU seconds spent mapping its rows
first (summed per worker in main, for the accounting in docs/loader.md). A batch is split into one
chunk per worker; each chunk goes to the worker that will be free first (samples queued times
its recent seconds per sample; ties in turn), so two chunks of a batch may go to one worker.
Within half a chunk of the first to be free, a worker that wrote those rows of that slot
before is preferred: a process maps a ring page on its first write there. The first batch
arrives after ``batch_size / workers`` samples per worker, and a worker that falls behind
(preempted, slower images) gets less of the next batches instead of leaving the others idle
while they wait for its share to free a slot. Main waits on one ``select.poll`` over the
workers' pipes and sentinels. Nothing large is pickled: images never leave the ring; a
task's indices travel as raw int64 bytes.

Ownership of a slot (:class:`SlotState`): FREE -> (main dispatches) WORK: the workers named in
its chunks write their rows, nobody else touches it; once all chunks have reported, main only
-> (yielded) USER: the consumer reads it until it asks for the next batch, or, when the batch
was ``retain()``ed, until ``release()`` -> FREE. Main dispatches while a slot is FREE and fewer
than ``prefetch`` are WORK. A slot whose chunks belong to an abandoned generation stays WORK
until every chunk has reported (workers notice the new generation in the control block before
each sample and stop early), so a worker never writes into a slot main has handed out again.

Order and randomness. Main decides everything: batch ``b`` of epoch ``e`` is
``sampler.indices(e)[b*n:(b+1)*n]``; sample ``i`` is augmented with
``sample_rng(seed, e, i)``; batches are yielded by number whatever worker finishes first.
So the output is the same for any worker count, and a resumed run is exact.

One sample in a worker (``_worker.fill_chunk``; the main process runs the same code when
``workers=0``): read the record (label from its header), decode, re-key the worker's one
generator (``SampleRngs.at(i)`` gives ``sample_rng``'s stream), ``Pipeline.fill_row``
(transforms, shape check, write into the row; a trailing uint8 ``Normalize`` converts, scales
and shifts straight into the row in the batch layout), then label, key and index.

Shutdown order (``close()``, also from ``__exit__``, ``__del__``, the atexit hook, and after any
error while waiting): bump the generation (workers drop their current chunk at the next
sample); send ``None`` to each worker; join them for up to 2 s (0.2 s after an error, when a
worker may be hung); ``terminate()`` (SIGTERM) the stragglers, join 2 s; ``kill()`` what is
left, join; close the pipes; close main's ring descriptor (the memory is freed once nothing
maps it: a batch view kept by the user stays valid until it dies); close a source the loader
opened (an in-memory array source unlinks its segment).

- Normal end of an epoch: workers stay up for the next epoch (persistent).
- ``break`` out of the loop: the generation is bumped; in-flight slots come back as their
  chunks report; workers stay up. The next ``for`` continues the same epoch where it stopped.
- Exception in a worker: re-raised in main as a subclass of ``WorkerError`` *and* of the
  original type when possible, with the worker id, record key, index and traceback text
  (``_worker_errors.py``); workers are shut down (the next iteration starts new ones).
- Ctrl-C in main (workers ignore SIGINT): ``KeyboardInterrupt`` propagates; workers and the
  ring are torn down on the way out (generator cleanup, ``with``, or the atexit hook).
- SIGKILL/segfault/OOM-kill of a worker: its process sentinel wakes main's wait at once;
  ``WorkerDiedError`` names the worker, pid, signal, the sample it was processing and its
  in-flight keys. With ``on_worker_death="respawn"`` a new worker takes the dead one's place
  and gets its unanswered chunks again (rows are rewritten in place, so nothing is lost or
  duplicated); a sample that was being processed at two deaths raises instead.
- SIGKILL of main: workers die with it (PR_SET_PDEATHSIG on their parent, plus a 0.5 s
  watchdog thread on main's pid and start time; a blocked ``recv`` also sees EOF; on the
  portable engine, a thread on the lifeline pipe whose write end only main holds).
  The portable ring is unlinked by the resource tracker, or swept at the next start. The ring
  goes with the last of them: nothing is left to sweep (an array source's named segment is
  swept at the next loader start or by ``stoker cleanup``). A respawned worker gets main's
  descriptor of the same ring, duplicated at its start.

Kept workers (``keep_workers``, ``_keep.py``): ``close()`` waits for the chunks in flight,
sends each worker ``PARK`` (it closes its source) and hands the pool, with the ring and main's
mapping of it, to the process's keep instead of the shutdown above. A later loader of the
same key takes both: the ring as it is when its layout is the same and no view of it is
alive (``Kept.ring_fits``), else it closes the kept ring and sends each worker ``(RING,
layout, size)`` and the new ring's descriptor (``SCM_RIGHTS`` on its pipe); the worker maps
it and drops the old mapping. Timer, ``release_workers()`` and the atexit hook stop kept pools
by the shutdown order.

Timeouts. Main waits on pipes and process sentinels with a 0.25 s poll, so a death is seen at
once and a stall is checked 4 times a second; ``timeout=T`` raises ``LoaderTimeoutError`` when
the batch being waited for has not arrived T seconds after main started waiting for it, naming
the keys still in flight per worker. Joins on shutdown are bounded (about 9 s worst case,
which needs a worker that ignores SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.errors import LoaderError, LoaderTimeoutError
from stoker._core.specs import ArraySpec
from stoker.loader import _keep, _node, _shm
from stoker.loader._compact import compact, compact_fields, dims
from stoker.loader._fields import FieldPlan
from stoker.loader._pool import JOIN_S, WorkerPool
from stoker.loader._ring import RingLayout
from stoker.loader._startup import NOT_MADE, LocalBatch, PoolStart, SlotReservations
from stoker.loader._worker import Task, WorkerConfig
from stoker.loader._worker_errors import rebuild
from stoker.loader.batch import Batch, SlotLease, make_batch

if TYPE_CHECKING:
    from stoker.loader._engine import Engine
    from stoker.loader.sources import Source
    from stoker.pipeline import Pipeline

__all__ = ["Epoch", "RingFeed", "SlotState"]

_POLL_S = 0.25


class SlotState(Enum):
    """Who may touch a batch slot (see the NOTE)."""

    FREE = "free"  # nobody: main may dispatch a batch into it
    WORK = "work"  # its chunks' workers, then (all reported, not yet yielded) main only
    USER = "user"  # the consumer, until the next batch, or until release() when retained


# module-level names for the main loop, which reads them per batch: a global is read faster
# than a member looked up on the Enum class
_FREE, _WORK, _USER = SlotState.FREE, SlotState.WORK, SlotState.USER


@dataclass(slots=True)
class Epoch:
    """One iteration of the loader: what ``_run`` hands ``_dispatch`` and ``_wait``."""

    generation: int  # the iteration's generation (the live one while it runs)
    epoch: int
    order: np.ndarray  # the sampler's indices for the epoch
    widths: np.ndarray | None  # per-batch widths, or None
    pending: deque[int]  # batch numbers not yet dispatched
    heights: np.ndarray | None = None  # per-batch heights (aspect-ratio buckets), or None


@dataclass
class _Inflight:
    slot: int
    epoch: int
    width: int | None
    rows: int
    half: int
    chunks_left: int
    height: int | None = None
    bad: list = field(default_factory=list)
    error: tuple[dict, int] | None = None


class RingFeed(PoolStart):
    """The ring-and-workers half of :class:`~stoker.loader.Loader` (its base class): the state
    below is the loader's, set in its ``__init__``."""

    pipeline: Pipeline
    batch_size: int
    workers: int
    prefetch: int
    seed: int
    on_error: str
    on_worker_death: str
    keep_workers: float
    timeout: float | None
    _label_spec: ArraySpec
    _fields: FieldPlan | None
    _slot_state: list[SlotState]
    _unreserved: set[int]  # slots not yet posix_fallocate'd
    _ring_width: int | None
    _layout: RingLayout | None
    _inflight: dict[tuple[int, int], _Inflight]
    _ring_id: int
    _generation: int
    _ring: Any  # the ring's handle: the engine's (_engine.Engine.make_ring), for new workers
    _engine: Engine  # how workers start and share the ring (_engine.py)
    _mem: np.ndarray | None
    _node_entry: _node.NodeEntry | None = None  # the ring's entry in the node's registry
    _ahead: SlotReservations | None = None  # the first slots, being reserved in a thread
    if TYPE_CHECKING:

        @property
        def source(self) -> Source: ...

        @property
        def slots(self) -> int: ...

        def _batch_plan(
            self, ep: Epoch, number: int
        ) -> tuple[np.ndarray, int | None, int | None, int, int]: ...

        def _account(self, epoch: int, bad: list) -> None: ...

    def _ensure_running(self, max_width: int | None, max_height: int | None = None) -> None:
        if self._layout is not None and (max_width is not None or max_height is not None):
            wider = max_width is not None and (
                self._ring_width is None or max_width > self._ring_width
            )
            ring_h = self._layout.max_height
            taller = max_height is not None and (ring_h is None or max_height > ring_h)
            if wider or taller:
                self._teardown()  # a wider or taller epoch than the ring was made for: rebuild
        if self._layout is None:
            slots = self.slots
            layout = RingLayout(
                pipeline=self.pipeline,
                rows=self.batch_size,
                max_width=max_width,
                label_shape=dims(self._label_spec),
                label_dtype=self._label_spec.dtype,
                slots=slots,
                workers=self.workers,
                max_height=max_height,
                fields=self._fields,
            )
            self.source.share()
            kept = self._take_kept()  # a kept pool of this configuration: no process starts
            reuse = kept is not None and kept.ring_fits(layout)
            if kept is not None:
                self._pool = kept.pool  # stopped by the teardown if anything below fails
            if reuse:  # its ring, mapped by its workers already
                assert kept is not None and kept.ring is not None and kept.mapping is not None
                seg, mapping, unreserved = kept.ring, kept.mapping, set(kept.unreserved)
                self._node_entry = _node.preflight_and_register(
                    layout.total_bytes,
                    slots=slots,
                    workers=self.workers,
                    what=self._what(),
                    reserved=layout.total_bytes - len(unreserved) * layout.slot_bytes,
                    check=False,
                )
            else:
                if kept is not None:
                    kept.drop_ring()
                # the memory available, less what the node's other rings have yet to take
                self._node_entry = _node.preflight_and_register(
                    layout.total_bytes, slots=slots, workers=self.workers, what=self._what()
                )
                # Only the control block is reserved before the workers start; the first
                # `prefetch` slots in a thread while they start (_startup.py), every other slot
                # when it is first dispatched (_dispatch), while the workers make the batches
                # before it, so the first batch does not wait for the whole ring. Nothing
                # touches an unreserved slot: workers write only the slot a task names.
                seg, mapping = self._engine.make_ring(layout.total_bytes)
                unreserved = set(range(slots))
            self._ring = seg
            named = getattr(seg, "name", None)  # the portable engine's ring
            if self._node_entry is not None and isinstance(named, str):
                self._node_entry.name_segment(named)  # swept should this process die
            self._mem = mapping.array()
            self._layout = layout
            self._ring_width = max_width
            self._slot_state = [_FREE] * slots
            self._unreserved = unreserved
            self._ring_id += 1
            try:
                if not reuse:
                    _shm.reserve(seg, 0, layout.control_bytes)
                    self._reserved_node(layout.control_bytes)
                control = layout.control(self._mem)
                control[0] = self._generation
                control[1:] = -1
                first = [s for s in sorted(unreserved) if s < self.prefetch]
                self._ahead = SlotReservations(seg, layout, first) if first else None
                # none run without a ring (_teardown stops them first)
                self._start_workers(adopt=kept is not None, new_ring=not reuse)
            except BaseException:
                self._teardown()
                raise
        elif not self._pool.handles:
            self._start_workers()

    def _take_kept(self) -> _keep.Kept | None:
        if not (self.keep_workers or _keep.kept_count()):
            return None
        key = _keep.pool_key(
            self.source, self.pipeline, self.on_error, self.workers, self._engine.name
        )
        return None if key is None else _keep.take(key)

    def _start_workers(self, *, adopt: bool = False, new_ring: bool = True) -> None:
        """Start the workers, or (``adopt``) hand the kept pool in ``_pool`` this loader's
        configuration and, with ``new_ring``, its ring."""
        if self._layout is None or self._ring is None or self._mem is None:
            raise LoaderError("the batch ring is not allocated")
        me = os.getpid()
        config = WorkerConfig(
            worker_id=0,  # each worker's own id is set by the pool
            source=self.source,
            pipeline=self.pipeline,
            seed=self.seed,
            layout=self._layout,
            ring=self._ring,
            on_error=self.on_error,
            main_pid=me,
            main_start=_shm.process_start_time(me),
        )
        control = self._layout.control(self._mem)
        if adopt:
            try:
                self._pool.adopt(config, control, self.on_worker_death, new_ring=new_ring)
                return
            except OSError:  # a kept worker died since: new ones below
                self._pool.stop(0.2)
                self._pool = WorkerPool(self.on_worker_death, self._engine)
        self._start_pool(config, control)

    def _park_workers(self) -> None:
        """``close()`` with ``keep_workers``: once every chunk in flight has reported, the
        idle workers close their source and are kept, with the ring, for the next loader of
        the same configuration (``_keep``). Otherwise (a worker busy past the grace, dead, or a
        configuration that cannot be keyed) they are left to the teardown that follows."""
        pool = self._pool
        if not pool.handles or self._layout is None:
            return
        key = _keep.pool_key(
            self.source, self.pipeline, self.on_error, self.workers, self._engine.name
        )
        if key is None:
            return
        self._cancel()  # workers drop their chunks at the next sample
        deadline = time.monotonic() + JOIN_S
        try:
            while any(w.tasks for w in pool.handles) and time.monotonic() < deadline:
                self._pump(0.05)
        except Exception:  # noqa: BLE001 - a dead worker: the teardown stops the rest
            return
        if any(w.tasks for w in pool.handles) or not all(w.proc.is_alive() for w in pool.handles):
            return
        pool.park()
        self._pool = WorkerPool(self.on_worker_death, self._engine)
        self._inflight.clear()
        self._slot_state = [_FREE if s is _WORK else s for s in self._slot_state]
        ring, ahead, self._ahead = None, self._ahead, None
        if ahead is not None:
            ahead.join()  # its slots not yet waited for stay unreserved for the next user
        if self._ring is not None and self._mem is not None:  # kept with them, not closed
            mapping: Any = self._mem.base  # the Mapping under main's view of the ring
            ring = (self._ring, mapping, self._layout, frozenset(self._unreserved))
            self._ring, self._mem = None, None
        _keep.park(key, pool, self.keep_workers, ring)

    def _set_generation(self) -> None:
        if self._mem is not None and self._layout is not None:
            self._layout.control(self._mem)[0] = self._generation

    def _cancel(self) -> None:
        """Abandon the live iteration: workers stop their chunks at the next sample."""
        self._generation += 1
        self._set_generation()
        for key, info in list(self._inflight.items()):
            if info.chunks_left == 0:  # finished but never delivered: free now
                self._slot_state[info.slot] = _FREE
                del self._inflight[key]

    def _free_slot(self, slot: tuple[int, int]) -> None:
        ring, s = slot
        if ring == self._ring_id and s < len(self._slot_state) and self._slot_state[s] is _USER:
            self._slot_state[s] = _FREE

    def _dispatch(self, ep: Epoch) -> None:
        """Send chunks of the next pending batches while free slots last and fewer than
        ``prefetch`` batches are being made. The spare slot is used, and reserved, only while
        the consumer has a batch retained."""
        assert self._layout is not None
        if self._starting is not None and not self._starting.done():
            return  # no worker to send a chunk to yet: _wait makes the batch here
        if not self._can_dispatch(ep.pending):
            return
        self._take_reports()  # so the queue lengths are current
        while self._can_dispatch(ep.pending):
            self._send(ep, ep.pending.popleft())

    def _send(self, ep: Epoch, number: int, made: LocalBatch | None = None) -> None:
        """Batch ``number`` into a free slot, one chunk per worker; ``made``: its first rows,
        made in this process while the workers started (copied into the slot first)."""
        assert self._layout is not None and self._mem is not None
        slot = self._slot_state.index(_FREE)
        if slot in self._unreserved:
            self._reserve_slot(slot)
        bidx, width, height, half, rows = self._batch_plan(ep, number)
        first = 0 if made is None else made.made
        todo = len(bidx) - first
        per = -(-todo // len(self._pool.handles)) if todo else 1  # one per worker
        per += per % 2 if self.pipeline.mix is not None else 0  # mixed pairs stay in a chunk
        chunks = [(r0, bidx[r0 : r0 + per]) for r0 in range(first, len(bidx), per)]
        self._slot_state[slot] = _WORK
        info = _Inflight(slot, ep.epoch, width, rows, half, len(chunks), height=height)
        if made is not None:
            views = self._layout.views(self._mem, slot, width, rows, height)
            made.copy_into(views, self._layout.field_views(self._mem, slot, width, rows, height))
            info.bad.extend(made.bad)
        self._inflight[(ep.generation, number)] = info
        for r0, cidx in chunks:
            task = Task(
                ep.generation, number, slot, ep.epoch, width, rows, r0, cidx, half, height,
                self.seed,
            )  # fmt: skip
            lost = self._pool.assign((slot, r0), task, self._generation)
            if lost:
                self._answered(lost)

    def _can_dispatch(self, pending: deque) -> bool:
        """A batch is waiting, a slot is free and fewer than ``prefetch`` are being made."""
        return bool(
            pending
            and self._pool.handles
            and _FREE in self._slot_state
            and self._slot_state.count(_WORK) < self.prefetch
        )

    def _take_reports(self) -> None:
        """Handle the reports already waiting, without blocking."""
        for wid, msg in self._pool.reports():
            self._handle(wid, msg)

    def _reserve_slot(self, slot: int) -> None:
        """``posix_fallocate`` slot ``slot`` before its first task (or wait for the thread
        reserving it: ``_startup.py``); a failure (memory ran out since the preflight) stops
        the workers and frees the ring."""
        assert self._layout is not None and self._ring is not None
        try:
            if self._ahead is not None and slot in self._ahead:
                self._ahead.wait(slot)
            else:
                _shm.reserve(self._ring, self._layout.slot_offset(slot), self._layout.slot_bytes)
            self._reserved_node(self._layout.slot_bytes)
        except BaseException:
            self._teardown()
            raise
        self._unreserved.discard(slot)

    def _wait(self, ep: Epoch, number: int) -> Batch | None:
        assert self._layout is not None and self._mem is not None
        made = self._made_here(ep, number)  # while the workers start (_startup.py)
        if made is not NOT_MADE:
            return made  # type: ignore[return-value]
        started = time.monotonic()
        key = (ep.generation, number)
        while True:
            self._dispatch(ep)
            info = self._inflight.get(key)
            if info is None:
                if _WORK not in self._slot_state:
                    raise LoaderError(
                        f"no free batch slot for batch {number}: all {len(self._slot_state)} "
                        "slots are held; call release() on retained batches"
                    )
                self._pump(_POLL_S)
                continue
            if info.error is not None:
                err, wid = info.error
                raise rebuild(err, wid)
            if info.chunks_left == 0:
                break
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                raise LoaderTimeoutError(
                    f"no batch in {self.timeout:g} s (waiting for batch {number} of epoch "
                    f"{ep.epoch}); in flight: {self._pool.in_flight()}"
                )
            self._pump(_POLL_S)
        del self._inflight[key]
        layout, mem = self._layout, self._mem
        views = compact(
            layout.views(mem, info.slot, info.width, info.rows, info.height), info.bad, info.half
        )
        fviews = compact_fields(
            layout.field_views(mem, info.slot, info.width, info.rows, info.height), info.bad
        )
        try:
            self._account(ep.epoch, info.bad)
        except BaseException:
            self._slot_state[info.slot] = _FREE
            raise
        if len(views[0]) == 0:
            self._slot_state[info.slot] = _FREE
            return None
        self._slot_state[info.slot] = _USER
        lease = SlotLease(self._free_slot, (self._ring_id, info.slot))
        return make_batch(views, fviews, ep.epoch, number, lease=lease)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for worker reports or deaths and handle them."""
        reports, lost = self._pool.wait(timeout, self._generation)
        for wid, msg in reports:
            self._handle(wid, msg)
        if lost:
            self._answered(lost)

    def _handle(self, wid: int, msg: tuple) -> None:
        status, gen, number, _row0, payload = msg[:5]
        info = self._inflight.get((gen, number))
        if info is None:
            return
        info.chunks_left -= 1
        if status == "cancelled" and gen == self._generation:
            raise LoaderError(f"worker {wid} dropped batch {number} of the live iteration")
        if status == "error" and info.error is None:
            info.error = (payload, wid)
        elif status == "done" and payload:
            info.bad.extend(payload)
        if gen != self._generation and info.chunks_left == 0:
            # abandoned iteration: the slot is free once every chunk has reported
            self._slot_state[info.slot] = _FREE
            del self._inflight[(gen, number)]

    def _answered(self, tasks: tuple[Task, ...] | list[Task]) -> None:
        """Count tasks of abandoned iterations that a dead worker left behind as answered."""
        for t in tasks:
            info = self._inflight.get((t.generation, t.number))
            if info is not None:
                info.chunks_left -= 1
                if info.chunks_left == 0:
                    self._slot_state[info.slot] = _FREE
                    del self._inflight[(t.generation, t.number)]

    def _teardown_workers(self, grace: float = JOIN_S) -> None:
        """Stop the workers (the NOTE's shutdown order); their slots are free again."""
        self._abandon_start()  # what kept a worker from starting is not this call's error
        if not self._pool.handles:
            return
        self._generation += 1
        with contextlib.suppress(Exception):
            self._set_generation()
        self._pool.stop(grace)
        self._inflight.clear()
        # slots owned by workers are free again; the consumer's and retained ones stay out
        self._slot_state = [_FREE if s is _WORK else s for s in self._slot_state]

    def _reserved_node(self, nbytes: int) -> None:
        """The node's registry learns that ``nbytes`` more of the ring are reserved."""
        if self._node_entry is not None:
            self._node_entry.add_reserved(nbytes)

    def _what(self) -> str:
        """The source, for the node's registry and the doctor."""
        src = self.source
        where = getattr(src, "path", None) or getattr(src, "root", None)
        return f"{type(src).__name__} {where}" if where else type(src).__name__

    def _teardown(self) -> None:
        self._teardown_workers()
        entry, self._node_entry = self._node_entry, None
        if entry is not None:
            entry.close()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.join()  # no reservation runs on a closed descriptor
        ring, self._ring = self._ring, None
        if ring is not None:
            ring.close()  # the memory goes with the last mapping (a batch the user kept)
        self._mem = None
        self._layout = None
        self._ring_width = None
        self._slot_state = []
        self._unreserved = set()
