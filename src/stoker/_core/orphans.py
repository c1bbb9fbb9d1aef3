"""Pool workers that end with the main process, and leave nothing of it behind.

A forkserver's worker (``stoker pack``'s) outlives a main process killed with SIGKILL, so each
watches main itself (a pidfd; polling where there are none; on Windows main's process handle),
from the moment it unpickles its process object (:class:`WatchedWorker`), before its arguments
and what they import: a worker killed while it starts ends at once too. The first to see main
gone unlinks the pool's named semaphores and takes them off the resource tracker's list, which
would otherwise unlink them with an "N leaked semaphore objects" warning on the terminal.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import threading
import time
from typing import Any, NoReturn

__all__ = ["WatchedWorker", "watch_main"]

_watching = False


def watch_main(main_pid: int, semaphores: tuple[str, ...] = ()) -> None:
    """From now on, end this process when ``main_pid`` ends (once per process), unlinking
    the named ``semaphores`` first."""
    global _watching
    if not _watching:
        _watching = True
        threading.Thread(
            target=_watch, args=(main_pid, semaphores), name="stoker-parent-watch", daemon=True
        ).start()


def _watch(pid: int, semaphores: tuple[str, ...]) -> None:
    parent = multiprocessing.parent_process()
    if os.name == "nt" and parent is not None:  # spawned by the main process itself
        parent.join()  # its handle is signalled when it exits, however it ends
        _gone(semaphores)
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds, or main is gone already
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])  # readable once the process has exited
        _gone(semaphores)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _gone(semaphores)
        except PermissionError:
            pass
        time.sleep(0.5)


def _gone(semaphores: tuple[str, ...]) -> NoReturn:
    from multiprocessing import resource_tracker

    for name in semaphores:
        try:
            from _multiprocessing import sem_unlink

            sem_unlink(name)
        except (ImportError, OSError):
            continue  # another worker unlinked it
        resource_tracker.unregister(name, "semaphore")
    os._exit(1)


class _Watch:
    """Unpickled first of a worker's process object: starts :func:`watch_main`."""

    def __init__(self, pid: int, semaphores: tuple[str, ...]) -> None:
        self.pid, self.semaphores = pid, semaphores

    def __reduce__(self) -> tuple[Any, ...]:
        return watch_main, (self.pid, self.semaphores)


def _rebuild(_watch: None, cls: type, state: dict[str, Any]) -> Any:
    obj: Any = object.__new__(cls)
    obj.__dict__.update(state)
    return obj


class WatchedWorker:
    """A pool's process class (mixed in before ``multiprocessing``'s): pickled for its start,
    it carries main's pid and the named semaphores of its queues (its first arguments) ahead
    of the rest; ``terminate()`` kills, as the workers ignore SIGTERM."""

    def terminate(self) -> None:
        self.kill()  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.synchronize import SemLock

        args = getattr(self, "_args", ())
        locks = [v for a in args for v in getattr(a, "__dict__", {}).values()]
        named = [getattr(v, "_semlock", None) for v in locks if isinstance(v, SemLock)]
        names = tuple(name for s in named if (name := getattr(s, "name", None)))
        return _rebuild, (_Watch(os.getpid(), names), type(self), self.__dict__)
