"""``stoker.Loader`` run on SOURCE at one worker count: samples/s once the ring has drained,
start-up time, the CPU time of the consuming process, what its workers look like, how much of
the cores other processes took meanwhile, and the samples it had to skip.

The loader runs with ``on_error="skip"`` and no ceiling on bad samples: a corrupt file must not
stop the measurement. The samples skipped are kept (key, where, reason) for the report, which
names them as a finding of their own; the loader's per-sample warnings are held back meanwhile.

What the doctor needs of a :class:`stoker.Loader`: ``slots`` (its ring's batch slots),
``start_method`` (how its workers were started), ``worker_pids()`` (their process ids),
``rejects`` (the samples skipped) and ``source.describe(position)`` (a sample's name).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.quiet import quiet_logger
from stoker.doctor.measure.load import Load, LoadMeter
from stoker.doctor.measure.timing import Spread, spread_of

if TYPE_CHECKING:
    from stoker.loader import Loader

__all__ = [
    "PREFETCH",
    "LoaderRun",
    "TooFewBatches",
    "estimated_slots",
    "loader_source",
    "measure_loader",
]

#: the ``prefetch`` the doctor runs the loader with (the loader's default)
PREFETCH = 2


def estimated_slots(prefetch: int = PREFETCH) -> int:
    """The loader's ring size without building one: ``prefetch`` batches being made, one held
    by the consumer and one spare for a retained batch (what ``Loader.slots`` gives)."""
    return prefetch + 2


class TooFewBatches(RuntimeError):
    """The loader gave too few batches to measure; ``skipped`` holds the samples it skipped
    (often the reason: every sample failed)."""

    def __init__(self, message: str, skipped: tuple[dict[str, Any], ...]) -> None:
        super().__init__(message)
        self.skipped = skipped


@dataclass(frozen=True)
class LoaderRun:
    """One measured run of the loader at ``workers`` workers."""

    workers: int
    samples: int
    seconds: float
    startup_s: float
    worker_threads: tuple[int, ...] = ()
    start_method: str | None = None
    main_cpu_s: float = 0.0  # CPU time of this (the consuming) process over the window
    slots: int = estimated_slots()
    load: Load | None = None  # what other processes took of the cores over the window
    skipped: tuple[dict[str, Any], ...] = ()  # {index, key, where, reason} per skipped sample
    seen: int = 0  # samples the run went through, warm-up and skipped ones included
    #: seconds per sample over rounds of batches in the window: median and interval
    spread: Spread | None = None
    engine: str | None = None  # the loader's engine ("linux" or "portable"; None: no workers)
    per_set: tuple[int, ...] = ()  # a mixture's samples in the window, set by set

    @property
    def main_cpu_per_sample_s(self) -> float:
        return self.main_cpu_s / self.samples if self.samples else 0.0

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate_interval(self) -> tuple[float, float]:
        """``(lo, hi)`` samples/s from the rounds' interval (the rate itself twice without)."""
        sp = self.spread
        if sp is None or sp.lo_s <= 0:
            return (self.rate, self.rate)
        return (1.0 / sp.hi_s, 1.0 / sp.lo_s)


def loader_source(path: Any, remote: Any = None, weights: Any = None) -> tuple[Any, bool]:
    """The loader's own source object, opened once for all the worker counts (a folder is
    scanned once), and whether the caller closes it; the path itself when that is not
    possible (the loader built from the path then raises the clear error). ``remote``: how a
    set's URL is reached and cached (``RemoteOptions``); a list of sets: their mixture at
    ``weights``."""
    try:
        from stoker.loader import as_source, open_source

        if isinstance(path, list):
            return open_source(path, remote, weights, None, None, None)
        return as_source(path, remote=remote)
    except Exception:  # noqa: BLE001 - the Loader built from the path raises the clear error
        return path, False


