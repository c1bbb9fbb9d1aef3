"""``stoker.Loader`` run on SOURCE at one worker count: samples/s once the ring has drained,
start-up time, the CPU time of the consuming process, and what its workers look like.

What the doctor needs of a :class:`stoker.Loader`: ``slots`` (its ring's batch slots),
``start_method`` (how its workers were started) and ``worker_pids()`` (their process ids).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker.loader import Loader

__all__ = ["PREFETCH", "LoaderRun", "estimated_slots", "loader_source", "measure_loader"]

#: the ``prefetch`` the doctor runs the loader with (the loader's default)
PREFETCH = 2


def estimated_slots(prefetch: int = PREFETCH) -> int:
    """The loader's ring size without building one: ``prefetch`` batches being made, one held
    by the consumer and one spare for a retained batch (what ``Loader.slots`` gives)."""
    return prefetch + 2


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

    @property
    def main_cpu_per_sample_s(self) -> float:
        return self.main_cpu_s / self.samples if self.samples else 0.0

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def loader_source(path: str) -> tuple[Any, bool]:
    """The loader's own source object, opened once for all the worker counts (a folder is
    scanned once), and whether the caller closes it; the path itself when that is not
    possible (the loader built from the path then raises the clear error)."""
    try:
        from stoker.loader import as_source

        return as_source(path)
    except Exception:  # noqa: BLE001 - the Loader built from the path raises the clear error
        return path, False


def measure_loader(
    source: Any,
    *,
    workers: int,
    batch_size: int,
    transforms: Any,
    seconds: float,
    warmup_batches: int | None = None,
) -> LoaderRun:
    """Run ``stoker.Loader`` with ``workers`` workers; samples/s after the ring drained.

    The first ``2 * workers + 2`` batches are not counted: they include process start-up and
    the batches prefetched while it ran.
    """
    from stoker.loader import Loader

    warm = warmup_batches if warmup_batches is not None else 2 * workers + 2
    t_start = time.perf_counter()
    with Loader(
        source,
        batch_size=batch_size,
        transforms=transforms,
        workers=workers,
        prefetch=PREFETCH,
        shuffle=True,
        seed=0,
    ) as loader:
        window = _Window(warm, seconds, batch_size)
        window.run(loader)
        t_end = time.perf_counter()
        main_cpu = time.process_time() - window.p0 if window.t0 is not None else 0.0
        slots = loader.slots
        method = loader.start_method
    if window.t0 is None:
        raise RuntimeError(
            f"the loader gave only {window.got} batches; need more than {warm} to measure"
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
    )


class _Window:
    """The measured window of one loader run: it opens after ``warm`` batches and closes
    ``seconds`` later (after at least three batches)."""

    def __init__(self, warm: int, seconds: float, batch_size: int) -> None:
        self.warm, self.seconds, self.batch_size = warm, seconds, batch_size
        self.got = 0
        self.samples = 0
        self.t0: float | None = None
        self.t_first: float | None = None
        self.p0 = 0.0
        self.threads: tuple[int, ...] = ()

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
        if self.t_first is None:
            self.t_first = clock()
        if self.got == self.warm:
            self.threads = _worker_threads(loader.worker_pids())
            self.p0 = time.process_time()
            self.t0 = clock()
            return False
        if self.t0 is None:
            return False
        self.samples += len(batch.images)
        return clock() >= self.t0 + self.seconds and self.samples >= self.batch_size * 3


def _worker_threads(pids: list[int]) -> tuple[int, ...]:
    """The live thread count of each worker process."""
    import psutil

    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(int(psutil.Process(pid).num_threads()))
    return tuple(out)
