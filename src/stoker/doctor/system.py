"""System checks: what in the machine's setup can starve or break the loader.

Each check returns a :class:`Check` (``ok`` / ``warn`` / ``fail`` plus a sentence with the
figures and the fix). None of them changes anything.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from dataclasses import dataclass
from typing import Any

from stoker._core.system import cpu_quota, memory_available_bytes, usable_cores

__all__ = [
    "Check",
    "check_cores",
    "check_load",
    "check_memory",
    "check_node",
    "check_start_method",
    "check_threads",
    "check_ulimit",
]

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    message: str
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "data": self.data or {},
        }


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def check_memory(*, need_bytes: int, what: str) -> Check:
    """Is there memory for the loader's batch ring (an anonymous shared mapping: it counts
    against the machine's available memory and the memory cgroup, not against /dev/shm)?"""
    try:
        avail = memory_available_bytes()
    except OSError as e:
        return Check("memory", "warn", f"available memory unknown ({e})")
    data = {"available_bytes": avail, "need_bytes": need_bytes}
    text = (
        f"{_mib(avail)} available (MemAvailable, capped by the memory cgroup); the "
        f"loader's ring needs about {_mib(need_bytes)} ({what})"
    )
    if need_bytes > avail:
        return Check(
            "memory",
            "fail",
            text + ": too little; lower batch_size, prefetch or workers, or give the job more "
            "memory.",
            data,
        )
    if need_bytes > 0.5 * avail:
        return Check(
            "memory", "warn", text + ": tight; two loaders or a larger batch will not fit.", data
        )
    return Check("memory", "ok", text + ".", data)


def check_node() -> Check:
    """Every loader on this node (every rank, every job of this user) shares its memory, its
    processes and the user's descriptors: their rings, RSS and PSS, processes and open files."""
    import psutil

    from stoker.loader import node_loaders

    loaders = node_loaders()
    ring = sum(d["ring"] for d in loaders)
    pending = sum(d["ring"] - d["reserved"] for d in loaders)
    rss = pss = fds = 0
    pids: set[int] = set()
    for d in loaders:
        try:
            main = psutil.Process(d["pid"])
            family = [main, *main.children(recursive=True)]
        except psutil.Error:
            continue
        for p in family:
            if p.pid in pids:
                continue
            pids.add(p.pid)
            with contextlib.suppress(psutil.Error):
                mem = p.memory_full_info()
                rss += mem.rss
                pss += getattr(mem, "pss", mem.rss)
                fds += p.num_fds()
    data = {
        "loaders": len(loaders),
        "workers": sum(d["workers"] for d in loaders),
        "processes": len(pids),
        "ring_bytes": ring,
        "ring_unreserved_bytes": pending,
        "rss_bytes": rss,
        "pss_bytes": pss,
        "fds": fds,
    }
    if not loaders:
        return Check("node", "ok", "no other loader is running on this node", data)
    text = (
        f"{len(loaders)} loader(s) running on this node: {data['workers']} workers, "
        f"{len(pids)} processes, rings {_mib(ring)} ({_mib(pending)} not reserved yet), "
        f"RSS {_mib(rss)}, PSS {_mib(pss)}, {fds} open files"
    )
    try:
        avail = memory_available_bytes()
    except OSError:
        return Check("node", "ok", text + ".", data)
    data["available_bytes"] = avail
    if pending > avail:
        return Check(
            "node",
            "warn",
            text + f": the rings' unreserved part is more than the {_mib(avail)} available; "
            "a loader that reserves its next slot may fail",
            data,
        )
    return Check("node", "ok", text + ".", data)


def check_ulimit(*, workers: int) -> Check:
    """Enough file descriptors for workers, pipes and shared-memory segments?"""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return Check("ulimit", "ok", "ulimit -n: unknown on this platform")
    need = 64 + 16 * workers
    data = {"soft": soft, "hard": hard, "need_estimate": need}
    text = f"ulimit -n is {soft} (hard {hard}); {workers} worker(s) need about {need}"
    if soft != resource.RLIM_INFINITY and soft < need:
        return Check(
            "ulimit", "fail", text + f": raise it with `ulimit -n {max(4096, need)}`.", data
        )
    if soft != resource.RLIM_INFINITY and soft < 1024:
        return Check("ulimit", "warn", text + ": low; `ulimit -n 4096` is a safer minimum.", data)
    return Check("ulimit", "ok", text + ".", data)


