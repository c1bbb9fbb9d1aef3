"""Facts about the machine and the job that every room asks the same way.

- :func:`usable_cores`: the cores this process may run on (affinity mask, capped by a
  cgroup CPU quota), which is what a default worker count should follow inside a container.
- :func:`dist_rank`: this process's ``(rank, world_size)``: from an initialised
  ``torch.distributed`` group when torch is already imported, else from the ``RANK`` and
  ``WORLD_SIZE`` variables that ``torchrun`` sets, else ``(0, 1)``. torch is never imported
  here.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["cpu_quota", "dist_rank", "usable_cores"]


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
