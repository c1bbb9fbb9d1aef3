"""The loader engine: worker processes that decode and augment into a shared-memory batch ring.

NOTE [ Loader ring and shutdown protocol ]

Buffers. One shared-memory segment per loader, ``/dev/shm/stoker_<pid>_<starttime>_<rand>``,
reserved with ``posix_fallocate`` (a full ``/dev/shm`` fails there, never as a SIGBUS later),
after a preflight that compares its size with the free space. The control block is reserved
before the workers start, slot 0 while they boot, each other slot just before its first task,
while the workers fill the earlier ones. No task names an unreserved slot. Before its first
write to a range of rows, a worker maps those pages in one ``MADV_POPULATE_WRITE`` call.
Layout (see ``_ring.py``): a 64-byte control block (int64 *generation*: the live iteration) and
``prefetch + 2`` slots; each slot holds ``batch_size`` rows of images (pipeline dtype and
layout, sized for the widest batch width), labels, record keys and global indices; the control
block also holds, per worker, the global index it is processing (so a death names its sample). Batches
being built: at most ``prefetch``; the one the consumer holds: 1; a spare for a batch kept by
``Batch.retain()`` (the GPU prefetcher holds one while its copy runs): 1, reserved only when a
retained batch first leaves no other slot free.

Messages. Each worker has its own duplex pipe. Main -> worker: a :class:`Task` (generation,
batch number, slot, epoch, width, first row, the indices of the chunk), or ``None`` to stop.
Worker -> main: ``(status, generation, number, row0, payload, seconds)``, status ``done``
(payload: the skipped samples), ``error`` (type, message, traceback text, key, index) or
``cancelled``; ``seconds``: the chunk's wall time in the worker. A batch is split into one
chunk per worker; each chunk goes to the worker that will be free first (samples queued times
its recent seconds per sample; ties in turn), so two chunks of a batch may go to one worker.
Within half a chunk of the first to be free, a worker that wrote those rows of that slot
before is preferred: a process maps a ring page on its first write there, and chunks that
changed hands at every tie had every worker map the whole ring. The first batch arrives after
``batch_size / workers`` samples per worker, and a worker that falls behind (preempted,
slower images) gets less of the next batches instead of leaving the others idle while they
wait for its share to free a slot. Main waits on one ``select.poll`` over the workers' pipes
and sentinels. Nothing large is pickled: images never leave the segment; a task's indices
travel as raw int64 bytes.

Ownership of a slot: FREE -> (main dispatches) WORK: the workers named in its chunks write
their rows, nobody else touches it -> (all chunks reported) READY: main only -> (yielded) USER:
the consumer reads it until it asks for the next batch -> FREE, unless ``retain()``ed, then
RETAINED until ``release()``. Main dispatches while a slot is FREE and fewer than ``prefetch``
are WORK (a third batch in flight with 2 workers made no epoch faster, measured). A slot whose
chunks belong to an abandoned generation stays WORK until every chunk has reported (workers
notice the new generation in the control block before each sample and stop early), so a
worker never writes into a slot main has handed out again.

Order and randomness. Main decides everything: batch ``b`` of epoch ``e`` is
``sampler.indices(e)[b*n:(b+1)*n]``; sample ``i`` is augmented with
``sample_rng(seed, e, i)``; batches are yielded by number whatever worker finishes first.
So the output is the same for any worker count, and a resumed run is exact.

One sample in a worker (``_worker.fill_chunk``; the main process runs the same code when
``workers=0``): read the record (label from its header), decode, re-key the worker's one
generator (``SampleRngs.at(i)`` gives ``sample_rng``'s stream), ``Pipeline.fill_row``
(transforms, shape check, write into the row; a trailing uint8 ``Normalize`` writes its table
lookups straight into the row in the batch layout), then label, key and index.

Shutdown order (``close()``, also from ``__exit__``, ``__del__``, the atexit hook, and after any
error while waiting): bump the generation (workers drop their current chunk at the next
sample); send ``None`` to each worker; join them for up to 2 s (0.2 s after an error, when a
worker may be hung); ``terminate()`` (SIGTERM) the stragglers, join 2 s; ``kill()`` what is
left, join; close the pipes; unlink the segment (a
batch view kept by the user stays valid: the memory is unmapped when the last view dies);
close a source the loader opened (an in-memory array source unlinks its segment).

- Normal end of an epoch: workers stay up for the next epoch (persistent).
- ``break`` out of the loop: the generation is bumped; in-flight slots come back as their
  chunks report; workers stay up. The next ``for`` continues the same epoch where it stopped.
- Exception in a worker: re-raised in main as a subclass of ``WorkerError`` *and* of the
  original type when possible, with the worker id, record key, index and traceback text;
  workers are shut down (the next iteration starts new ones).
- Ctrl-C in main (workers ignore SIGINT): ``KeyboardInterrupt`` propagates; workers and the
  segment are torn down on the way out (generator cleanup, ``with``, or the atexit hook).
- SIGKILL/segfault/OOM-kill of a worker: its process sentinel wakes main's wait at once;
  ``WorkerDiedError`` names the worker, pid, signal, the sample it was processing and its
  in-flight keys. With ``on_worker_death="respawn"`` a new worker takes the dead one's place
  and gets its unanswered chunks again (rows are rewritten in place, so nothing is lost or
  duplicated); a sample that was being processed at two deaths raises instead.
- SIGKILL of main: workers die with it (PR_SET_PDEATHSIG on their parent, plus a 0.5 s
  watchdog thread on main's pid and start time; a blocked ``recv`` also sees EOF); the segment
  stays in ``/dev/shm`` until the next loader start (or ``stoker cleanup``) sweeps segments
  whose owner is dead.

Timeouts. Main waits on pipes and process sentinels with a 0.25 s poll, so a death is seen at
once and a stall is checked 4 times a second; ``timeout=T`` raises ``LoaderTimeoutError`` when
the batch being waited for has not arrived T seconds after main started waiting for it, naming
the keys still in flight per worker. Joins on shutdown are bounded (about 9 s worst case,
which needs a worker that ignores SIGTERM).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib
import json
import logging
import multiprocessing
import os
import select
import signal
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import (
    IncompatibleStateError,
    LoaderError,
    LoaderTimeoutError,
    SpecError,
    TooManyBadSamplesError,
    WorkerDiedError,
    WorkerError,
)
from stoker._core.seeding import fresh_seed
from stoker._core.specs import ArraySpec
from stoker.loader import _shm
from stoker.loader._process import worker_process
from stoker.loader._ring import RingLayout
from stoker.loader._worker import Task, WorkerConfig, fill_chunk, worker_main
from stoker.loader.sources import Source, as_source
from stoker.pipeline import DecodeOptions, Pipeline
from stoker.sampling import EpochOrder, Sampler

__all__ = ["Batch", "Loader", "warm_up"]

log = logging.getLogger("stoker.loader")

STATE_VERSION = 1
_POLL_S = 0.25
_JOIN_S = 2.0
_MAX_STATE_BYTES = 1 << 20
_MAX_COUNTER = 1 << 53
_MAX_REJECTS_KEPT = 10_000
_ON_ERROR = ("raise", "skip")
_PRELOAD = [
    "numpy",
    "numpy.random",
    "simplejpeg",
    "cv2",
    "stoker.formats.recordio",
    "stoker.loader._worker",
    "stoker.transforms",
]

_live: weakref.WeakSet[Loader] = weakref.WeakSet()


def _close_all() -> None:
    for loader in list(_live):
        with contextlib.suppress(Exception):
            loader.close()
    _shm.unlink_owned()


atexit.register(_close_all)


def _mp_context() -> multiprocessing.context.BaseContext:
    """forkserver (safe with threads in main, fast to start once warm) where available."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def warm_up() -> None:
    """Start the worker server now (it lives as long as this process), so that the first
    ``Loader`` with workers starts without paying for it. Optional."""
    ctx = _mp_context()
    if ctx.get_start_method() == "forkserver":
        import multiprocessing.forkserver

        multiprocessing.forkserver.ensure_running()


