"""The worker processes of a loader: start them, hand them tasks, watch them, replace and stop
them.

The pool knows processes, pipes and the tasks each worker has not answered yet. What a task
means for the batch ring (its slot, the batch's other chunks) is the loader's business: the
pool gives it the workers' reports, and the tasks a dead worker leaves behind that belong to
an abandoned iteration. The protocol is the NOTE in ``_feed.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from stoker._core.errors import WorkerDiedError
from stoker.loader._process import SERVER
from stoker.loader._worker import _THREAD_ENV, PARK, RING, Task, WorkerConfig, worker_main

if TYPE_CHECKING:
    from stoker.loader._engine import Engine

__all__ = [
    "WorkerHandle",
    "WorkerPool",
    "engine_unsupported",
    "mp_context",
    "server_booting",
    "signal_name",
    "warm_up",
]

log = logging.getLogger("stoker.loader")

JOIN_S = 2.0
# what every worker needs, imported once in the fork server so that no worker pays for it
# (the CRC32C function: the loader checks records' checksums by default; stoker._core.crc
# loads it without the crc32c package's import of its own metadata, over 100 ms), and what
# unpickling a .rec loader's worker configuration imports (the RecordIO reader behind the
# formats registry): a module left out is imported again by every worker a loader starts
# (tests/loader/test_loader_first_batch.py holds a .rec loader's configuration to that)
_PRELOAD = [
    "numpy",
    "numpy.random",
    "simplejpeg",
    "cv2",
    "stoker._core.crc",
    "stoker.formats.recordio",
    "stoker.formats.recordio.seam",
    "stoker.loader._worker",
    "stoker.transforms",
]
_NOTHING: tuple[Task, ...] = ()
# whether the loader's fork server was started by this process and has forked no worker yet
# (so it may still be importing): server_booting()
_BOOTING = False


def engine_unsupported() -> str | None:
    """Why the Linux engine cannot run here, or ``None``: it needs Linux's anonymous shared
    files (``memfd_create``), ``posix_fallocate`` and the fork server (``_engine``)."""
    missing = [
        name
        for name, ok in (
            ("memfd_create", hasattr(os, "memfd_create")),
            ("posix_fallocate", hasattr(os, "posix_fallocate")),
            (
                "the forkserver start method",
                "forkserver" in multiprocessing.get_all_start_methods(),
            ),
        )
        if not ok
    ]
    if sys.platform.startswith("linux") and not missing:
        return None
    return f"{sys.platform} lacks {', '.join(missing) or 'Linux'}"


def mp_context() -> multiprocessing.context.BaseContext:
    """forkserver (safe with threads in main, fast to start once warm) where available."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        if SERVER is not None:
            SERVER.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def warm_up() -> None:
    """Start the worker server now (it lives as long as this process), so that the first
    ``Loader`` with workers starts without paying for it. Optional."""
    global _BOOTING
    ctx = mp_context()
    if ctx.get_start_method() == "forkserver" and SERVER is not None:
        # the loader's own server (workers that skip __main__: _process); the workers of a
        # transform defined in the script come from multiprocessing's, started when needed
        if getattr(SERVER, "_forkserver_pid", 0) is None:
            _BOOTING = True
        with one_thread():
            SERVER.ensure_running()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """This process's environment says one thread for BLAS and OpenMP while a worker server
    or a spawned worker starts (on the main thread: the window is a fork and an exec), as each
    worker sets at its start (``_worker._limit_threads``), but before the interpreter imports
    numpy: a BLAS that starts a thread per core at import costs tens of ms there."""
    saved = {name: os.environ.get(name) for name in _THREAD_ENV}
    os.environ.update(dict.fromkeys(_THREAD_ENV, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def server_booting() -> bool:
    """Whether the loader's worker server was started by this process and has not forked a
    worker yet: a worker started now may wait for the server's imports (``_startup``)."""
    return _BOOTING


def _start(proc: Any) -> None:
    """``proc.start()``; if the fork server died (killed, or a failed handshake took it down),
    start a fresh one and try once more."""
    global _BOOTING
    try:
        proc.start()
        _BOOTING = False
    except (ConnectionRefusedError, FileNotFoundError, EOFError):
        import multiprocessing.forkserver as fs

        stops = [getattr(server, "_stop", None) for server in (SERVER, fs._forkserver)]
        if not all(callable(stop) for stop in stops):
            raise
        for stop in stops:
            stop()  # type: ignore[misc]
        proc.start()


def signal_name(exitcode: int | None) -> str:
    """How a worker ended, for a message: 'was killed by SIGKILL (...)', 'exited with code 3'."""
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


@dataclass
class WorkerHandle:
    wid: int
    proc: Any
    conn: Any
    tasks: deque = field(default_factory=deque)  # Tasks sent and not yet answered, in order
    queued: int = 0  # samples in those tasks
    per_sample: float = 0.0  # seconds a sample takes this worker, lately (0: not known yet)
    wrote: set = field(default_factory=set)  # (slot, first row) of the chunks sent to it
    lifeline: Any = None  # main's end of the portable engine's lifeline (never written)
    answered: int = 0  # reports received from it
    # summed from its reports (the accounting of docs/loader.md): thread CPU seconds and
    # minor page faults inside fill_chunk, and CPU seconds mapping ring rows before it
    fill_cpu: float = 0.0
    fill_faults: int = 0
    map_cpu: float = 0.0

    def close(self) -> None:
        """Close main's ends of its pipes (the worker sees EOF on both)."""
        for conn in (self.conn, self.lifeline):
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def push(self, task: Task) -> None:
        self.tasks.append(task)
        self.queued += len(task.indices)

    def pop(self, msg: tuple) -> None:
        """The oldest task was answered by report ``msg`` (the NOTE in ``_feed.py``)."""
        cpu, faults, mapped = msg[6]
        self.fill_cpu += cpu
        self.fill_faults += faults
        self.map_cpu += mapped
        self.answered += 1
        seconds = msg[5] if msg[0] == "done" else None  # how long it spent on the task
        if not self.tasks:
            return
        n = len(self.tasks.popleft().indices)
        self.queued -= n
        if seconds is not None and n:
            s = seconds / n
            self.per_sample = s if not self.per_sample else 0.7 * self.per_sample + 0.3 * s


class WorkerPool:
    """The worker processes of one loader (none until :meth:`start`, none after :meth:`stop`).

    ``on_death``: ``"raise"`` (``WorkerDiedError``) or ``"respawn"`` (a new worker takes the
    dead one's place and gets its unanswered tasks of the live iteration again).
    """

    def __init__(self, on_death: str, engine: Engine) -> None:
        self.on_death = on_death
        self.engine = engine
        self.handles: list[WorkerHandle] = []
        self.respawns = 0
        self._deaths: dict[int, int] = {}  # global index -> worker deaths while processing it
        self._config: WorkerConfig | None = None  # worker_id replaced per worker
        self._control: np.ndarray | None = None  # the ring's control block (RingLayout.control)
        self._poller: Any = None  # select.poll over the workers' pipes and sentinels
        self._fds: dict[int, tuple[bool, WorkerHandle]] = {}  # fd -> (is its pipe, worker)
        self._chunk_counter = 0

    # ------------------------------------------------------------------ life
    def start(self, config: WorkerConfig, control: np.ndarray, count: int) -> None:
        """Start ``count`` workers of ``config``. On a failure the workers already started
        stay in ``handles`` (for :meth:`stop`) and the error propagates."""
        self._config, self._control = config, control
        self.engine.check(config)
        for wid in range(count):
            self.handles.append(self._spawn(wid))
        self._poller = None

    def _spawn(self, wid: int) -> WorkerHandle:
        """Start worker ``wid`` (its config is pickled once; the ring is already allocated)."""
        assert self._config is not None
        cfg = dataclasses.replace(self._config, worker_id=wid)
        engine = self.engine
        ctx = engine.context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        keep, give = engine.lifeline(ctx)
        args = (cfg, child_conn) if give is None else (cfg, child_conn, give)
        proc = engine.process(
            ctx, target=worker_main, args=args, name=f"stoker-worker-{wid}", data=(cfg,)
        )
        handle = WorkerHandle(wid, proc, parent_conn, lifeline=keep)
        try:
            with one_thread() if engine.portable else contextlib.nullcontext():
                _start(proc)
        except BaseException:
            handle.close()
            raise
        finally:
            child_conn.close()
            if give is not None:
                give.close()
        return handle

    def park(self) -> None:
        """Make the idle workers close their source (see ``_keep``): none has a task in
        flight. A worker whose pipe is gone is found dead at the next use."""
        for w in self.handles:
            with contextlib.suppress(Exception):
                w.conn.send(PARK)
        self._control = None
        self._poller = None

    def adopt(
        self, config: WorkerConfig, control: np.ndarray, on_death: str, *, new_ring: bool
    ) -> None:
        """Serve another loader: its configuration (the same key: ``_keep.pool_key``) and the
        ring its workers map already, or (``new_ring``) a new one, whose descriptor goes to
        each worker over its pipe (``SCM_RIGHTS``; the portable engine's ring: its name)."""
        from multiprocessing.reduction import send_handle

        self._config, self._control, self.on_death = config, control, on_death
        self.respawns = 0
        self._deaths.clear()
        self._poller = None
        if not new_ring:
            return
        ring = config.ring
        named = getattr(ring, "name", None)  # _named.NamedRing: mapped by name
        for w in self.handles:
            w.wrote.clear()
            if named is not None:
                w.conn.send((RING, config.layout, ring.size, named))
                continue
            w.conn.send((RING, config.layout, ring.size))
            send_handle(w.conn, ring.fileno(), w.proc.pid)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.handles if w.proc.pid is not None]

    def stop(self, grace: float = JOIN_S) -> None:
        """``None`` to each worker, join up to ``grace`` s, SIGTERM, join, SIGKILL, join; close
        the pipes. The caller bumps the generation first, so workers drop their chunks."""
        workers, self.handles = self.handles, []
        self._poller = None
        self._control = None
        for w in workers:
            with contextlib.suppress(Exception):
                w.conn.send(None)
        _join(workers, grace)
        _signal_alive(workers, "terminate")
        _join(workers, JOIN_S)
        _signal_alive(workers, "kill")
        _join(workers, 5 * JOIN_S)  # SIGKILL cannot be ignored: only reaping is left
        for w in workers:
            w.close()
            if w.proc.exitcode is not None:
                with contextlib.suppress(Exception):
                    w.proc.close()  # releases the sentinel fd

    # ------------------------------------------------------------------ tasks
    def assign(self, rows: tuple[int, int], task: Task, generation: int) -> tuple[Task, ...]:
        """Send ``task`` (rows ``(slot, first row)``) to the worker that will be free first.
        Returns the abandoned tasks of a worker found dead on the way (see :meth:`wait`)."""
        w = self._least_loaded(rows, len(task.indices))
        w.wrote.add(rows)
        w.push(task)
        try:
            w.conn.send(task)
        except (BrokenPipeError, OSError):
            # the worker died since the last wait; the task is already in its queue
            return self._lost(w, generation)
        return _NOTHING

    def _least_loaded(self, rows: tuple[int, int], n: int) -> WorkerHandle:
        """The worker that will be free first: samples queued times its recent seconds per
        sample (ties, as at the start: in turn). A worker that falls behind (preempted by other
        processes, slower images) gets fewer new chunks instead of holding back every batch
        while the others wait for a free slot.

        Within half a chunk of the first to be free, a worker that has written these ``rows``
        before is preferred: a process maps a page of the ring on its first write there, so
        chunks that changed hands at every tie would have every worker map the whole ring."""
        ws = self.handles
        nw = len(ws)
        start = self._chunk_counter % nw
        self._chunk_counter += 1
        known = [w.per_sample for w in ws if w.per_sample]
        default = sum(known) / len(known) if known else 1.0  # a new worker: as the others

        def cost(w: WorkerHandle) -> float:
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

    # ------------------------------------------------------------------ reports
    def _poll(self, timeout: float) -> list[tuple[bool, WorkerHandle]]:
        """``(is the pipe, worker)`` for each worker pipe with a message (or EOF) and each
        worker sentinel that fired, waiting up to ``timeout`` s. One ``poll`` object for the
        life of a worker set: a selector built per wait costs more than the rest of a batch's
        bookkeeping. Where there is no ``select.poll`` (Windows), ``multiprocessing``'s own
        ``wait`` over the same pipes and sentinels."""
        if not hasattr(select, "poll"):
            from multiprocessing.connection import wait

            objs = {
                o: (k, w)
                for w in self.handles
                for k, o in ((True, w.conn), (False, w.proc.sentinel))
            }
            return [objs[o] for o in wait(list(objs), max(0.0, timeout))]
        if self._poller is None:
            self._poller = select.poll()
            self._fds = {}
            for w in self.handles:
                for is_conn, fd in ((True, w.conn.fileno()), (False, w.proc.sentinel)):
                    self._poller.register(fd, select.POLLIN)
                    self._fds[fd] = (is_conn, w)
        try:
            events = self._poller.poll(max(0, int(timeout * 1000)))
        except InterruptedError:  # pragma: no cover - retried by Python since PEP 475
            return []
        return [self._fds[fd] for fd, _ev in events if fd in self._fds]

    @staticmethod
    def _receive(w: WorkerHandle) -> tuple | None:
        """One report from ``w``'s ready pipe (its task leaves ``w``'s queue); None when the
        pipe is closed (the worker is gone)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return None
        w.pop(msg)
        return msg

    def reports(self) -> list[tuple[int, tuple]]:
        """The reports already waiting, as ``(worker id, report)``, without blocking (a dead
        worker is left for :meth:`wait`, which also watches the process sentinels)."""
        out: list[tuple[int, tuple]] = []
        while True:
            took = False
            for is_conn, w in self._poll(0):
                if is_conn:
                    msg = self._receive(w)
                    if msg is not None:
                        out.append((w.wid, msg))
                        took = True
            if not took:
                return out

    def wait(self, timeout: float, generation: int) -> tuple[list[tuple[int, tuple]], list[Task]]:
        """Wait up to ``timeout`` s for reports or deaths: the reports (one per ready pipe: a
        pipe with more is ready again at once), and the tasks that dead workers leave behind
        from iterations older than ``generation`` (to count as answered). A dead worker is
        replaced (``respawn``) or reported as ``WorkerDiedError``."""
        reports: list[tuple[int, tuple]] = []
        dead: list[WorkerHandle] = []
        for is_conn, w in self._poll(timeout):
            msg = self._receive(w) if is_conn else None
            if msg is not None:
                reports.append((w.wid, msg))
            elif w not in dead:
                dead.append(w)
        lost: list[Task] = []
        for w in dead:
            with contextlib.suppress(EOFError, OSError):
                while w.conn.poll():
                    msg = w.conn.recv()
                    w.pop(msg)
                    reports.append((w.wid, msg))
            lost.extend(self._lost(w, generation))
        return reports, lost

    # ------------------------------------------------------------------ deaths
    def _lost(self, w: WorkerHandle, generation: int) -> tuple[Task, ...]:
        if self.on_death == "respawn":
            return self._respawn(w, generation)
        self.raise_dead(w)

    def _respawn(self, w: WorkerHandle, generation: int) -> tuple[Task, ...]:
        """Replace dead worker ``w`` and re-send its unanswered tasks of ``generation``; return
        the others. A sample that was being processed at two deaths is poison: that is reported
        as WorkerDiedError instead."""
        w.proc.join(0.5)
        code = w.proc.exitcode
        culprit = self._in_progress(w)
        if not w.answered and culprit is None and code is not None and code > 0:
            # it exited on its own before any sample: at its start (a script without the
            # __main__ guard under spawn, an import error); another would do the same
            self.raise_dead(w, prefix="at its start ")
        if culprit is not None:
            self._deaths[culprit] = self._deaths.get(culprit, 0) + 1
            if self._deaths[culprit] >= 2:
                self.raise_dead(w, prefix="again ")
        keys = self._keys_of(w)
        tasks = list(w.tasks)
        w.close()
        if code is not None:
            with contextlib.suppress(Exception):
                w.proc.close()
        if self._control is not None:
            self._control[1 + w.wid] = -1
        new = self._spawn(w.wid)
        self.handles[self.handles.index(w)] = new
        self._poller = None
        self.respawns += 1
        log.warning(
            "worker %d %s while processing %s (keys in flight %s); started a new one (%d so far)",
            w.wid,
            signal_name(code),
            "nothing" if culprit is None else f"position {culprit}",
            keys,
            self.respawns,
        )
        lost = []
        for t in tasks:
            if t.generation == generation:
                new.push(t)
                new.conn.send(t)
            else:
                lost.append(t)
        return tuple(lost)

    def _in_progress(self, w: WorkerHandle) -> int | None:
        """The global index worker ``w`` was processing (from the control block), if any."""
        if self._control is None:
            return None
        gi = int(self._control[1 + w.wid])
        return gi if gi >= 0 and w.tasks else None

    def raise_dead(self, w: WorkerHandle, prefix: str = "") -> NoReturn:
        """Raise ``WorkerDiedError`` naming ``w``, how it ended, its sample and its keys."""
        w.proc.join(0.5)
        code = w.proc.exitcode
        culprit = self._in_progress(w)
        what = ""
        if culprit is not None and self._config is not None:
            try:
                what = f"{self._config.source.describe(culprit)}; "
            except Exception:  # noqa: BLE001
                what = f"position {culprit}; "
        raise WorkerDiedError(
            f"worker {w.wid} (pid {w.proc.pid}) {signal_name(code)} {prefix}while processing "
            f"{what}its keys in flight: {self._keys_of(w)}"
        )

    def _keys_of(self, w: WorkerHandle, limit: int = 16) -> list:
        out: list = []
        if self._config is None:
            return out
        key = self._config.source.key
        for task in w.tasks:
            for gi in task.indices.tolist():
                if len(out) >= limit:
                    out.append("...")
                    return out
                try:
                    out.append(key(gi))
                except Exception:  # noqa: BLE001
                    out.append(f"position {gi}")
        return out

    def in_flight(self) -> str:
        """The keys each worker has in flight, for a timeout's message."""
        parts = [
            f"worker {w.wid} (pid {w.proc.pid}): keys {self._keys_of(w)}"
            for w in self.handles
            if w.tasks
        ]
        return "; ".join(parts) or "nothing"


def _join(workers: list[WorkerHandle], seconds: float) -> None:
    """Join every worker within one shared deadline of ``seconds``."""
    deadline = time.monotonic() + seconds
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))


def _signal_alive(workers: list[WorkerHandle], method: str) -> None:
    """``terminate`` or ``kill`` each worker still alive."""
    for w in workers:
        if w.proc.is_alive():
            with contextlib.suppress(Exception):
                getattr(w.proc, method)()
