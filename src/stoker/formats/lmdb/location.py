"""Where an LMDB database lives, how it is opened (read-only, lock-free), and the errors that
name a key in it: what the page check (``guard``), the page reader (``pages``) and the
per-process handle (``env``) share, below all three.

``lock=False`` (:data:`OPEN_OPTIONS`) means no ``lock.mdb`` is needed or written, so read-only
and shared copies work.

The ``lmdb`` package is optional: it is imported here, inside functions, with an install hint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from stoker._core.errors import CorruptRecordError, StokerFormatError, located

__all__ = [
    "INSTALL_HINT",
    "MAX_READERS",
    "OPEN_OPTIONS",
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