def _start(proc: Any) -> None:
    """``proc.start()``; if the fork server died (killed, or a failed handshake took it down),
    start a fresh one and try once more."""
    try:
        proc.start()
    except (ConnectionRefusedError, FileNotFoundError, EOFError):
        import multiprocessing.forkserver as fs

        stop = getattr(fs._forkserver, "_stop", None)
        if stop is None:
            raise
        stop()
        proc.start()


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        extra = ""
        if -exitcode == signal.SIGKILL:
            extra = " (the kernel's OOM killer does this when memory runs out: try fewer workers, a smaller prefetch or batch_size)"
        return f"was killed by {name}{extra}"
    return (
        f"exited with code {exitcode} (its traceback, if any, is on stderr; a script that "
        'starts loader workers needs an `if __name__ == "__main__":` guard)'
    )


_error_classes: dict[type, type] = {}


def _worker_error(info: dict, worker_id: int | None) -> WorkerError:
    """A WorkerError that is also an instance of the worker's exception type when possible."""
    exc_type: type | None = None
    try:
        obj: Any = importlib.import_module(info["module"])
        for part in info["qualname"].split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type) and issubclass(obj, Exception):
            exc_type = obj
    except Exception:  # noqa: BLE001
        exc_type = None
    who = "main process (workers=0)" if worker_id is None else f"worker {worker_id}"
    msg = f"{who} failed on {info['where']}: {info['qualname']}: {info['message']}"
    kwargs = dict(
        exc_type=info["qualname"],
        worker_id=worker_id,
        key=info["key"],
        index=info["index"],
        remote_traceback=info["traceback"],
    )
    cls: type = WorkerError
    if exc_type is not None and not issubclass(exc_type, WorkerError):
        cls = _error_classes.get(exc_type) or WorkerError
        if cls is WorkerError:
            try:
                cls = type(
                    f"Worker{exc_type.__name__}",
                    (WorkerError, exc_type),
                    {
                        "__init__": _init_worker_error,
                        "__str__": WorkerError.__str__,
                        "__module__": __name__,
                    },
                )
                cls(msg, **kwargs)
            except Exception:  # noqa: BLE001 - e.g. a layout conflict between the bases
                cls = WorkerError
            _error_classes[exc_type] = cls
    try:
        return cls(msg, **kwargs)
    except Exception:  # noqa: BLE001
        return WorkerError(msg, **kwargs)


def _init_worker_error(self: Any, message: str, **kwargs: Any) -> None:
    """``__init__`` of the WorkerError/original-type hybrids: the original type's own
    ``__init__`` may want other arguments, so only the message goes to ``Exception``."""
    self.exc_type = kwargs.get("exc_type", "Exception")
    self.worker_id = kwargs.get("worker_id")
    self.key = kwargs.get("key")
    self.index = kwargs.get("index")
    self.remote_traceback = kwargs.get("remote_traceback", "")
    Exception.__init__(self, message)


def _distributed_info() -> tuple[int, int]:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001
        pass
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def _check_int(name: str, v: Any, lo: int, hi: int = _MAX_COUNTER) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return int(v)


