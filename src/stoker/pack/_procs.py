"""Worker-process set-up shared by the packer and the sample-data maker, and the one place
that chooses how their processes start.

Start method. :func:`default_start_method` is ``forkserver`` where the platform has it
(Linux, macOS) and ``spawn`` elsewhere (Windows); a pool may ask for ``spawn`` anywhere
(``LocalEngine(start_method="spawn")``). Either way everything a worker gets crosses as a
pickle (a shard job, a task of paths and options): nothing is inherited from the parent's
globals.

Pools run on multiprocessing's forkserver by default. The forkserver keeps running as long as any
process it forked holds its "alive" pipe, and every worker holds it, so a worker cannot rely on
its parent (the forkserver) dying when the main process is killed. Each worker therefore
watches the main process itself from the moment it starts, and exits when it is gone, taking
the pool's named semaphores off the resource tracker (``stoker._core.orphans``); then the
forkserver sees its pipe close and exits too.

SIGTERM. A terminal, a job scheduler or ``kill -TERM -PGID`` signals the whole process group,
workers included. A worker that died of it at once could die half-way through sending a
result: the pool's management thread in the main process then waits forever in ``recv`` for the
rest of that message, and the main process hangs at exit (joining that thread) beside the dead
worker. So workers ignore SIGTERM and leave it to the main process, which gets the same signal
and stops the pool in order (each worker finishes the chunk it holds, sends it whole and exits;
the shutdown waits for it), or has died, and then the watcher ends the worker. Whatever the
main process itself stops by force (``ProcessPoolExecutor`` ending a broken pool, the packer's
last resort) it kills: the pool's processes (``_SpawnWorker``, ``_ForkServerWorker``) have a
``terminate()`` that is ``kill()``. (Blocking SIGTERM and taking it in a thread with
``sigwaitinfo`` instead would not do: threads that native libraries start before the worker's
set-up leave it unblocked, and the kernel may hand the signal to one of them.)
"""

from __future__ import annotations

import ast
import multiprocessing
import multiprocessing.context as mpc
import os
import signal
import sys
import traceback
from multiprocessing.context import BaseContext, SpawnContext, SpawnProcess

from stoker._core.orphans import WatchedWorker, watch_main

__all__ = ["START_METHODS", "default_start_method", "pool_context", "worker_init"]

#: the start methods a pack pool takes
START_METHODS = ("forkserver", "spawn")


class _SpawnWorker(WatchedWorker, SpawnProcess):
    """A spawned process whose ``terminate()`` kills: pool workers ignore SIGTERM."""


class _SpawnPool(SpawnContext):
    Process = _SpawnWorker


_FORKSERVER: type[BaseContext] | None = None
if hasattr(mpc, "ForkServerContext"):  # not on Windows

    class _ForkServerWorker(WatchedWorker, mpc.ForkServerProcess):  # type: ignore[name-defined,misc]
        """A forkserver process whose ``terminate()`` kills."""

    class _ForkServerPool(mpc.ForkServerContext):  # type: ignore[name-defined,misc]
        Process = _ForkServerWorker

    _FORKSERVER = _ForkServerPool


def default_start_method() -> str:
    """``forkserver`` where this platform has it, else ``spawn``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def pool_context(start_method: str | None = None) -> BaseContext:
    """The context for pools whose workers run :func:`worker_init`, started by
    ``start_method`` (default: :func:`default_start_method`)."""
    method = start_method or default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {method!r}")
    why = _rerun_refused(sys.modules.get("__main__"))
    if why is not None:  # rather than every worker dying as it starts, or waiting on this call
        raise RuntimeError(
            "worker processes cannot start: multiprocessing runs the main script again in "
            f"each, and {why}, or use the command line (stoker pack, convert, index, sample-data)"
        )
    if method == "spawn" or _FORKSERVER is None:
        return _SpawnPool()
    ctx = _FORKSERVER()
    ctx.set_forkserver_preload(["__main__", "stoker._core.orphans"])  # a worker watches at once
    return ctx


def _rerun_refused(main: object) -> str | None:
    """Why a worker cannot run the main script again (read from standard input; or this call
    comes from its top-level code outside ``if __name__ == "__main__":``, which a worker would
    run again), or ``None``."""
    path, spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    if not path or spec is not None and spec.name.rpartition(".")[2] == "__main__":
        return None  # python -m PACKAGE: multiprocessing does not run a __main__ module again
    if spec is None and not os.path.isfile(path):
        return f"{path!r} is not a file (a script read from standard input); save it to a file"
    mine = [f for f, _ in traceback.walk_stack(None) if f.f_globals is getattr(main, "__dict__", 0)]
    if not mine or mine[-1].f_code.co_name != "<module>":
        return None
    try:
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return None
    guards = [n for n in body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    if any(n.lineno <= mine[-1].f_lineno <= (n.end_lineno or 0) for n in guards):
        return None
    return (
        f'{path} line {mine[-1].f_lineno} runs outside `if __name__ == "__main__":`, that line '
        "included; put the script's work under that guard"
    )


def worker_init(main_pid: int) -> None:
    """Leave Ctrl-C and SIGTERM to the main process, and exit when it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch_main(main_pid)
