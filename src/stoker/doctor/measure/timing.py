"""Timing one stage: the loop that runs it for a bounded time and the :class:`Stage` it yields.

CPU time is ``time.thread_time``, so a stage that sleeps or waits on I/O shows a low CPU share;
the time spent runnable but waiting for a core comes from Linux ``schedstat``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["TIGHT", "Spread", "Stage", "Timed", "run_delay", "spread_of", "time_loop"]


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
    #: seconds per sample round by round: the median and its interval (``None``: one figure)
    spread: Spread | None = None

    @property
    def rate(self) -> float:
        if not self.samples:
            return 0.0 if self.seconds > 0 else float("inf")
        per = self.per_sample_s
        return 1.0 / per if per > 0 else float("inf")

    @property
    def per_sample_s(self) -> float:
        """The rounds' median when there are rounds (a burst of other work on the machine
        moves it less than the mean), else wall seconds over samples."""
        if self.spread is not None and self.spread.mid_s > 0:
            return self.spread.mid_s
        return self.seconds / self.samples if self.samples else 0.0

    @property
    def interval_s(self) -> tuple[float, float]:
        """``(lo, hi)`` seconds per sample (the figure itself twice without rounds)."""
        if self.spread is None:
            return (self.per_sample_s, self.per_sample_s)
        return (self.spread.lo_s, self.spread.hi_s)

    @property
    def tight(self) -> bool:
        return self.spread is not None and self.spread.tight

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
            "interval_ms": [1e3 * x for x in self.interval_s],
            "tight": self.tight,
            "rounds": self.spread.rounds if self.spread is not None else 0,
        }


def run_delay() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat; 0
    elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


#: a round of calls lasts at least this long (so the clock's cost and granularity vanish)
_ROUND_S = 0.002
#: an interval is tight when its half-width is at most this share of the median
TIGHT = 0.05


@dataclass(frozen=True)
class Spread:
    """Seconds per sample of one measurement, round by round: the median of the rounds and an
    interval of about 95 % around it (the order statistics ``n/2 -+ sqrt(n)``, free of any
    assumption on how the rounds are spread; min..max under six rounds). ``tight`` when the
    interval's half-width is within :data:`TIGHT` of the median."""

    mid_s: float
    lo_s: float
    hi_s: float
    rounds: int

    @property
    def tight(self) -> bool:
        return self.rounds >= 6 and (self.hi_s - self.lo_s) <= 2 * TIGHT * self.mid_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "ms": 1e3 * self.mid_s,
            "lo_ms": 1e3 * self.lo_s,
            "hi_ms": 1e3 * self.hi_s,
            "rounds": self.rounds,
            "tight": self.tight,
        }


def spread_of(per_sample: Sequence[float]) -> Spread | None:
    """The :class:`Spread` of rounds given as seconds per sample (``None`` for none)."""
    xs = sorted(float(x) for x in per_sample)
    n = len(xs)
    if n == 0:
        return None
    mid = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    if n < 6:
        return Spread(mid, xs[0], xs[-1], n)
    half = 0.98 * math.sqrt(n)  # 1.96 / 2 * sqrt(n): the ranks around the median
    lo = max(0, int(math.floor(n / 2 - half)) - 1)
    hi = min(n - 1, int(math.ceil(n / 2 + half)))
    return Spread(mid, xs[lo], xs[hi], n)


class Timed(NamedTuple):
    """What :func:`time_loop` measured: calls, wall, thread CPU and run-queue seconds, and
    the rounds' spread."""

    calls: int
    wall: float
    cpu: float
    queued: float
    spread: Spread | None


def time_loop(
    fn: Callable[[Any], object],
    items: Sequence[Any],
    *,
    seconds: float,
    min_items: int = 1,
    cycle: bool = True,
    max_seconds: float | None = None,
) -> Timed:
    """Call ``fn`` on ``items`` (cycling when ``cycle``) for about ``seconds``, in rounds of
    at least 2 ms; then, up to ``max_seconds`` (default: ``seconds``), on until the rounds'
    interval is tight (:class:`Spread`).

    Stops at the end of ``items`` when not cycling; runs at least ``min_items`` calls.
    """
    if not items:
        return Timed(0, 0.0, 0.0, 0.0, None)
    limit = (1 << 62) if cycle else len(items)
    clock, cpu = time.perf_counter, time.thread_time
    rounds: list[float] = []
    n = 0
    q0 = run_delay()
    c0 = cpu()
    t0 = clock()
    deadline = t0 + seconds
    last = t0 + max(seconds, max_seconds or 0.0)
    m = len(items)
    r0, rn = t0, 0
    while n < limit:
        fn(items[n % m])
        n += 1
        rn += 1
        now = clock()
        if now - r0 >= _ROUND_S:
            rounds.append((now - r0) / rn)
            r0, rn = now, 0
            if n >= min_items and now >= deadline:
                if now >= last or len(rounds) % 8 == 0 and _tight(rounds):
                    break
    wall, used = clock() - t0, cpu() - c0
    if rn and (not rounds or clock() - r0 >= _ROUND_S / 2):  # the last, shorter round
        rounds.append((clock() - r0) / rn)
    queued = min(max(0.0, run_delay() - q0), max(0.0, wall - used))
    return Timed(n, wall, used, queued, spread_of(rounds))


def _tight(rounds: list[float]) -> bool:
    got = spread_of(rounds)
    return got is not None and got.tight