class Batch:
    """One batch: ``images`` (a view of a shared-memory slot), ``labels``, ``keys``
    (record keys), ``indices`` (global positions), ``epoch``, ``number``.

    Unpacks as ``images, labels``. The views are valid until the next batch is requested,
    unless ``retain()`` was called; then until ``release()``.
    """

    __slots__ = (
        "epoch",
        "images",
        "indices",
        "keys",
        "labels",
        "number",
        "_owner",
        "_slot",
        "_retained",
        "__weakref__",
    )

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        keys: np.ndarray,
        indices: np.ndarray,
        epoch: int,
        number: int,
        owner: Loader | None = None,
        slot: tuple[int, int] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.keys = keys
        self.indices = indices
        self.epoch = epoch
        self.number = number
        self._owner = owner
        self._slot = slot
        self._retained = False

    def __iter__(self):
        yield self.images
        yield self.labels

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        return (
            f"Batch(epoch={self.epoch}, number={self.number}, images={self.images.shape} "
            f"{self.images.dtype}, labels={self.labels.shape} {self.labels.dtype})"
        )

    def retain(self) -> Batch:
        """Keep this batch's slot out of the ring until ``release()``."""
        self._retained = True
        return self

    def release(self) -> None:
        """Give the slot back to the ring (idempotent)."""
        owner, slot = self._owner, self._slot
        self._owner = self._slot = None
        self._retained = False
        if owner is not None and slot is not None:
            owner._free_slot(slot)


@dataclass
class _Inflight:
    slot: int
    epoch: int
    width: int | None
    rows: int
    half: int
    chunks_left: int
    bad: list = field(default_factory=list)
    error: tuple[dict, int] | None = None


@dataclass
class _WorkerHandle:
    wid: int
    proc: Any
    conn: Any
    tasks: deque = field(default_factory=deque)  # Tasks sent and not yet answered, in order
    queued: int = 0  # samples in those tasks
    per_sample: float = 0.0  # seconds a sample takes this worker, lately (0: not known yet)
    wrote: set = field(default_factory=set)  # (slot, first row) of the chunks sent to it

    def push(self, task: Task) -> None:
        self.tasks.append(task)
        self.queued += len(task.indices)

    def pop(self, seconds: float | None = None) -> None:
        """The oldest task was answered; ``seconds``: how long the worker spent on it."""
        if not self.tasks:
            return
        n = len(self.tasks.popleft().indices)
        self.queued -= n
        if seconds is not None and n:
            s = seconds / n
            self.per_sample = s if not self.per_sample else 0.7 * self.per_sample + 0.3 * s