def measure_loader(
    source: Any,
    *,
    workers: int,
    batch_size: int,
    transforms: Any,
    seconds: float,
    cores: int = 1,
    max_seconds: float | None = None,
    deadline: float = math.inf,
) -> LoaderRun:
    """Run ``stoker.Loader`` with ``workers`` workers; samples/s after the ring drained.

    The first ``2 * workers + 2`` batches are not counted: they include process start-up and
    the batches prefetched while it ran. The window lasts ``seconds``, then up to
    ``max_seconds`` until the interval of its rounds of batches is tight; it closes at
    ``deadline`` (``time.perf_counter``) whatever it has. ``cores``: the usable cores, for the
    load figures.
    """
    from stoker.loader import Loader

    warm = 2 * workers + 2
    t_start = time.perf_counter()
    with (
        quiet_logger("stoker.loader"),  # the report lists the skipped samples
        Loader(
            source,
            batch_size=batch_size,
            transforms=transforms,
            workers=workers,
            prefetch=PREFETCH,
            shuffle=True,
            seed=0,
            on_error="skip",
            max_bad_fraction=1.0,
        ) as loader,
    ):
        meter = LoadMeter(loader.worker_pids, cores)
        window = _Window(warm, seconds, batch_size, meter, max_seconds or seconds)
        window.deadline = deadline
        window.run(loader)
        t_end = time.perf_counter()
        main_cpu = time.process_time() - window.p0 if window.t0 is not None else 0.0
        load = window.meter.stop() if window.t0 is not None else None
        slots = loader.slots
        method = loader.start_method
        engine = loader.engine if workers else None
        skipped = tuple(_skipped(loader))
    if window.t0 is None or not window.samples:
        why = ""
        if skipped:
            first = skipped[0]
            why = (
                f" (it skipped {len(skipped)} sample(s) that failed; first "
                f"{first['where']}: {first['reason']})"
            )
        raise TooFewBatches(
            f"the loader gave only {window.got} batches; need more than {warm} to measure{why}",
            skipped,
        )
    startup = (window.t_first or t_end) - t_start
    return LoaderRun(
        workers,
        window.samples,
        t_end - window.t0,
        startup,
        window.threads,
        method,
        main_cpu,
        slots,
        load,
        skipped,
        window.seen + len(skipped),
        spread_of(window.rounds),
        engine,
        tuple(np.bincount(np.concatenate(window.sets)).tolist()) if window.sets else (),
    )


def _skipped(loader: Loader) -> list[dict[str, Any]]:
    """The samples the run skipped, each named as the loader's source names it."""
    out = []
    for r in loader.rejects:
        where = f"position {r['index']}"
        with contextlib.suppress(Exception):
            where = loader.source.describe(int(r["index"]))
        out.append({"index": r["index"], "key": r["key"], "where": where, "reason": r["reason"]})
    return out


#: a round of the window: at least this many batches and this many seconds
_ROUND_BATCHES, _ROUND_S = 4, 0.02


class _Window:
    """The measured window of one loader run: it opens after ``warm`` batches and closes
    ``seconds`` later (after at least three batches), or, while the interval of its rounds is
    not tight, up to ``max_seconds`` later."""

    deadline = math.inf  # it closes then, whatever it has

    def __init__(
        self, warm: int, seconds: float, batch_size: int, meter: LoadMeter, max_seconds: float
    ) -> None:
        self.warm, self.seconds, self.batch_size = warm, seconds, batch_size
        self.max_seconds = max(seconds, max_seconds)
        self.meter = meter
        self.rounds: list[float] = []  # seconds per sample, round by round
        self._r0, self._rn, self._rb = 0.0, 0, 0
        self.got = 0
        self.seen = 0  # samples delivered, warm-up included
        self.samples = 0
        self.t0: float | None = None
        self.t_first: float | None = None
        self.p0 = 0.0
        self.threads: tuple[int, ...] = ()
        self.sets: list[np.ndarray] = []  # a mixture's batch.source, batch by batch

    def run(self, loader: Loader) -> None:
        """Iterate (epoch after epoch) until the window closes or an epoch gives nothing."""
        while True:
            progressed = False
            for batch in loader:
                progressed = True
                if self._take(loader, batch):
                    return
            if not progressed:
                return

    def _take(self, loader: Loader, batch: Any) -> bool:
        """Count one batch; True when the window has closed."""
        clock = time.perf_counter
        self.got += 1
        self.seen += len(batch.images)
        if self.t_first is None:
            self.t_first = clock()
        if clock() >= self.deadline:
            return True
        if self.got == self.warm:
            self.threads = _worker_threads(loader.worker_pids())
            self.meter.start()
            self.p0 = time.process_time()
            self.t0 = self._r0 = clock()
            return False
        if self.t0 is None:
            return False
        self.samples += len(batch.images)
        if getattr(batch, "source", None) is not None:
            self.sets.append(batch.source.copy())
        now = clock()
        self._rn += len(batch.images)
        self._rb += 1
        if self._rb >= _ROUND_BATCHES and now - self._r0 >= _ROUND_S:
            self.rounds.append((now - self._r0) / self._rn)
            self._r0, self._rn, self._rb = now, 0, 0
        if now < self.t0 + self.seconds or self.samples < self.batch_size * 3:
            return False
        if now >= self.t0 + self.max_seconds:
            return True
        got = spread_of(self.rounds)
        return got is not None and got.tight


def _worker_threads(pids: list[int]) -> tuple[int, ...]:
    """The live thread count of each worker process."""
    import psutil

    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(int(psutil.Process(pid).num_threads()))
    return tuple(out)
