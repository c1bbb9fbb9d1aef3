"""Facts about the machine and the job that every room asks the same way.

- :func:`usable_cores`: the cores this process may run on (affinity mask, capped by a
  cgroup CPU quota), which is what a default worker count should follow inside a container.
- :func:`memory_available_bytes`: how much memory a new anonymous shared mapping (the loader's
  batch ring) can take: ``MemAvailable``, capped by the memory cgroup's room.
- :func:`dist_rank`: this process's ``(rank, world_size)``: from an initialised
  ``torch.distributed`` group when torch is already imported, else from the ``RANK`` and
  ``WORLD_SIZE`` variables that ``torchrun`` sets, else ``(0, 1)``. torch is never imported
  here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

__all__ = ["cpu_quota", "dist_rank", "memory_available_bytes", "usable_cores"]


def cpu_quota() -> float | None:
    """CPUs allowed by a cgroup quota (containers), or ``None`` when unlimited or unknown."""
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/cpu.max") as f:  # cgroup v2
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:  # cgroup v1
            q = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            per = int(f.read())
        if q > 0:
            return q / per
    return None


def usable_cores() -> int:
    """Cores this process may run on: the affinity mask, capped by a cgroup CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    q = cpu_quota()
    if q is not None:
        n = min(n, max(1, int(q)))
    return max(1, n)


def dist_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of this process in its training job."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except (RuntimeError, ValueError):  # a group torn down between the two calls
        pass
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_headroom() -> int | None:
    """The least ``limit - usage`` of this process's memory cgroup and its ancestors (v2, else
    v1), or None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        _id, ctrls, path = line.split(":", 2)
        if ctrls == "":
            base, limit_f, usage_f = "/sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in ctrls.split(","):
            base, limit_f, usage_f = (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                ("memory.usage_in_bytes"),
            )
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            d = os.path.join(base, *parts[:depth])
            limit, usage = _read_int(os.path.join(d, limit_f)), _read_int(os.path.join(d, usage_f))
            if limit is not None and usage is not None and limit < 1 << 60:
                room = max(0, limit - usage)
                best = room if best is None else min(best, room)
    return best


def memory_available_bytes() -> int:
    """Memory a new anonymous shared mapping can take: ``MemAvailable`` of ``/proc/meminfo``,
    capped by the memory cgroup's room (limit minus usage, the tightest up the tree)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    room = _cgroup_headroom()
    if avail is None:
        if room is None:
            raise OSError(errno.ENOSYS, "no /proc/meminfo")
        return room
    return avail if room is None else min(avail, room)