class Loader:
    """Batches from ``source``, decoded and augmented by worker processes into shared memory.

    See ``docs/loader.md`` for the knobs and the NOTE in this module for the protocol.
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        transforms: Any = None,
        pair_with: Any = None,
        sampler: Sampler | None = None,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        workers: int | None = None,
        prefetch: int = 2,
        timeout: float | None = None,
        on_error: str = "raise",
        max_bad_fraction: float = 0.001,
        layout: str = "NHWC",
        rank: int | None = None,
        world_size: int | None = None,
        decode: DecodeOptions | None = None,
        on_worker_death: str = "raise",
    ) -> None:
        self._closed = True  # until construction succeeded
        self._owner_pid = os.getpid()
        self._workers: list[_WorkerHandle] = []
        self._poller: Any = None  # select.poll over the workers' pipes and sentinels
        self._fds: dict[int, tuple[bool, _WorkerHandle]] = {}  # fd -> (is its pipe, worker)
        self._slot_state: list[str] = []
        self._unreserved: set[int] = set()  # slots not yet posix_fallocate'd
        self._ring_width: int | None = None
        self._layout: RingLayout | None = None
        self._inflight: dict[tuple[int, int], _Inflight] = {}
        self._chunk_counter = 0
        self._ring_id = 0
        self._generation = 0
        self._segment: _shm.Segment | None = None
        self._mem: np.ndarray | None = None
        self._source: Source | None = None
        self._owns_source = False
        bs = _check_int("batch_size", batch_size, 1, 1 << 24)
        if pair_with is not None and bs % 2:
            raise ValueError(f"with pair_with, batch_size must be even, got {bs}")
        if workers is None:
            try:
                workers = min(8, len(os.sched_getaffinity(0)))
            except AttributeError:  # pragma: no cover
                workers = min(8, os.cpu_count() or 1)
        self.workers = _check_int("workers", workers, 0, 1024)
        self.prefetch = _check_int("prefetch", prefetch, 1, 1024)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
            if not timeout > 0:
                raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.timeout = timeout
        if on_worker_death not in ("raise", "respawn"):
            raise ValueError(
                f"on_worker_death must be 'raise' or 'respawn', got {on_worker_death!r}"
            )
        self.on_worker_death = on_worker_death
        self._respawns = 0
        self._deaths: dict[int, int] = {}  # global index -> worker deaths while processing it
        if on_error not in _ON_ERROR:
            raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
        self.on_error = on_error
        if isinstance(max_bad_fraction, bool) or not isinstance(max_bad_fraction, (int, float)):
            raise TypeError(f"max_bad_fraction must be a number, got {max_bad_fraction!r}")
        if not 0.0 <= max_bad_fraction <= 1.0:
            raise ValueError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
        self.max_bad_fraction = float(max_bad_fraction)
        if sampler is not None and not isinstance(sampler, Sampler):
            raise TypeError(
                f"sampler must be a stoker.sampling.Sampler, got {type(sampler).__name__}"
            )
        self.batch_size = bs
        self.drop_last = bool(drop_last)

        _shm.cleanup_stale()
        src, owned = as_source(source)
        self._source, self._owns_source = src, owned
        try:
            self.pipeline = Pipeline(
                src.sample_spec,
                transforms=transforms,
                pair_with=pair_with,
                layout=layout,
                decode=decode or DecodeOptions(),
                variable_width=sampler is not None and _has_widths(sampler),
            )
            self._seed_given = seed is not None
            self.seed = fresh_seed() if seed is None else _check_int("seed", seed, 0, (1 << 63) - 1)
            if sampler is None:
                if rank is None or world_size is None:
                    r, w = _distributed_info()
                    rank = r if rank is None else rank
                    world_size = w if world_size is None else world_size
                self._sampler_args: dict[str, Any] = dict(
                    shuffle=bool(shuffle),
                    rank=rank,
                    world_size=world_size,
                    drop_last=self.drop_last,
                )
                self.sampler: Sampler = EpochOrder(len(src), seed=self.seed, **self._sampler_args)
                self._own_sampler = True
            else:
                self.sampler = sampler
                self._own_sampler = False
            self._label_spec = src.label_spec
        except BaseException:
            if owned:
                src.close()
            raise
        self._per_batch = bs // 2 if pair_with is not None else bs
        self._epoch = 0
        self._next = 0
        self._generation = 0
        self._bad_epoch = 0
        self._bad_total = 0
        self.rejects: list[dict] = []
        self._warned = 0
        self._closed = False
        _live.add(self)
        if self.workers:
            warm_up()  # the worker server boots while the caller builds its model

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        n = len(self.sampler)
        per = self._per_batch
        return n // per if self.drop_last else -(-n // per)

    @property
    def output_spec(self) -> ArraySpec:
        """One batch row, layout applied (``None`` width when the sampler sets it per batch)."""
        if self.pipeline.sample_spec.shape[1] is None:
            shape: list[int | None] = list(self.pipeline.row_shape(1))
            shape[-1 if self.pipeline.layout == "NCHW" else 1] = None
            return ArraySpec(tuple(shape), self.pipeline.dtype)
        return self.pipeline.output_spec()

    @property
    def source(self) -> Source:
        if self._source is None:
            raise LoaderError("this loader has no source")
        return self._source

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers (or is delivering)."""
        self._normalise_position()
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch at the next iteration."""
        self._epoch = _check_int("epoch", epoch, 0)
        self._next = 0
        self._bad_epoch = 0
        self._cancel()

    @property
    def stats(self) -> dict:
        return {
            "bad_samples": self._bad_total,
            "bad_samples_this_epoch": self._bad_epoch,
            "rejects": len(self.rejects),
            "respawns": self._respawns,
        }

    def __iter__(self):
        if self._closed:
            raise LoaderError("this loader is closed")
        return self._run()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first batch and after close).

        Each worker prints its Python stack on stderr when sent SIGUSR1 and then carries on:
        ``stoker.watch``'s stall watchdog uses this to show where a stuck worker is.
        """
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def close(self) -> None:
        """Stop the workers, remove the shared memory; idempotent."""
        if os.getpid() != getattr(self, "_owner_pid", os.getpid()):
            return  # a forked copy of this object owns nothing
        self._closed = True
        if hasattr(self, "_slot_state"):
            self._teardown()
        if getattr(self, "_owns_source", False) and self._source is not None:
            self._owns_source = False
            with contextlib.suppress(Exception):
                self._source.close()
        _live.discard(self)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """JSON-safe position: resume with ``load_state_dict`` (any worker count)."""
        self._normalise_position()
        return {
            "version": STATE_VERSION,
            "dataset": self.source.fingerprint(),
            "sampler": self.sampler.fingerprint(),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "pair": self.pipeline.pair_with is not None,
            "epoch": self._epoch,
            "batch": self._next,
            "bad": {"epoch": self._bad_epoch, "total": self._bad_total},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; refuses a state of another dataset, seed or configuration."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        try:
            size = len(json.dumps(state))
        except (TypeError, ValueError) as e:
            raise ValueError(f"state must be JSON-safe: {e}") from e
        if size > _MAX_STATE_BYTES:
            raise ValueError(f"state is {size} bytes of JSON; a loader state is under 1 MiB")
        expected = {
            "version",
            "dataset",
            "sampler",
            "seed",
            "batch_size",
            "pair",
            "epoch",
            "batch",
            "bad",
        }
        extra = sorted(set(state) - expected)
        if extra:
            raise ValueError(f"state has unknown fields {extra}")
        missing = sorted(expected - set(state))
        if missing:
            raise ValueError(f"state lacks fields {missing}")
        version = _check_int("version", state["version"], 0, 1 << 31)
        if version != STATE_VERSION:
            raise IncompatibleStateError(
                f"version: state has version {version}, this stoker reads version {STATE_VERSION}"
            )
        seed = _check_int("seed", state["seed"], 0, (1 << 63) - 1)
        epoch = _check_int("epoch", state["epoch"], 0)
        batch = _check_int("batch", state["batch"], 0, 1 << 40)
        bs = _check_int("batch_size", state["batch_size"], 1, 1 << 24)
        bad = state["bad"]
        if not isinstance(bad, dict) or set(bad) != {"epoch", "total"}:
            raise ValueError("bad must be a dict with the fields 'epoch' and 'total'")
        bad_epoch = _check_int("bad.epoch", bad["epoch"], 0)
        bad_total = _check_int("bad.total", bad["total"], 0)
        if not isinstance(state["pair"], bool):
            raise TypeError(f"pair must be a bool, got {type(state['pair']).__name__}")
        for name in ("dataset", "sampler"):
            if not isinstance(state[name], dict):
                raise TypeError(f"{name} must be a dict, got {type(state[name]).__name__}")
        mine = self.source.fingerprint()
        if state["dataset"] != mine:
            raise IncompatibleStateError(
                f"dataset: the state is for {_describe_fp(state['dataset'])}; this loader reads "
                f"{_describe_fp(mine)}"
            )
        if bs != self.batch_size:
            raise IncompatibleStateError(
                f"batch_size: the state was saved with batch_size={bs}, this loader has {self.batch_size}"
            )
        if state["pair"] != (self.pipeline.pair_with is not None):
            raise IncompatibleStateError("pair: the state and this loader differ in pair_with")
        if seed != self.seed and self._seed_given:
            raise IncompatibleStateError(
                f"seed: the state was saved with seed={seed}, this loader has seed={self.seed}"
            )
        sampler = self.sampler
        if self._own_sampler and seed != self.seed:
            sampler = EpochOrder(len(self.source), seed=seed, **self._sampler_args)
        if state["sampler"] != sampler.fingerprint():
            raise IncompatibleStateError(
                f"sampler: the state was saved with {state['sampler']}, this loader has "
                f"{sampler.fingerprint()}"
            )
        if batch > len(self):
            raise ValueError(f"batch must be in [0, {len(self)}], got {batch}")
        self._cancel()
        self.seed = seed
        self.sampler = sampler
        self._epoch, self._next = epoch, batch
        self._bad_epoch, self._bad_total = bad_epoch, bad_total

    # ------------------------------------------------------------------ planning
    def _normalise_position(self) -> None:
        if self._next >= len(self) and len(self) > 0:
            self._epoch += 1
            self._next = 0
            self._bad_epoch = 0

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        idx = np.asarray(self.sampler.indices(epoch), dtype=np.int64)
        widths = self.sampler.batch_widths(epoch, self._per_batch)
        if widths is not None:
            widths = np.asarray(widths, dtype=np.int64)
            if len(widths) < len(self) or (len(widths) and widths.min() < 1):
                raise ValueError(
                    f"sampler.batch_widths gave {len(widths)} widths (min "
                    f"{widths.min() if len(widths) else '-'}) for {len(self)} batches"
                )
        elif self.pipeline.sample_spec.shape[1] is None:
            raise SpecError(
                "the transforms leave the width open but the sampler gives no batch_widths"
            )
        return idx, widths

    def _batch_indices(self, idx: np.ndarray, number: int) -> np.ndarray:
        per = self._per_batch
        return idx[number * per : (number + 1) * per]

    # ------------------------------------------------------------------ iteration
    def _run(self):
        self._normalise_position()
        epoch, start = self._epoch, self._next
        idx, widths = self._plan(epoch)
        if self.workers:
            self._ensure_running(None if widths is None else int(widths.max(initial=1)))
        self._cancel()  # a new iteration supersedes any earlier one
        gen = self._generation
        nb = len(self)
        held: Batch | None = None
        try:
            if self.workers == 0:
                for number in range(start, nb):
                    batch = self._make_local(gen, epoch, number, idx, widths)
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
                    self._next = number + 1
                    if batch is not None:
                        yield batch
            else:
                pending = deque(range(start, nb))
                for number in range(start, nb):
                    self._dispatch(gen, epoch, idx, widths, pending)
                    batch = self._wait(gen, epoch, number, idx, widths, pending)
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
                    if held is not None and not held._retained:
                        held.release()
                    held = None
                    self._next = number + 1
                    if batch is None:
                        continue
                    held = batch
                    yield batch
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
            if gen == self._generation:
                self._epoch, self._next, self._bad_epoch = epoch + 1, 0, 0
        except GeneratorExit:
            if gen == self._generation:
                self._cancel()
            raise
        except BaseException:
            if gen == self._generation and not self._closed:
                self._teardown_workers(grace=0.2)  # a worker may be hung: do not wait long
            raise
        finally:
            if held is not None and not held._retained:
                held.release()

    def _account(self, epoch: int, bad: list) -> None:
        """Count skipped samples of a delivered batch; trip the breaker."""
        if not bad:
            return
        for _row, index, key, reason in bad:
            self._bad_epoch += 1
            self._bad_total += 1
            if len(self.rejects) < _MAX_REJECTS_KEPT:
                self.rejects.append({"epoch": epoch, "index": index, "key": key, "reason": reason})
            self._warned += 1
            w = self._warned
            if w <= 10 or (w <= 1000 and w % 100 == 0) or w % 10_000 == 0:
                log.warning(
                    "skipped sample key %s (position %s): %s [%d skipped so far]",
                    key,
                    index,
                    reason,
                    w,
                )
        ceiling = self.max_bad_fraction * len(self.sampler)
        if self._bad_epoch > ceiling:
            last = bad[-1]
            raise TooManyBadSamplesError(
                f"{self._bad_epoch} bad samples in epoch {epoch} exceed max_bad_fraction="
                f"{self.max_bad_fraction} of {len(self.sampler)} samples (last: key {last[2]}: "
                f"{last[3]}); see loader.rejects"
            )

    def _make_local(
        self, gen: int, epoch: int, number: int, idx: np.ndarray, widths: np.ndarray | None
    ) -> Batch | None:
        """workers=0: build batch ``number`` in this process, into fresh arrays."""
        bidx = self._batch_indices(idx, number)
        width = None if widths is None else int(widths[number])
        half = len(bidx) if self.pipeline.pair_with is not None else 0
        rows = len(bidx) * (2 if half else 1)
        images = np.empty((rows, *self.pipeline.row_shape(width)), dtype=self.pipeline.dtype)
        labels = np.empty((rows, *_dims(self._label_spec)), dtype=self._label_spec.dtype)
        keys = np.empty(rows, dtype=np.int64)
        indices = np.empty(rows, dtype=np.int64)
        task = Task(gen, number, -1, epoch, width, rows, 0, bidx, half)
        status, payload = fill_chunk(
            task,
            source=self.source,
            pipeline=self.pipeline,
            seed=self.seed,
            views=(images, labels, keys, indices),
            on_error=self.on_error,
        )
        if status == "error":
            raise _worker_error(payload, None)
        views = _compact((images, labels, keys, indices), payload, half, len(bidx))
        self._account(epoch, payload)
        if len(views[0]) == 0:
            return None
        return Batch(*views, epoch=epoch, number=number)

    # ------------------------------------------------------------------ workers and ring
    def _ensure_running(self, max_width: int | None) -> None:
        if self._layout is not None and max_width is not None:
            if self._ring_width is None or max_width > self._ring_width:
                self._teardown()  # a wider epoch than the ring was made for: rebuild it
        if self._layout is None:
            slots = self.prefetch + 2
            layout = RingLayout(
                pipeline=self.pipeline,
                rows=self.batch_size,
                max_width=max_width,
                label_shape=_dims(self._label_spec),
                label_dtype=self._label_spec.dtype,
                slots=slots,
                workers=self.workers,
            )
            _shm.preflight(layout.total_bytes, slots=slots, what="batch slots")
            if getattr(self.source, "encoded", True) is False and hasattr(self.source, "share"):
                self.source.share()  # type: ignore[attr-defined]
            # Only the control block is reserved before the workers start, and slot 0 while
            # they boot; every other slot when it is first dispatched (_dispatch), while the
            # workers make the batches before it. Reserving costs about 0.2 us per KiB (8 ms
            # for a 38 MB slot), so the first batch no longer waits for the whole ring. Nothing
            # touches an unreserved slot: workers write only the slot a task names.
            seg, mapping = _shm.create_segment(layout.total_bytes, reserved=False)
            self._segment = seg
            self._mem = mapping.array()
            self._layout = layout
            self._ring_width = max_width
            self._slot_state = ["free"] * slots
            self._unreserved = set(range(slots))
            self._ring_id += 1
            try:
                _shm.reserve(seg, 0, layout.control_bytes)
                control = layout.control(self._mem)
                control[0] = self._generation
                control[1:] = -1
                self._start_workers()  # none run without a ring (_teardown stops them first)
                self._reserve_slot(0)
            except BaseException:
                self._teardown()
                raise
        elif not self._workers:
            self._start_workers()

    def _spawn(self, wid: int) -> _WorkerHandle:
        """Start worker ``wid`` (its config is pickled once; the ring is already allocated)."""
        if self._layout is None or self._segment is None:
            raise LoaderError("the batch ring is not allocated")
        ctx = _mp_context()
        me = os.getpid()
        cfg = WorkerConfig(
            worker_id=wid,
            source=self.source,
            pipeline=self.pipeline,
            seed=self.seed,
            layout=self._layout,
            segment=self._segment,
            on_error=self.on_error,
            main_pid=me,
            main_start=_shm.process_start_time(me),
        )
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = worker_process(
            ctx,
            target=worker_main,
            args=(cfg, child_conn),
            name=f"stoker-worker-{wid}",
            data=(cfg,),
        )
        try:
            _start(proc)
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        return _WorkerHandle(wid, proc, parent_conn)

    def _start_workers(self) -> None:
        handles: list[_WorkerHandle] = []
        try:
            for wid in range(self.workers):
                handles.append(self._spawn(wid))
        except BaseException as e:
            self._workers = handles
            self._teardown_workers(grace=0.2)
            if isinstance(e, OSError) and e.errno == errno.EMFILE:
                import resource

                soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                raise LoaderError(
                    f"cannot start loader worker {len(handles)} of {self.workers}: too many open "
                    f"files (the limit, ulimit -n, is {soft}); raise it or use fewer workers"
                ) from e
            raise
        self._workers = handles
        self._poller = None

    def _set_generation(self) -> None:
        if self._mem is not None and self._layout is not None:
            self._layout.control(self._mem)[0] = self._generation

    def _cancel(self) -> None:
        """Abandon the live iteration: workers stop their chunks at the next sample."""
        self._generation += 1
        self._set_generation()
        for key, info in list(self._inflight.items()):
            if info.chunks_left == 0:  # finished but never delivered: free now
                self._slot_state[info.slot] = "free"
                del self._inflight[key]

    def _free_slot(self, slot: tuple[int, int]) -> None:
        ring, s = slot
        if ring == self._ring_id and s < len(self._slot_state) and self._slot_state[s] == "user":
            self._slot_state[s] = "free"

    def _dispatch(
        self, gen: int, epoch: int, idx: np.ndarray, widths: np.ndarray | None, pending: deque
    ) -> None:
        """Send chunks of the next pending batches while free slots last and fewer than
        ``prefetch`` batches are being made. (A third batch in flight with 2 workers made no
        epoch faster, measured, and cost a slot: 38 MB mapped by every process for 256 float
        112x112 images. The spare slot is used, and reserved, only while the consumer has a
        batch retained.)"""
        assert self._layout is not None
        if not self._can_dispatch(pending):
            return
        self._take_reports()  # so the queue lengths are current
        while self._can_dispatch(pending):
            slot = self._slot_state.index("free")
            if slot in self._unreserved:
                self._reserve_slot(slot)
            number = pending.popleft()
            bidx = self._batch_indices(idx, number)
            width = None if widths is None else int(widths[number])
            pair = self.pipeline.pair_with is not None
            half = len(bidx) if pair else 0
            rows = len(bidx) * (2 if pair else 1)
            # one chunk per worker (two per worker balanced no better, measured, and woke the
            # main process twice as often)
            per = -(-len(bidx) // len(self._workers)) if len(bidx) else 1
            chunks = [(r0, bidx[r0 : r0 + per]) for r0 in range(0, len(bidx), per)]
            self._slot_state[slot] = "work"
            info = _Inflight(slot, epoch, width, rows, half, len(chunks))
            self._inflight[(gen, number)] = info
            for r0, cidx in chunks:
                w = self._least_loaded((slot, r0), len(cidx))
                w.wrote.add((slot, r0))
                task = Task(gen, number, slot, epoch, width, rows, r0, cidx, half)
                w.push(task)
                try:
                    w.conn.send(task)
                except (BrokenPipeError, OSError):
                    # the worker died since the last pump; the task is already in its queue
                    if self.on_worker_death == "respawn":
                        self._respawn(w)  # re-sends its queue, this task included
                    else:
                        self._raise_dead(w)

    def _can_dispatch(self, pending: deque) -> bool:
        """A batch is waiting, a slot is free and fewer than ``prefetch`` are being made."""
        return bool(
            pending
            and self._workers
            and "free" in self._slot_state
            and self._slot_state.count("work") < self.prefetch
        )

    def _poll(self, timeout: float) -> list[tuple[bool, _WorkerHandle]]:
        """``(is the pipe, worker)`` for each worker pipe with a message (or EOF) and each
        worker sentinel that fired, waiting up to ``timeout`` s. One ``poll`` object for the
        life of a worker set: building a selector per wait cost the main process more than
        the rest of a batch's bookkeeping."""
        if self._poller is None:
            self._poller = select.poll()
            self._fds = {}
            for w in self._workers:
                for is_conn, fd in ((True, w.conn.fileno()), (False, w.proc.sentinel)):
                    self._poller.register(fd, select.POLLIN)
                    self._fds[fd] = (is_conn, w)
        try:
            events = self._poller.poll(max(0, int(timeout * 1000)))
        except InterruptedError:  # pragma: no cover - retried by Python since PEP 475
            return []
        return [self._fds[fd] for fd, _ev in events if fd in self._fds]

    def _receive(self, w: _WorkerHandle) -> bool:
        """Handle one message from ``w``'s ready pipe; False when the pipe is closed (the
        worker is gone)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return False
        self._handle(w, msg)
        return True

    def _take_reports(self) -> None:
        """Handle the reports already waiting, without blocking (a dead worker is left for
        ``_pump``, which also watches the process sentinels)."""
        while True:
            took = False
            for is_conn, w in self._poll(0):
                if is_conn and self._receive(w):
                    took = True
            if not took:
                return

    def _least_loaded(self, rows: tuple[int, int], n: int) -> _WorkerHandle:
        """The worker that will be free first: samples queued times its recent seconds per
        sample (ties, as at the start: in turn). A worker that falls behind (preempted by other
        processes, slower images) gets fewer new chunks instead of holding back every batch
        while the others wait for a free slot.

        Within half a chunk of the first to be free, a worker that has written these ``rows``
        (slot, first row) before is preferred: its pages of them are mapped already. Each
        process maps a page of the ring on its first write there (about 1.2 us per 4 KiB page,
        11 ms per 38 MB slot), so chunks that change hands at every tie would have every worker
        map the whole ring in the first epoch."""
        ws = self._workers
        nw = len(ws)
        start = self._chunk_counter % nw
        self._chunk_counter += 1
        known = [w.per_sample for w in ws if w.per_sample]
        default = sum(known) / len(known) if known else 1.0  # a new worker: as the others

        def cost(w: _WorkerHandle) -> float:
            return w.queued * (w.per_sample or default)

        # a stable sort of the workers in turn: equal costs keep their turn order
        ranked = sorted((ws[(start + j) % nw] for j in range(nw)), key=cost)
        best = ranked[0]
        if rows not in best.wrote:
            limit = cost(best) + 0.5 * n * default
            for w in ranked[1:]:
                if cost(w) > limit:
                    break
                if rows in w.wrote:
                    return w
        return best

    def _reserve_slot(self, slot: int) -> None:
        """``posix_fallocate`` slot ``slot`` before its first task; a failure (``/dev/shm``
        filled up since the preflight) stops the workers and removes the segment."""
        assert self._layout is not None and self._segment is not None
        try:
            _shm.reserve(self._segment, self._layout.slot_offset(slot), self._layout.slot_bytes)
        except BaseException:
            self._teardown()
            raise
        self._unreserved.discard(slot)

    def _wait(
        self,
        gen: int,
        epoch: int,
        number: int,
        idx: np.ndarray,
        widths: np.ndarray | None,
        pending: deque,
    ) -> Batch | None:
        assert self._layout is not None and self._mem is not None
        started = time.monotonic()
        key = (gen, number)
        while True:
            self._dispatch(gen, epoch, idx, widths, pending)
            info = self._inflight.get(key)
            if info is None:
                if "work" not in self._slot_state:
                    raise LoaderError(
                        f"no free batch slot for batch {number}: all {len(self._slot_state)} "
                        "slots are held; call release() on retained batches"
                    )
                self._pump(_POLL_S)
                continue
            if info.error is not None:
                err, wid = info.error
                raise _worker_error(err, wid)
            if info.chunks_left == 0:
                break
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                raise LoaderTimeoutError(
                    f"no batch in {self.timeout:g} s (waiting for batch {number} of epoch "
                    f"{epoch}); in flight: {self._inflight_desc()}"
                )
            self._pump(_POLL_S)
        del self._inflight[key]
        images, labels, keys, indices = self._layout.views(
            self._mem, info.slot, info.width, info.rows
        )
        views = _compact(
            (images, labels, keys, indices),
            info.bad,
            info.half,
            info.rows // (2 if info.half else 1),
        )
        try:
            self._account(epoch, info.bad)
        except BaseException:
            self._slot_state[info.slot] = "free"
            raise
        if len(views[0]) == 0:
            self._slot_state[info.slot] = "free"
            return None
        self._slot_state[info.slot] = "user"
        return Batch(
            *views, epoch=epoch, number=number, owner=self, slot=(self._ring_id, info.slot)
        )

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for worker messages or deaths and handle them (one message
        per ready pipe: a pipe with more is ready again at once)."""
        dead: list[_WorkerHandle] = []
        for is_conn, w in self._poll(timeout):
            if (not is_conn or not self._receive(w)) and w not in dead:
                dead.append(w)
        for w in dead:
            with contextlib.suppress(EOFError, OSError):
                while w.conn.poll():
                    self._handle(w, w.conn.recv())
            if self.on_worker_death == "respawn":
                self._respawn(w)
            else:
                self._raise_dead(w)

    def _respawn(self, w: _WorkerHandle) -> None:
        """Replace dead worker ``w`` and re-send its unanswered chunks. A sample that was being
        processed at two deaths is poison: that is reported as WorkerDiedError instead."""
        w.proc.join(0.5)
        code = w.proc.exitcode
        culprit = self._in_progress(w)
        if culprit is not None:
            self._deaths[culprit] = self._deaths.get(culprit, 0) + 1
            if self._deaths[culprit] >= 2:
                self._raise_dead(w, prefix="again ")
        keys = self._keys_of(w)
        tasks = list(w.tasks)
        with contextlib.suppress(Exception):
            w.conn.close()
        if code is not None:
            with contextlib.suppress(Exception):
                w.proc.close()
        if self._mem is not None and self._layout is not None:
            self._layout.control(self._mem)[1 + w.wid] = -1
        new = self._spawn(w.wid)
        self._workers[self._workers.index(w)] = new
        self._poller = None
        self._respawns += 1
        log.warning(
            "worker %d %s while processing %s (keys in flight %s); started a new one (%d so far)",
            w.wid,
            _signal_name(code),
            "nothing" if culprit is None else f"position {culprit}",
            keys,
            self._respawns,
        )
        for t in tasks:
            if t.generation == self._generation:
                new.push(t)
                new.conn.send(t)
                continue
            info = self._inflight.get((t.generation, t.number))  # abandoned: count as answered
            if info is not None:
                info.chunks_left -= 1
                if info.chunks_left == 0:
                    self._slot_state[info.slot] = "free"
                    del self._inflight[(t.generation, t.number)]

    def _handle(self, w: _WorkerHandle, msg: tuple) -> None:
        status, gen, number, _row0, payload, seconds = msg
        w.pop(seconds if status == "done" else None)
        info = self._inflight.get((gen, number))
        if info is None:
            return
        info.chunks_left -= 1
        if status == "cancelled" and gen == self._generation:
            raise LoaderError(f"worker {w.wid} dropped batch {number} of the live iteration")
        if status == "error" and info.error is None:
            info.error = (payload, w.wid)
        elif status == "done" and payload:
            info.bad.extend(payload)
        if gen != self._generation and info.chunks_left == 0:
            # abandoned iteration: the slot is free once every chunk has reported
            self._slot_state[info.slot] = "free"
            del self._inflight[(gen, number)]

    def _in_progress(self, w: _WorkerHandle) -> int | None:
        """The global index worker ``w`` was processing (from the control block), if any."""
        if self._mem is None or self._layout is None:
            return None
        gi = int(self._layout.control(self._mem)[1 + w.wid])
        return gi if gi >= 0 and w.tasks else None

    def _raise_dead(self, w: _WorkerHandle, prefix: str = "") -> None:
        w.proc.join(0.5)
        code = w.proc.exitcode
        culprit = self._in_progress(w)
        what = ""
        if culprit is not None:
            try:
                what = f"{self.source.describe(culprit)}; "
            except Exception:  # noqa: BLE001
                what = f"position {culprit}; "
        raise WorkerDiedError(
            f"worker {w.wid} (pid {w.proc.pid}) {_signal_name(code)} {prefix}while processing "
            f"{what}its keys in flight: {self._keys_of(w)}"
        )

    def _keys_of(self, w: _WorkerHandle, limit: int = 16) -> list:
        out: list = []
        for task in w.tasks:
            for gi in task.indices.tolist():
                if len(out) >= limit:
                    out.append("...")
                    return out
                try:
                    out.append(self.source.key(gi))
                except Exception:  # noqa: BLE001
                    out.append(f"position {gi}")
        return out

    def _inflight_desc(self) -> str:
        parts = [
            f"worker {w.wid} (pid {w.proc.pid}): keys {self._keys_of(w)}"
            for w in self._workers
            if w.tasks
        ]
        return "; ".join(parts) or "nothing"

    def _teardown_workers(self, grace: float = _JOIN_S) -> None:
        """Stop the workers: ``None``, join up to ``grace`` s, SIGTERM, join, SIGKILL, join."""
        workers, self._workers = self._workers, []
        self._poller = None
        if not workers:
            return
        self._generation += 1
        with contextlib.suppress(Exception):
            self._set_generation()
        for w in workers:
            with contextlib.suppress(Exception):
                w.conn.send(None)
        deadline = time.monotonic() + grace
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.proc.is_alive():
                with contextlib.suppress(Exception):
                    w.proc.terminate()
        deadline = time.monotonic() + _JOIN_S
        for w in workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.proc.is_alive():
                with contextlib.suppress(Exception):
                    w.proc.kill()
                w.proc.join(5 * _JOIN_S)  # SIGKILL cannot be ignored: only reaping is left
        for w in workers:
            with contextlib.suppress(Exception):
                w.conn.close()
            if w.proc.exitcode is not None:
                with contextlib.suppress(Exception):
                    w.proc.close()  # releases the sentinel fd
        self._inflight.clear()
        # slots owned by workers are free again; the consumer's and retained ones stay out
        self._slot_state = ["free" if s == "work" else s for s in self._slot_state]

    def _teardown(self) -> None:
        self._teardown_workers()
        seg, self._segment = self._segment, None
        if seg is not None:
            seg.unlink()
        self._mem = None
        self._layout = None
        self._ring_width = None
        self._slot_state = []
        self._unreserved = set()


def _dims(spec: ArraySpec) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape if d is not None)


def _has_widths(sampler: Sampler) -> bool:
    return type(sampler).batch_widths is not Sampler.batch_widths


def _describe_fp(fp: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in fp.items())


def _compact(
    views: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    bad: list,
    half: int,
    n_src: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Drop the rows of skipped samples, keeping order (and the pair_with halves aligned)."""
    if not bad:
        return views
    bad_rows = {row for row, *_ in bad}
    good = [r for r in range(n_src) if r not in bad_rows]
    order = good + [r + half for r in good] if half else good
    k = len(order)
    out = []
    for v in views:
        v[:k] = v[order]
        out.append(v[:k])
    return out[0], out[1], out[2], out[3]
