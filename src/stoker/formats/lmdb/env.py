"""An LMDB environment opened read-only, lock-free and lazily in the process that reads it.

An LMDB environment is an ``mmap`` of ``data.mdb`` plus a file handle; LMDB forbids using one
after ``fork()``. :class:`EnvHandle` therefore pickles as its location only and remembers the
process that opened it: a forked child that finds its parent's environment closes its copy of
it (never reading through it) and opens its own. Each database's pages are checked
(:func:`~stoker.formats.lmdb.guard.check_database`) before it is first mapped in a process.
``lock=False`` means no ``lock.mdb`` is needed or written, so read-only and shared copies work,
and any number of workers and ranks can read one database; the price is that nobody may write
to the database while it is read (stoker never does).

Where a database lives and how it is opened are :mod:`stoker.formats.lmdb.location`'s.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from stoker.formats.lmdb.guard import check_database
from stoker.formats.lmdb.location import Location, open_env

__all__ = ["EnvHandle"]


# py-lmdb refuses to open one environment twice in a process, so every handle on the same
# database shares one: {location: [environment, pid that opened it, handles using it]}.
_OPEN: dict[str, list[Any]] = {}  # keyed by the data file's real path
_OPEN_LOCK = threading.Lock()


def _acquire(loc: Location) -> Any:
    pid, where = os.getpid(), os.path.realpath(loc.data_file)
    with _OPEN_LOCK:
        entry = _OPEN.get(where)
        if entry is not None and entry[1] != pid:
            # A parent's environment inherited through fork is never read from; it is closed
            # (py-lmdb refuses a new open of the same files until then). Read-only and
            # lock-free, closing only unmaps this process's copy: there is no lock table or
            # writer mutex to release, and the parent's environment is untouched.
            del _OPEN[where]
            with contextlib.suppress(Exception):
                entry[0].close()
            entry = None
        if entry is None:
            check_database(loc)  # before the file is mapped: damaged pages raise, not crash
            entry = [open_env(loc), pid, 0]
            _OPEN[where] = entry
        entry[2] += 1
        return entry[0]


def _release(loc: Location, env: Any) -> None:
    where = os.path.realpath(loc.data_file)
    with _OPEN_LOCK:
        entry = _OPEN.get(where)
        if entry is None or entry[0] is not env or entry[1] != os.getpid():
            return
        entry[2] -= 1
        if entry[2] <= 0:
            del _OPEN[where]
            env.close()


class EnvHandle:
    """An environment opened on first use in the process that uses it (see the module
    docstring; handles on one database in one process share its environment); pickles as its
    :class:`Location`."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self._env: Any = None
        self._pid = 0

    def get(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env = None
            self._env = _acquire(self.loc)
            self._pid = os.getpid()
        return self._env

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None and self._pid == os.getpid():
            _release(self.loc, env)

    def __getstate__(self) -> dict:
        return {"loc": self.loc}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["loc"])  # type: ignore[misc]
