"""Timing one stage: the loop that runs it for a bounded time and the :class:`Stage` it yields.

CPU time is ``time.thread_time``, so a stage that sleeps or waits on I/O shows a low CPU share;
the time spent runnable but waiting for a core comes from Linux ``schedstat``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Stage", "run_delay", "time_loop"]


@dataclass(frozen=True)
class Stage:
    """One measured stage. ``rate`` is samples/s with one process doing the work."""

    name: str  # e.g. "read files (cold)", "decode simplejpeg"
    stage: str  # storage | decode | augment | loader | host-to-device | model
    samples: int
    seconds: float
    cpu_seconds: float
    nbytes: int = 0
    note: str = ""
    queue_seconds: float = 0.0  # runnable but waiting for a core (other processes had it)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")

    @property
    def per_sample_s(self) -> float:
        return self.seconds / self.samples if self.samples else 0.0

    @property
    def cpu_per_sample_s(self) -> float:
        return self.cpu_seconds / self.samples if self.samples else 0.0

    @property
    def queue_per_sample_s(self) -> float:
        return self.queue_seconds / self.samples if self.samples else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "rate": self.rate,
            "per_sample_ms": 1e3 * self.per_sample_s,
            "cpu_per_sample_ms": 1e3 * self.cpu_per_sample_s,
            "queue_per_sample_ms": 1e3 * self.queue_per_sample_s,
            "mb_per_s": self.bytes_per_s / 1e6,
            "samples": self.samples,
            "seconds": self.seconds,
            "note": self.note,
        }


def run_delay() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat; 0
    elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def time_loop(
    fn: Callable[[Any], object],
    items: Sequence[Any],
    *,
    seconds: float,
    min_items: int = 1,
    max_items: int | None = None,
    cycle: bool = True,
) -> tuple[int, float, float, float]:
    """Call ``fn`` on ``items`` (cycling when ``cycle``) for about ``seconds``.

    Returns ``(calls, wall s, thread CPU s, run-queue wait s)``. Stops after ``max_items``
    calls, or at the end of ``items`` when not cycling; runs at least ``min_items`` calls.
    """
    if not items:
        return 0, 0.0, 0.0, 0.0
    limit = max_items if max_items is not None else (1 << 62)
    if not cycle:
        limit = min(limit, len(items))
    clock, cpu = time.perf_counter, time.thread_time
    n = 0
    q0 = run_delay()
    c0 = cpu()
    t0 = clock()
    deadline = t0 + seconds
    m = len(items)
    while n < limit:
        fn(items[n % m])
        n += 1
        if n >= min_items and (n & 7 == 0 or n < 8) and clock() >= deadline:
            break
    wall, used = clock() - t0, cpu() - c0
    queued = min(max(0.0, run_delay() - q0), max(0.0, wall - used))
    return n, wall, used, queued
