"""``stoker.watch``: how long a training loop waits for data, measured inside the loop.

NOTE [ What watch measures ]
Each step of ``for batch in watch(loader): ...`` has two parts:

- *wait*: time blocked in ``next()`` on the wrapped iterator (the data pipeline is late);
- *work*: time from receiving a batch to asking for the next one (the consumer's step).

With ``sync`` (e.g. ``torch.cuda.synchronize``) the consumer's queued GPU work is waited for
just before the next batch is requested, so it counts as work and not as data wait. At the end
of each pass (iterator exhausted) a one-line report gives the data-wait share
``wait / (wait + work)``, p50/p99 of the waits and batches per second; ``.stats`` (the current
pass) and ``.epochs`` (finished passes) hold the same figures for programs.

NOTE [ Stall watchdog ]
With ``stall_timeout=T`` a daemon thread checks, a few times per ``T``, whether the loop has
been blocked in ``next()`` for ``T`` seconds. If so it prints, once per stalled step, the
Python stack of every thread of this process (``sys._current_frames``), the state of every
child process (psutil), and, for a loader that offers ``worker_pids()``, asks each worker to
print its own stack by sending it ``SIGUSR1`` (the worker has registered
``faulthandler.register(SIGUSR1, all_threads=True)``; its stack goes to its stderr). Nothing
is signalled otherwise: an unprepared process would die of ``SIGUSR1``. The watchdog never
interrupts the loop: it reports and keeps watching. The thread is stopped when the pass ends
or the loop leaves early (``break``: the generator is closed).

Keras iterates its dataset itself: ``watch(dataset).keras_callback()`` gives a callback that
measures the same two parts between ``on_train_batch_end`` and the next ``on_train_batch_begin``.

Items are passed through unchanged and in order; ``len()`` and attributes not defined here are
forwarded to the wrapped object. Per step the overhead is two ``perf_counter`` calls and one
append.

NOTE [ Per rank ]
Each pass's figures carry the process's ``rank`` and ``world_size`` (an initialised
``torch.distributed``, looked up and never imported, else ``RANK``/``WORLD_SIZE``; see
``stoker._core.system.dist_rank``), and with more than one rank the report line starts with
``rank R/W``. ``watched.gather()`` is a collective: every rank calls it at the same point and
gets every rank's figures of the last pass, in rank order (an ``all_gather_object`` of plain
numbers; without an initialised process group, its own figures only). ``watch(...,
gather=True)`` does that at the end of every finished pass, and rank 0 prints one line per
rank naming the rank that waited most: DDP steps at the pace of its slowest input.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import IO, Any, Generic, TypeVar

from stoker._core.system import dist_rank

__all__ = ["WatchStats", "Watched", "format_ranks", "format_stall_report", "gather_stats", "watch"]

T = TypeVar("T")


class _Stderr:
    """Default for ``file``: whatever ``sys.stderr`` is when a report is printed."""

    def __repr__(self) -> str:
        return "sys.stderr"


_STDERR: Any = _Stderr()


@dataclass(frozen=True)
class WatchStats:
    """Figures for one pass (or the part of it seen so far). Times in seconds."""

    epoch: int
    steps: int
    wait_s: float
    work_s: float
    elapsed_s: float
    first_wait_s: float
    wait_p50_s: float
    wait_p99_s: float
    wait_max_s: float
    stalls: int
    rank: int = 0
    world_size: int = 1

    @property
    def wait_share(self) -> float:
        """Share of the loop's time spent waiting for data, in [0, 1]."""
        total = self.wait_s + self.work_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "wait_share": self.wait_share, "batches_per_s": self.batches_per_s}

    def summary(self) -> str:
        """One line, e.g. ``epoch 0: 120 steps, data wait 42.0 % ...``."""
        verdict = (
            "input-bound: the loop waits for data"
            if self.wait_share >= 0.10
            else "compute-bound: data arrives in time"
        )
        where = f"rank {self.rank}/{self.world_size} " if self.world_size > 1 else ""
        return (
            f"{where}epoch {self.epoch}: {self.steps} steps in {self.elapsed_s:.2f} s "
            f"({self.batches_per_s:.1f} batches/s), data wait {100 * self.wait_share:.1f} % "
            f"(p50 {1e3 * self.wait_p50_s:.2f} ms, p99 {1e3 * self.wait_p99_s:.2f} ms, "
            f"first batch {1e3 * self.first_wait_s:.1f} ms)"
            + (f", {self.stalls} stall(s)" if self.stalls else "")
            + f": {verdict}"
        )


