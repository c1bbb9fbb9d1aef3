"""Where an LMDB database lives, and its environment opened read-only, lock-free and lazily in
the process that reads it.

An LMDB environment is an ``mmap`` of ``data.mdb`` plus a file handle; LMDB forbids using one
after ``fork()``. :class:`EnvHandle` therefore pickles as its location only and remembers the
process that opened it: a forked child that finds its parent's environment closes its copy of
it (never reading through it) and opens its own.
``lock=False`` means no ``lock.mdb`` is needed or written, so read-only and shared copies work,
and any number of workers and ranks can read one database; the price is that nobody may write
to the database while it is read (stoker never does).

The ``lmdb`` package is optional: it is imported here, inside functions, with an install hint.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

from stoker._core.errors import CorruptRecordError, StokerFormatError, located

__all__ = [
    "INSTALL_HINT",
    "MAX_READERS",
    "OPEN_OPTIONS",
    "EnvHandle",
    "Location",
    "LmdbFormatError",
    "damaged",
    "import_lmdb",
    "locate",
    "not_found",
    "open_env",
    "show_key",
]

INSTALL_HINT = 'reading LMDB databases needs the lmdb package: pip install "stoker[lmdb]"'
#: Passed to ``lmdb.open``; without a lock file LMDB keeps no reader table, so this does not
#: limit how many processes read at once.
MAX_READERS = 126
#: ``lmdb.open``'s options besides the path (the check's child process opens with them too)
OPEN_OPTIONS = {
    "readonly": True,
    "lock": False,
    "readahead": False,
    "meminit": False,
    "max_readers": MAX_READERS,
    "max_dbs": 0,
    "create": False,
}


def import_lmdb() -> Any:
    try:
        import lmdb
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return lmdb


def show_key(key: bytes | memoryview) -> str:
    """A key as messages print it: quoted text when it is printable ASCII, else hex."""
    k = bytes(key)
    if k and all(32 <= b < 127 for b in k):
        text = k.decode("ascii")
        return repr(text if len(text) <= 80 else text[:77] + "...")
    h = k[:40].hex()
    return f"0x{h}" + ("..." if len(k) > 40 else "") if k else "b''"


class LmdbFormatError(StokerFormatError):
    """A value (or the whole database) is not what its layout says; the message names the
    database, the LMDB key, the position and the byte offset inside the value when known."""

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        key: bytes | None = None,
        position: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.path, self.reason = path, reason
        self.key, self.position, self.offset = key, position, offset
        super().__init__(located(reason, path, *self._where()))

    def _where(self) -> tuple[tuple[str, object], ...]:
        key = None if self.key is None else show_key(self.key)
        return (
            ("LMDB key {}", key),
            ("position {}", self.position),
            ("byte {} of the value", self.offset),
        )

    def detail(self) -> str:
        """The message without the database's path: where in it, and the reason."""
        return located(self.reason, *self._where())

    def __reduce__(self):  # crosses worker processes as data
        return (_rebuild, (self.path, self.reason, self.key, self.position, self.offset))


def _rebuild(path, reason, key, position, offset):  # noqa: ANN001
    return LmdbFormatError(path, reason, key=key, position=position, offset=offset)


def damaged(
    data_file: str, e: Exception, *, key: bytes | None = None, position: int | None = None
) -> CorruptRecordError:
    """liblmdb's error ``e`` (damaged pages, seen while reading record ``position``, LMDB key
    ``key``) as stoker's error naming the data file and the record."""
    where = f"LMDB key {show_key(key)}: " if key is not None else ""
    return CorruptRecordError(data_file, None, f"{where}liblmdb: {e}", key=position)


def not_found(path: str, key: bytes, position: int) -> LmdbFormatError:
    """The error for a key the cursor lists that a lookup does not find."""
    return LmdbFormatError(
        path,
        "the cursor lists this key but a lookup does not find it (a damaged branch page, "
        "or the database changed since its keys were listed)",
        key=key,
        position=position,
    )


@dataclass(frozen=True)
class Location:
    """``path`` as given; ``subdir``: a folder holding ``data.mdb`` (else the path is the data
    file itself, opened with ``subdir=False``); ``data_file``: the file caches are keyed by."""

    path: str
    subdir: bool
    data_file: str


def locate(path: str | os.PathLike[str]) -> Location:
    p = os.fspath(path)
    if os.path.isdir(p):
        data = os.path.join(p, "data.mdb")
        if not os.path.isfile(data):
            raise LmdbFormatError(p, "not an LMDB database: the folder holds no data.mdb")
        return Location(p, True, data)
    if os.path.isfile(p):
        return Location(p, False, p)
    raise FileNotFoundError(f"{p}: no such LMDB database (a folder with data.mdb, or a file)")


def open_env(loc: Location) -> Any:
    """The environment of ``loc``, read-only and lock-free; :class:`LmdbFormatError` when the
    file is not an LMDB database."""
    lmdb = import_lmdb()
    try:
        return lmdb.open(loc.path, subdir=loc.subdir, **OPEN_OPTIONS)
    except lmdb.Error as e:
        hint = ""
        if "already open" in str(e):
            hint = " (close the lmdb.Environment this process opened on it first)"
        raise LmdbFormatError(loc.path, f"not a readable LMDB database: {e}{hint}") from None


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
            from stoker.formats.lmdb.guard import check_database  # guard imports this module

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
