"""How much of the usable cores other processes took while a loader run was measured.

The kernel's per-CPU counters (``/proc/stat`` through psutil) give the busy and steal time of
the CPUs this process may run on; the doctor's own CPU time (the consuming process and each
loader worker) is taken out, and what is left is what other processes (and, as *steal*, the
hypervisor) took. Averaged over the measured window this is ``others_cores``: how many of the
usable cores were not available to stoker during that run. With a CPU quota (a container), the
cores left are also capped by the quota.

Counters tick every 10 ms, so a window of a second on a few cores is good to a few percent.
Where the counters cannot be read (no psutil, an unusual platform) the figures are ``None``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["Load", "LoadMeter"]


@dataclass(frozen=True)
class Load:
    """What else ran on the cores during one measured window."""

    cores: int  # usable cores (affinity mask capped by the CPU quota)
    others_cores: float  # cores other processes (and steal) took, on average
    steal_cores: float  # of which steal: time a virtual machine's CPUs were not running it
    load1: float | None  # the 1-minute load average at the window's end

    @property
    def free_cores(self) -> float:
        """Cores left for stoker's workers and the consuming process."""
        return max(0.0, self.cores - self.others_cores)

    def to_dict(self) -> dict[str, float | None]:
        return {**asdict(self), "free_cores": self.free_cores}


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _system_times(cpus: list[int]) -> tuple[float, float]:
    """(busy, steal) seconds summed over ``cpus`` since boot. Busy counts user, nice, system,
    irq and softirq time (guest time is inside user); idle and iowait are not busy."""
    import psutil

    per = psutil.cpu_times(percpu=True)
    busy = steal = 0.0
    for i in cpus:
        if i >= len(per):
            continue
        t = per[i]
        busy += t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        steal += getattr(t, "steal", 0.0)
    return busy, steal


class LoadMeter:
    """``start()`` and ``stop()`` around a measured window; ``stop`` returns the :class:`Load`
    (``None`` when the counters cannot be read). ``pids`` gives the worker processes' ids at
    each end (a worker replaced in between counts as another process)."""

    def __init__(self, pids: Callable[[], list[int]], cores: int) -> None:
        self.pids, self.cores = pids, cores
        self.cpus = _cpus()
        self._start: tuple[float, float, float, dict[int, float]] | None = None
        self._own0 = 0.0

    def start(self) -> None:
        try:
            busy, steal = _system_times(self.cpus)
            pids = self.pids()
            self._start = (time.perf_counter(), busy, steal, _per_pid(pids))
            self._own0 = time.process_time()
        except Exception:  # noqa: BLE001 - no counters: the run is still measured
            self._start = None

    def stop(self) -> Load | None:
        if self._start is None:
            return None
        t0, busy0, steal0, pid0 = self._start
        try:
            busy1, steal1 = _system_times(self.cpus)
            pid1 = _per_pid(self.pids())
        except Exception:  # noqa: BLE001
            return None
        wall = time.perf_counter() - t0
        if wall <= 0:
            return None
        own = time.process_time() - self._own0
        own += sum(pid1[p] - pid0[p] for p in pid1 if p in pid0)
        steal = max(0.0, steal1 - steal0)
        others = max(0.0, busy1 - busy0 - own) + steal
        # the cores left: the CPUs of the affinity mask other processes did not take, and no
        # more than the quota allows
        free = min(float(self.cores), max(0.0, len(self.cpus) - others / wall))
        load1 = None
        with contextlib.suppress(AttributeError, OSError):
            load1 = os.getloadavg()[0]
        return Load(self.cores, self.cores - free, min(steal / wall, self.cores), load1)


def _per_pid(pids: list[int]) -> dict[int, float]:
    import psutil

    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
    return out
