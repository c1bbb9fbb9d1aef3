"""Facts about the machine and the job that every room asks the same way.

- :func:`usable_cores`: the cores this process may run on (affinity mask, capped by a
  cgroup CPU quota), which is what a default worker count should follow inside a container.
- :func:`memory_available_bytes`: how much memory a new anonymous shared mapping (the loader's
  batch ring) can take: ``MemAvailable``, capped by the memory cgroup's room;
  :func:`page_cache_budget`: how much of a file the page cache can hold for this process
  (what decides the access hints for sets larger than memory).
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
from collections.abc import Iterator

__all__ = [
    "cpu_quota",
    "dist_rank",
    "memory_available_bytes",
    "page_cache_budget",
    "usable_cores",
]


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
    with contextlib.suppress(RuntimeError, ValueError):  # a group torn down between the calls
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)
# per hierarchy: (folder under the cgroup root, limit file, usage file, anonymous memory in
# memory.stat)
_Names = tuple[str, str, str, tuple[str, ...]]
_V2: _Names = ("", "memory.max", "memory.current", ("anon",))
_V1: _Names = ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", ("total_rss", "rss"))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat_value(path: str, names: tuple[str, ...]) -> int:
    """The first of ``names`` in a cgroup ``memory.stat`` (0 when absent)."""
    try:
        with open(path) as f:
            rows = dict(line.split(None, 1) for line in f if " " in line)
    except OSError:
        return 0
    return next((int(rows[n]) for n in names if n in rows), 0)


def _memory_cgroups(proc: str, cgroup_root: str) -> Iterator[tuple[list[str], _Names]]:
    """This process's memory cgroups (cgroup v2 ``0::/path``, v1 ``N:memory:/path``): for each,
    its folders from its own up to the hierarchy's root, and the hierarchy's file names."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, ctrls, path = parts
        if ctrls == "":
            names = _V2
        elif "memory" in ctrls.split(","):
            names = _V1
        else:
            continue
        base = os.path.join(cgroup_root, names[0])
        comps = [c for c in path.split("/") if c]
        yield [os.path.join(base, *comps[:k]) for k in range(len(comps), -1, -1)], names


def _mem_available(proc: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(os.path.join(proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _cgroup_headroom(proc: str, cgroup_root: str) -> int | None:
    """The least ``limit - usage`` of this process's memory cgroups and their ancestors, or
    None without a limit."""
    best = None
    for folders, (_, limit_f, usage_f, _anon) in _memory_cgroups(proc, cgroup_root):
        for d in folders:
            limit, usage = _read_int(os.path.join(d, limit_f)), _read_int(os.path.join(d, usage_f))
            if limit is not None and usage is not None and limit < _NO_LIMIT:
                best = _min(best, max(0, limit - usage))
    return best


def _cgroup_cache_room(proc: str, cgroup_root: str) -> int | None:
    """Memory the page cache may use inside this process's memory cgroup: the tightest limit
    on the way from its cgroup to the root, less that cgroup's anonymous memory (its page
    cache counts as room); None without a limit."""
    best = None
    for folders, (_, limit_f, _usage, anon_names) in _memory_cgroups(proc, cgroup_root):
        limits = [_read_int(os.path.join(d, limit_f)) for d in folders]
        tight = min((x for x in limits if x is not None and x < _NO_LIMIT), default=None)
        if tight is not None:
            anon = _stat_value(os.path.join(folders[0], "memory.stat"), anon_names)
            best = _min(best, max(0, tight - anon))
    return best


def memory_available_bytes(*, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Memory a new anonymous shared mapping can take: ``MemAvailable`` of ``/proc/meminfo``,
    capped by the memory cgroup's room (limit minus usage, the tightest up the tree)."""
    avail, room = _mem_available(proc), _cgroup_headroom(proc, cgroup_root)
    if avail is None and room is None:
        raise OSError(errno.ENOSYS, "no /proc/meminfo")
    return _min(avail, room)  # type: ignore[return-value]


def page_cache_budget(*, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes of page cache this process can count on: ``MemAvailable`` (free memory plus the
    reclaimable page cache), capped by the room its memory cgroup leaves for the page cache
    (the tightest limit up the tree, less the cgroup's anonymous memory); ``None`` where
    ``/proc/meminfo`` cannot be read (not Linux)."""
    avail = _mem_available(proc)
    return None if avail is None else _min(avail, _cgroup_cache_room(proc, cgroup_root))
