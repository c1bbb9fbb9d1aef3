"""The shard cache's lock descriptors: opened with :func:`open_lock`, remembered so that a
forked child closes its copies (a flock lasts while any copy of its descriptor is open, so a
child would otherwise keep its parent's pins, or a lock that a parent's thread held at the
fork, for as long as it lives), and :class:`Held`, a lock this process holds through one
descriptor (a pin, a claim)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from stoker._core.oscompat import at_fork_child
from stoker.storage._cachefiles import LOCK_FILE

__all__ = ["Held", "close_lock", "open_lock"]


class Held:
    """A flock this process holds through one descriptor: released by :meth:`close`, by the
    end of the process, or as a context manager; never by a forked child's copy (see
    ``_forget_locks``), and never pickled."""

    __slots__ = ("_fd", "_pid")
    _refusal = "a flock held by this process"

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pid = os.getpid()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0 and self._pid == os.getpid():
            self._release()
            close_lock(fd)  # the flock goes with the last descriptor of its open file

    def _release(self) -> None:
        """What goes with the lock, before it is released."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __reduce__(self) -> Any:
        raise TypeError(self._refusal)


LOCKS_HELD: set[int] = set()  # this process's open lock file descriptors


def open_lock(path: str) -> int:
    fd = os.open(path, LOCK_FILE, 0o600)
    LOCKS_HELD.add(fd)
    return fd


def close_lock(fd: int) -> None:
    LOCKS_HELD.discard(fd)
    os.close(fd)


def _forget_locks() -> None:
    """In a forked child, close the lock descriptors it inherited (see the module docstring)."""
    for fd in LOCKS_HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    LOCKS_HELD.clear()


at_fork_child(_forget_locks)