def _quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy's default), on a sorted list."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class _Pass:
    """Mutable counters of the pass in progress (owned by the iterating thread)."""

    __slots__ = (
        "epoch", "waits", "work", "start", "end", "stalls", "waiting_since", "fired", "place",
    )  # fmt: skip

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.place = dist_rank()  # (rank, world_size) when the pass begins
        self.waits = array("d")
        self.work = 0.0
        self.start = time.perf_counter()
        self.end: float | None = None
        self.stalls = 0
        self.waiting_since: float | None = None  # set while blocked in next()
        self.fired = False  # the watchdog already reported this wait

    def snapshot(self) -> WatchStats:
        waits = sorted(self.waits)
        end = self.end if self.end is not None else time.perf_counter()
        return WatchStats(
            epoch=self.epoch,
            steps=len(self.waits),
            wait_s=float(sum(self.waits)),
            work_s=self.work,
            elapsed_s=end - self.start,
            first_wait_s=self.waits[0] if self.waits else 0.0,
            wait_p50_s=_quantile(waits, 0.50),
            wait_p99_s=_quantile(waits, 0.99),
            wait_max_s=waits[-1] if waits else 0.0,
            stalls=self.stalls,
            rank=self.place[0],
            world_size=self.place[1],
        )


class Watched(Generic[T]):
    """An iterable that yields what ``iterable`` yields and measures the loop around it.

    Made by :func:`watch`; see the module docstring for what is measured.
    """

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        sync: Callable[[], object] | None = None,
        stall_timeout: float | None = None,
        report_every: int | None = None,
        file: IO[str] | None = _STDERR,  # type: ignore[assignment]
        gather: bool = False,
    ) -> None:
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"watch() needs an iterable, got {type(iterable).__name__}")
        if sync is not None and not callable(sync):
            raise TypeError(f"sync must be a callable such as torch.cuda.synchronize, got {sync!r}")
        if stall_timeout is not None and not (
            isinstance(stall_timeout, (int, float)) and stall_timeout > 0
        ):
            raise ValueError(
                f"stall_timeout must be a number of seconds > 0, got {stall_timeout!r}"
            )
        if report_every is not None and not (
            isinstance(report_every, int)
            and not isinstance(report_every, bool)
            and report_every > 0
        ):
            raise ValueError(f"report_every must be an int >= 1 (steps), got {report_every!r}")
        self.iterable = iterable
        self.sync = sync
        self.stall_timeout = None if stall_timeout is None else float(stall_timeout)
        self.report_every = report_every
        self.file = file
        self.gather_ranks = bool(gather)
        self.epochs: list[WatchStats] = []
        self._pass: _Pass | None = None

    # -- forwarding -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in {"iterable", "_pass"}:
            raise AttributeError(name)
        return getattr(self.iterable, name)

    # -- figures ----------------------------------------------------------------------------
    @property
    def stats(self) -> WatchStats | None:
        """The pass in progress, or the last finished one; ``None`` before the first step."""
        p = self._pass
        if p is not None:
            return p.snapshot()
        return self.epochs[-1] if self.epochs else None

    def _report_file(self) -> IO[str] | None:
        """Where reports go: ``file``, resolved when printing (``sys.stderr`` by default)."""
        return sys.stderr if self.file is _STDERR else self.file  # type: ignore[return-value]

    def _print(self, text: str) -> None:
        out = self._report_file()
        if out is not None:
            print(f"stoker.watch: {text}", file=out, flush=True)

    # -- the loop ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        return self._run()

    def _begin(self) -> tuple[_Pass, _Watchdog | None]:
        p = _Pass(len(self.epochs))
        self._pass = p
        dog = _Watchdog(self, p) if self.stall_timeout is not None else None
        return p, dog

    def _end(self, p: _Pass, dog: _Watchdog | None, *, finished: bool) -> None:
        if dog is not None:
            dog.stop()
        p.end = time.perf_counter()
        self._pass = None
        stats = p.snapshot()
        if stats.steps or finished:
            self.epochs.append(stats)
        if finished:
            self._print(stats.summary())
            if self.gather_ranks:
                every = gather_stats(stats)
                if stats.rank == 0 and len(every) > 1:
                    self._print(format_ranks(every))

    def gather(self) -> list[WatchStats]:
        """Every rank's figures of the current or last pass, in rank order: a collective that
        every rank calls at the same point (see NOTE [ Per rank ])."""
        stats = self.stats
        if stats is None:
            raise RuntimeError("watch: no pass yet; gather() after the loop has taken a batch")
        return gather_stats(stats)

    def _maybe_report(self, p: _Pass) -> None:
        if self.report_every is not None and len(p.waits) % self.report_every == 0:
            text = p.snapshot().summary()
            self._print(text.replace(f"epoch {p.epoch}:", f"epoch {p.epoch} so far:", 1))

    def _run(self) -> Iterator[T]:
        it = iter(self.iterable)
        p, dog = self._begin()
        waits = p.waits
        sync = self.sync
        clock = time.perf_counter
        finished = False
        try:
            t_got = p.start
            while True:
                if sync is not None:
                    sync()
                t_ask = clock()
                if waits:  # the consumer's step: from the last batch to this request
                    p.work += t_ask - t_got
                p.waiting_since = t_ask
                try:
                    item = next(it)
                except StopIteration:
                    finished = True
                    return
                finally:
                    p.waiting_since = None
                    p.fired = False
                t_got = clock()
                waits.append(t_got - t_ask)
                if self.report_every is not None:
                    self._maybe_report(p)
                yield item
        finally:
            self._end(p, dog, finished=finished)

    def keras_callback(self) -> Any:
        """A ``keras.callbacks.Callback`` measuring the same figures inside ``model.fit``.

        Keras iterates the dataset itself, so wrap nothing:
        ``w = stoker.watch(dataset); model.fit(dataset, callbacks=[w.keras_callback()])``.
        Wait is the time from the end of one training batch to the start of the next (Keras
        fetching data), work the batch itself; the watchdog and the reports work as above.
        """
        import keras

        owner = self

        class WatchCallback(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self._p: _Pass | None = None
                self._dog: _Watchdog | None = None
                self._t_end = 0.0
                self._t_begin = 0.0

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self._p, self._dog = owner._begin()
                self._p.waiting_since = self._t_end = self._p.start

            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                p = self._p
                if p is None:
                    return
                now = time.perf_counter()
                p.waits.append(now - self._t_end)
                p.waiting_since = None
                p.fired = False
                self._t_begin = now

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                p = self._p
                if p is None:
                    return
                if owner.sync is not None:
                    owner.sync()
                now = time.perf_counter()
                p.work += now - self._t_begin
                self._t_end = now
                if owner.report_every is not None:
                    owner._maybe_report(p)
                p.waiting_since = now

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                if self._p is not None:
                    self._p.waiting_since = None
                    owner._end(self._p, self._dog, finished=True)
                    self._p = self._dog = None

            def on_train_end(self, logs: Any = None) -> None:
                if self._p is not None:  # training stopped mid-epoch
                    self._p.waiting_since = None
                    owner._end(self._p, self._dog, finished=False)
                    self._p = self._dog = None

        return WatchCallback()


def watch(
    iterable: Iterable[T],
    /,
    *,
    sync: Callable[[], object] | None = None,
    stall_timeout: float | None = None,
    report_every: int | None = None,
    file: IO[str] | None = _STDERR,  # type: ignore[assignment]
    gather: bool = False,
) -> Watched[T]:
    """Wrap a training loop's data source to measure data wait per step.

    ``for x, y in stoker.watch(loader, sync=torch.cuda.synchronize, stall_timeout=60): ...``

    - ``sync``: called before each request so queued GPU work counts as the consumer's time;
    - ``stall_timeout``: seconds blocked in ``next()`` after which the stacks of every thread
      (and of each worker of a loader with ``worker_pids()``) are printed;
    - ``report_every``: also print the running figures every N steps;
    - ``file``: where reports go (default: ``sys.stderr`` when printing; ``None``: silent,
      the figures stay in ``.stats``/``.epochs``);
    - ``gather``: at the end of each pass every rank's figures are gathered over
      ``torch.distributed`` and rank 0 prints one line per rank (a collective: all ranks
      must pass ``gather=True``).

    Works with any iterable (a stoker ``Loader``, a torch ``DataLoader``, a Keras dataset, a
    generator); items, order and ``len()`` are unchanged.
    """
    return Watched(
        iterable,
        sync=sync,
        stall_timeout=stall_timeout,
        report_every=report_every,
        file=file,
        gather=gather,
    )


#: what crosses the wire between ranks: every field of WatchStats, each a plain number
_NUMBERS = tuple(f.name for f in fields(WatchStats))


def gather_stats(stats: WatchStats) -> list[WatchStats]:
    """Every rank's ``stats``, in rank order, through an initialised ``torch.distributed``
    (all ranks call it); ``[stats]`` without one. Only plain numbers cross the wire."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [stats]
    mine = {k: getattr(stats, k) for k in _NUMBERS}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    out = [WatchStats(**{k: type(getattr(stats, k))(d[k]) for k in _NUMBERS}) for d in every]
    return sorted(out, key=lambda s: s.rank)


def format_ranks(every: list[WatchStats]) -> str:
    """One line per rank (data-wait share, p99 wait, batches/s), then the rank that waited
    most."""
    lines = [f"epoch {every[0].epoch}, data wait per rank:"]
    for s in every:
        lines.append(
            f"  rank {s.rank}: {s.steps} steps, data wait {100 * s.wait_share:.1f} % "
            f"(p99 {1e3 * s.wait_p99_s:.2f} ms), {s.batches_per_s:.1f} batches/s"
        )
    worst = max(every, key=lambda s: s.wait_share)
    lines.append(f"  most waiting: rank {worst.rank} ({100 * worst.wait_share:.1f} %)")
    return "\n".join(lines)


# -- the stall watchdog ---------------------------------------------------------------------


class _Watchdog:
    def __init__(self, owner: Watched[Any], p: _Pass) -> None:
        self.owner = owner
        self.p = p
        self.timeout = float(owner.stall_timeout or 0.0)
        self.loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name="stoker-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)

    def _main(self) -> None:
        interval = min(max(self.timeout / 4.0, 0.01), 1.0)
        while not self._stop.wait(interval):
            since = self.p.waiting_since
            if since is None or self.p.fired:
                continue
            blocked = time.perf_counter() - since
            if blocked >= self.timeout:
                self.p.fired = True
                self.p.stalls += 1
                text = format_stall_report(
                    self.owner.iterable,
                    blocked_s=blocked,
                    step=len(self.p.waits),
                    epoch=self.p.epoch,
                    loop_thread=self.loop_thread,
                )
                out = self.owner._report_file()
                if out is not None:
                    with contextlib.suppress(Exception):
                        print(text, file=out, flush=True)
                _signal_workers(self.owner.iterable, out)


def _worker_pids(source: object) -> list[int]:
    """Worker pids of a loader that offers ``worker_pids()`` (and so handles SIGUSR1)."""
    fn = getattr(source, "worker_pids", None)
    if not callable(fn):
        return []
    try:
        return [int(pid) for pid in fn()]
    except Exception:  # noqa: BLE001 - a report must not fail
        return []


def _signal_workers(source: object, file: IO[str] | None) -> None:
    for pid in _worker_pids(source):
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            if file is not None:
                print(
                    f"stoker.watch: could not signal worker pid {pid}: {e}", file=file, flush=True
                )


def format_stall_report(
    source: object,
    *,
    blocked_s: float,
    step: int,
    epoch: int,
    loop_thread: int | None = None,
) -> str:
    """The watchdog's text: every thread's stack, the child processes, the loader workers."""
    names = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    lines = [
        f"stoker.watch: STALL: no batch for {blocked_s:.1f} s "
        f"(epoch {epoch}, step {step}, source {type(source).__name__}); where each thread is:"
    ]
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the watchdog itself
        t = names.get(ident)
        label = t.name if t is not None else f"thread {ident}"
        extra = " (the training loop, blocked in next())" if ident == loop_thread else ""
        daemon = " daemon" if t is not None and t.daemon else ""
        lines.append(f"--- thread {label!r}{daemon}{extra}:")
        lines.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
    pids = _worker_pids(source)
    lines.extend(_children_lines(pids))
    if pids:
        lines.append(
            f"--- loader workers {pids}: asked to print their stacks (SIGUSR1); "
            "they appear on the workers' stderr"
        )
    else:
        lines.append("--- the source offers no worker_pids(): worker stacks not requested")
    return "\n".join(lines)


def _children_lines(workers: list[int] | None = None) -> list[str]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a core dependency
        return []
    try:
        me = psutil.Process()
        kids = me.children(recursive=True)
    except psutil.Error:
        return []
    if not kids:
        return ["--- no child processes"]
    lines = [f"--- {len(kids)} child process(es):"]
    for k in kids:
        try:
            with k.oneshot():
                cmd = " ".join(k.cmdline())
                role = ""
                if workers and k.pid in workers:
                    role = " (loader worker)"
                elif "resource_tracker" in cmd:
                    role = " (multiprocessing resource tracker)"
                elif "forkserver" in cmd and k.ppid() == me.pid:
                    role = " (multiprocessing fork server)"
                cpu = k.cpu_times()
                lines.append(
                    f"    pid {k.pid} {k.name()!r}{role}: {k.status()}, {k.num_threads()} threads, "
                    f"cpu user {cpu.user:.1f} s sys {cpu.system:.1f} s"
                )
        except psutil.Error as e:
            lines.append(f"    pid {k.pid}: {type(e).__name__}")
    return lines