def check_cores(*, workers: int, cores: int | None = None) -> Check:
    cores = usable_cores() if cores is None else cores
    total = os.cpu_count() or cores
    quota = cpu_quota()
    data = {"usable": cores, "cpu_count": total, "cgroup_quota": quota, "workers": workers}
    where = f"{cores} usable core(s)" + (
        f" (machine has {total}; limited by affinity or a CPU quota)" if cores < total else ""
    )
    if workers > cores:
        return Check(
            "cores",
            "warn",
            f"{where} for {workers} worker(s) plus the training process: CPU-bound workers "
            f"beyond {cores} only add switching; more help only when workers wait on I/O.",
            data,
        )
    if workers == cores and cores > 1:
        return Check(
            "cores",
            "ok",
            f"{where} for {workers} worker(s); the training process shares them.",
            data,
        )
    return Check("cores", "ok", f"{where} for {workers} worker(s).", data)


def check_load(*, cores: int | None = None) -> Check:
    """Other processes competing for the cores make every figure lower and noisier."""
    cores = usable_cores() if cores is None else cores
    try:
        load1, load5, _ = os.getloadavg()
    except (AttributeError, OSError):  # pragma: no cover - not POSIX
        return Check("load", "ok", "load average: unknown on this platform")
    data = {"load1": load1, "load5": load5, "cores": cores}
    text = f"load average {load1:.1f} (1 min) on {cores} usable core(s)"
    if load1 > 1.5 * cores:
        return Check(
            "load",
            "warn",
            text + ": the machine is busy; other processes take CPU time, so the rates here are "
            "lower and noisier than on an idle machine (the model accounts for the measured "
            "wait for a core).",
            data,
        )
    return Check("load", "ok", text + ".", data)


def check_threads(
    *, workers: int, cores: int | None = None, worker_threads: list[int] | None = None
) -> Check:
    """Thread pools that multiply with the worker count (OpenCV, OpenMP, MKL, torch)."""
    cores = usable_cores() if cores is None else cores
    env = {k: os.environ.get(k) for k in THREAD_ENV}
    data: dict[str, Any] = {"env": env}
    pools: list[str] = []
    try:
        import cv2

        n = int(cv2.getNumThreads())
        data["cv2_threads"] = n
        pools.append(f"OpenCV {n}")
    except Exception:  # noqa: BLE001 - OpenCV missing or broken: nothing to check
        data["cv2_threads"] = None
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            data["torch_threads"] = int(torch.get_num_threads())
            pools.append(f"torch {data['torch_threads']}")
    if worker_threads:
        data["worker_threads"] = worker_threads
    set_env = [f"{k}={v}" for k, v in env.items() if v]
    text = (
        "main process thread pools: "
        + (", ".join(pools) or "none found")
        + "; "
        + ("; ".join(set_env) if set_env else "OMP/MKL/OpenBLAS thread variables unset")
    )
    if worker_threads:
        text += f"; live threads per loader worker: {worker_threads}"
        worst = max(worker_threads)
        if workers * worst > 4 * cores and worst > 4:
            return Check(
                "threads",
                "warn",
                text + f": {workers} workers x {worst} threads on {cores} cores oversubscribe; "
                "set cv2.setNumThreads(1) and torch.set_num_threads(1) in workers (stoker's "
                "workers should do this themselves).",
                data,
            )
        return Check("threads", "ok", text + ".", data)
    n_cv = data.get("cv2_threads") or 1
    if workers > 1 and n_cv > 1:
        return Check(
            "threads",
            "ok",
            text + f": a worker that keeps OpenCV's {n_cv} threads would oversubscribe "
            f"{cores} cores {workers}-fold; workers must call cv2.setNumThreads(1).",
            data,
        )
    return Check("threads", "ok", text + ".", data)


def check_start_method(
    *, loader_method: str | None = None, loader_engine: str | None = None
) -> Check:
    """How the measured loader's workers started, and with which engine (``"linux"``: its
    fork server; ``"portable"``: spawn; see ``stoker.loader._engine``)."""
    current = multiprocessing.get_start_method(allow_none=True)
    data = {
        "default": current,
        "loader": loader_method,
        "engine": loader_engine,
        "available": multiprocessing.get_all_start_methods(),
    }
    method = (
        loader_method
        or current
        or ("fork" if sys.platform == "linux" and sys.version_info < (3, 14) else "spawn")
    )
    own = f", engine {loader_engine!r}" if loader_engine else ""
    text = f"multiprocessing start method: {method}" + (
        f" (the loader's own{own})" if loader_method else " (process default)"
    )
    if method == "fork":
        threaded = [m for m in ("torch", "cv2", "keras", "tensorflow") if m in sys.modules]
        if threaded:
            return Check(
                "start_method",
                "warn",
                text + f" after {', '.join(threaded)} started thread pools: a forked worker can "
                "inherit a held lock and hang; use forkserver or spawn.",
                data,
            )
    return Check("start_method", "ok", text + ".", data)
