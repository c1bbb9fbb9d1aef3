"""The node-wide shard cache: whole remote shards downloaded once into a local folder with a
byte budget that every worker and every rank on the node shares.

NOTE: the protocol (files, locks, who holds what when, and what a SIGKILL leaves)

Layout under ``ROOT`` (a 0700 folder; every file in it is 0600)::

    ROOT/lock                           the cache-wide accounting lock (flock)
    ROOT/locks/KEY                      an entry's lock (flock; lock files are never deleted,
                                        so nobody ever locks an orphaned inode)
    ROOT/entries/KEY.data               the entry's bytes
    ROOT/entries/KEY.ok                 its marker: JSON with the size, CRC32C and sha256 it
                                        was checked against, the file's inode, mtime_ns, name;
                                        the marker's mtime is the entry's last use (touched on
                                        every get: atime is unreliable)
    ROOT/tmp/KEY.RESERVE.PID.RAND.part  a download in progress, holding RESERVE bytes of budget
    ROOT/tmp/KEY.PID.RAND.mark          a marker being written
    ROOT/claims/PID.RAND.json           a reader's claim on the budget (see Claims below)

Locks. Each :class:`Pin` holds its entry's lock ``LOCK_SH``; the one process downloading an
entry holds it ``LOCK_EX``, and so does an evictor for the instant it deletes one. ``ROOT/lock``
is held ``LOCK_EX`` only to account: sum usage, evict, reserve, publish a download. The order
is entry lock, then cache lock, and under the cache lock entry locks are only tried
``LOCK_NB``, so no two processes wait on each other in a cycle.

A get takes ``LOCK_SH`` (which waits while another process downloads the entry) and returns
the pin when the marker matches the data file's size, inode and mtime. Otherwise it drops it,
tries ``LOCK_EX | LOCK_NB`` (failing, another process downloads, and the next ``LOCK_SH`` waits
for it, or readers still pin a copy that went bad: it polls up to ``wait`` s), checks again,
and downloads:

1. remove the entry's old files and temporary files (under ``LOCK_EX`` nobody reads them);
2. under the cache lock: remove temporary files whose entry lock can be taken ``LOCK_SH |
   LOCK_NB`` (no live downloader), sum usage (every file's ``st_size``; a ``.part`` counts at
   least its reservation), evict least recently used entries whose lock can be taken
   ``LOCK_EX | LOCK_NB`` until ``size + MARKER_RESERVE`` fits, then create the ``.part`` file
   (``O_EXCL``) and ``fallocate`` it keeping its size (``du`` sees the reservation, and a full
   disk fails here as :class:`CacheFullError`, not midway). When the room is pinned, release
   the cache lock and poll, up to ``wait`` s;
3. ``fetch`` into the ``.part`` file, fsync, check size, and CRC32C and sha256 where given (a
   failure fetches once more, a second one is a :class:`CorruptRecordError`), write the
   ``.mark`` file and fsync it;
4. under the cache lock: rename the data, then the marker, into ``entries/``, fsync the folder
   and turn ``LOCK_EX`` into ``LOCK_SH`` (no evictor runs meanwhile): the caller's pin.

Usage grows only inside reservations made under the cache lock, so the files under ``ROOT``
never hold more than the budget at any instant (in bytes of file size; a filesystem adds its
block rounding per file).

A SIGKILL frees the process's flocks. Mid-download, ``.part``/``.mark`` files stay in
``tmp/`` with a free entry lock: the next accounting pass (or the next get of that key)
removes them. Between the two renames, a data file stays without a marker: no get reads it,
and eviction takes it first. A killed pin holder's pins go with it. Under the cache lock every
step is one rename or delete, so nothing is half-published.

Claims. Every reader that pins shards (a loader with its workers and downloads ahead) first
claims the bytes it may hold pinned at once (:meth:`ShardCache.claim`), under the cache lock:
a JSON file in ``claims/`` that its process holds ``LOCK_EX`` for as long as the claim
lives. The claims of live processes (a file nobody locks is a dead process's and is removed)
must fit the budget together, or the new claim is refused with :class:`CacheFullError`. One
run's claims on one set form a ``group`` that counts once (:func:`.claims.claim`). So pins
never fill the budget: whenever a reader waits for room, the room is held by entries nobody
pins, which eviction takes.

A get compares size, inode and mtime, not the CRC32C (checked once, on download): a file
edited or truncated in place has a new mtime or size, so it is downloaded again, never read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from stoker._core.atomic import fsync_dir
from stoker._core.cache import cache_dir
from stoker._core.errors import CacheFullError, CorruptRecordError, StorageError, size_text
from stoker._core.oscompat import lock, owned_by_user, unlock
from stoker.storage._cachefiles import (
    DATA,
    MARK,
    MARK_TMP,
    NEW_FILE,
    NOFOLLOW,
    PART,
    check_file,
    is_key,
    listing,
    parse_tmp,
    preallocate,
    read_marker,
    split_entry,
)
from stoker.storage._locks import Held, close_lock, open_lock
from stoker.storage.claims import Claim, claim, live_claims

__all__ = [
    "DEFAULT_LIMIT_FRACTION",
    "DEFAULT_LIMIT_MAX",
    "MARKER_RESERVE",
    "Claim",
    "Pin",
    "ShardCache",
]

#: The default budget is the smaller of :data:`DEFAULT_LIMIT_MAX` and this fraction of the
#: space the cache could use where it lives (free space plus what it holds already), measured
#: when the :class:`ShardCache` is made.
DEFAULT_LIMIT_FRACTION = 0.5
DEFAULT_LIMIT_MAX = 100 * 2**30
#: Bytes reserved with each download for its verification marker.
MARKER_RESERVE = 512

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

Fetch = Callable[[BinaryIO], None]


@dataclass(frozen=True)
class _Want:
    """One get's arguments."""

    key: str
    size: int
    crc: int | None
    fetch: Fetch
    label: str
    wait_for_room: bool
    sha256: str | None = None


class _Poll:
    """Sleeps between tries, growing from 10 ms to 250 ms; expired once ``wait`` s passed."""

    def __init__(self, wait: float) -> None:
        self.deadline = time.monotonic() + wait
        self.delay = 0.01

    def expired(self) -> bool:
        """True when the time is up; otherwise sleep and say False."""
        if time.monotonic() >= self.deadline:
            return True
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, 0.25)
        return False


class Pin(Held):
    """A shared lock on one cache entry: while it is open no process evicts or replaces the
    file at :attr:`path`. A context manager; :meth:`close` releases it (so does process exit)."""

    __slots__ = ("key", "path")
    _refusal = "a Pin is this process's file lock; send the cache and key, get() there"

    def __init__(self, path: str, key: str, fd: int) -> None:
        super().__init__(fd)
        self.path = path
        self.key = key

    def __repr__(self) -> str:
        return f"Pin({self.path!r}, {'closed' if self.closed else 'open'})"


class ShardCache:
    """The node-wide cache of whole shards; see the module's NOTE for the protocol.

    ``root`` defaults to ``<stoker cache dir>/shards``; ``limit`` is the byte budget (``None``:
    see :data:`DEFAULT_LIMIT_FRACTION`); ``wait`` is how long a get waits for pinned room.
    Picklable: it carries only ``root``, ``limit`` and ``wait``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        limit: int | None = None,
        *,
        wait: float = 300.0,
    ) -> None:
        where = os.path.join(cache_dir(), "shards") if root is None else os.fspath(root)
        self.root = os.path.abspath(where)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise ValueError(f"wait must be a number of seconds >= 0, got {wait!r}")
        self.wait = float(wait)
        if limit is None:
            limit = default_limit(self.root)
        elif isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(
                f"cache limit must be a positive number of bytes, got {limit!r}; "
                "pass None for the default"
            )
        self.limit = int(limit)
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "limit": self.limit, "wait": self.wait}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ready = False

    def __repr__(self) -> str:
        return f"ShardCache({self.root!r}, limit={self.limit}, wait={self.wait:g})"

    # -- public -----------------------------------------------------------------------------

    def get(
        self,
        key: str,
        *,
        size: int,
        crc32c: int | None,
        fetch: Fetch,
        name: str = "",
        sha256: str | None = None,
    ) -> Pin:
        """A pinned, verified local copy of object ``key``, downloaded with ``fetch`` unless
        it is cached already; waits up to ``wait`` seconds for pinned room. A download is
        checked against ``size`` and, where given, ``crc32c`` and ``sha256`` (hex)."""
        pin = self._get(_Want(key, size, crc32c, fetch, name or key, True, sha256))
        if pin is None:  # waiting for room ends in CacheFullError, never in None
            raise RuntimeError(f"shard cache {self.root}: no pin for {name or key}")
        return pin

    def try_get(
        self,
        key: str,
        *,
        size: int,
        crc32c: int | None,
        fetch: Fetch,
        name: str = "",
        sha256: str | None = None,
    ) -> Pin | None:
        """Like :meth:`get`, but ``None`` instead of waiting when every candidate for
        eviction is pinned (for downloads ahead of the reader)."""
        return self._get(_Want(key, size, crc32c, fetch, name or key, False, sha256))

    def claim(self, nbytes: int, *, what: str, **how: Any) -> Claim:
        """Claim ``nbytes`` of the budget for pins (the NOTE's Claims): the claim, or
        :class:`CacheFullError` naming what is claimed already, the budget and the fixes;
        ``how``: the ``group``, ``shared``, ``cap`` and ``fixes`` of :func:`.claims.claim`."""
        self._ensure_dirs()
        with self._accounting():
            return claim(self.root, self.limit, nbytes, what=what, **how)

    def claims(self) -> list[dict[str, Any]]:
        """The live claims: ``bytes``, ``group``, ``what`` and ``pid`` of each."""
        if not os.path.isdir(self.root):
            return []
        with self._accounting():
            return live_claims(self.root)

    def usage(self) -> int:
        """Bytes held by the cache's files, temporary ones included (a download in progress
        counts at least what it reserved)."""
        if not os.path.isdir(self.root):
            return 0
        entries, tmp = self._scan()
        return sum(e[1] for e in entries.values()) + sum(t[1] for t in tmp)

    def clear(self) -> None:
        """Remove every file that no process pins or is downloading."""
        if not os.path.isdir(self.root):
            return
        self._ensure_dirs()
        with self._accounting():
            self._drop_tmp()
            entries, _ = self._scan()
            for key in entries:
                self._evict(key)

    # -- paths and locks --------------------------------------------------------------------

    def _path(self, key: str, suffix: str) -> str:
        return os.path.join(self.root, "entries", key + suffix)

    def _ensure_dirs(self) -> None:
        if self._ready:
            return
        for sub in ("", "entries", "locks", "tmp"):
            path = os.path.join(self.root, sub) if sub else self.root
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
            if stat.S_IMODE(st.st_mode) != 0o700 and owned_by_user(st):
                os.chmod(path, 0o700)
        self._ready = True

    def _open_lock(self, key: str) -> int:
        return open_lock(os.path.join(self.root, "locks", key))

    @contextlib.contextmanager
    def _accounting(self) -> Iterator[None]:
        fd = open_lock(os.path.join(self.root, "lock"))
        try:
            lock(fd)
            yield
        finally:
            close_lock(fd)

    def _try_lock(self, key: str, *, shared: bool) -> int | None:
        """The entry's lock file descriptor, locked without waiting, or None when held."""
        fd = self._open_lock(key)
        try:
            lock(fd, shared=shared, block=False)
        except BlockingIOError:
            close_lock(fd)
            return None
        return fd

    # -- get --------------------------------------------------------------------------------

    def _get(self, want: _Want) -> Pin | None:
        key, size = want.key, want.size
        _check_args(key, size, want.crc)
        if size + MARKER_RESERVE > self.limit:
            raise CacheFullError(
                f"{want.label} is {size_text(size)}, more than the whole budget of the shard "
                f"cache {self.root} ({size_text(self.limit)}, {MARKER_RESERVE} bytes of it kept "
                f"per entry for its marker); set cache_limit= to at least "
                f"{size_text(size + MARKER_RESERVE)}"
            )
        self._ensure_dirs()
        fd = self._open_lock(key)
        try:
            pin = self._lock_and_fill(fd, want)
        except BaseException:
            close_lock(fd)
            raise
        if pin is None:
            close_lock(fd)
        return pin

    def _lock_and_fill(self, fd: int, want: _Want) -> Pin | None:
        poll = _Poll(self.wait)
        while True:
            lock(fd, shared=True)  # waits while another process downloads the key
            if self._valid(want):
                with contextlib.suppress(OSError):
                    os.utime(self._path(want.key, MARK))
                return Pin(self._path(want.key, DATA), want.key, fd)
            unlock(fd)
            try:
                lock(fd, block=False)
            except BlockingIOError:
                if poll.expired():
                    raise StorageError(
                        f"the shard cache's copy of {want.label} ({self._path(want.key, DATA)}) "
                        "does not match its verification marker, and another reader still pins "
                        f"it; waited {self.wait:g} s for that pin to go. Stop the readers of "
                        f"{self.root} and retry, or call ShardCache.clear()"
                    ) from None
                continue
            if self._valid(want):  # another process finished it between our two locks
                unlock(fd)
                continue
            return self._fill(fd, want)

    def _valid(self, want: _Want) -> bool:
        marker = read_marker(self._path(want.key, MARK))
        try:
            st = os.lstat(self._path(want.key, DATA))
        except OSError:
            return False
        return (
            stat.S_ISREG(st.st_mode)
            and marker.get("v") == 1
            and marker.get("size") == want.size == st.st_size
            and marker.get("ino") == st.st_ino
            and marker.get("mtime_ns") == st.st_mtime_ns
            and (want.crc is None or marker.get("crc32c") == want.crc)
            and (want.sha256 is None or marker.get("sha256") == want.sha256)
        )

    def _fill(self, fd: int, want: _Want) -> Pin | None:
        """Download while holding the entry lock ``LOCK_EX``; the pin, or None when
        ``want.wait_for_room`` is false and the room is pinned."""
        for suffix in (MARK, DATA):  # an old copy, whose marker did not match
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(want.key, suffix))
        self._drop_tmp(want.key)
        part = self._reserve(want)
        if part is None:
            return None
        mark = None
        try:
            self._download(part, want)
            mark = self._write_marker(part, want)
            with self._accounting():
                os.replace(part, self._path(want.key, DATA))
                os.replace(mark, self._path(want.key, MARK))
                fsync_dir(os.path.join(self.root, "entries"))
                lock(fd, shared=True)  # no evictor runs while the lock changes kind
        except BaseException as exc:
            for path in (part, mark):
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
                raise self._disk_full(want) from exc
            raise
        return Pin(self._path(want.key, DATA), want.key, fd)

    def _download(self, part: str, want: _Want) -> None:
        problems: list[str] = []
        for attempt in range(2):
            with os.fdopen(os.open(part, os.O_WRONLY | NOFOLLOW), "wb") as out:
                if attempt:
                    out.truncate(0)
                    preallocate(out.fileno(), want.size)
                want.fetch(out)
                out.flush()
                os.fsync(out.fileno())
            problem = check_file(part, want.size, want.crc, want.sha256)
            if problem is None:
                return
            problems.append(problem)
        raise CorruptRecordError(
            want.label,
            None,
            f"downloaded twice into the shard cache {self.root} and neither copy passed the "
            f"check ({'; then '.join(problems)}); the stored object does not match the size "
            "and checksum its manifest gives: re-upload it or rewrite the manifest (for a collection of tars: run `stoker index` again)",
        )

    def _write_marker(self, part: str, want: _Want) -> str:
        st = os.stat(part)
        body: dict[str, Any] = {
            "v": 1,
            "size": want.size,
            "crc32c": want.crc,
            "sha256": want.sha256,
        }
        body.update(ino=st.st_ino, mtime_ns=st.st_mtime_ns, name=want.label[:200])
        raw = json.dumps(body).encode()[: MARKER_RESERVE - 1]
        name = f"{want.key}.{os.getpid()}.{secrets.token_hex(4)}{MARK_TMP}"
        path = os.path.join(self.root, "tmp", name)
        fd = os.open(path, NEW_FILE, 0o600)
        try:
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        return path

    # -- room -------------------------------------------------------------------------------

    def _reserve(self, want: _Want) -> str | None:
        """Make room for the download and create the ``.part`` file holding it; None when
        ``want.wait_for_room`` is false and the room is pinned."""
        need = want.size + MARKER_RESERVE
        poll = _Poll(self.wait)
        while True:
            with self._accounting():
                self._drop_tmp()
                entries, tmp = self._scan()
                used = sum(e[1] for e in entries.values()) + sum(t[1] for t in tmp)
                held: list[tuple[str, int]] = []
                for other in sorted(entries, key=lambda k: (entries[k][0], k)):
                    if used + need <= self.limit:
                        break
                    if self._evict(other):
                        used -= entries[other][1]
                    else:
                        named = read_marker(self._path(other, MARK)).get("name") or other
                        held.append((named, entries[other][1]))
                if used + need <= self.limit:
                    return self._create_part(want, need)
            if not want.wait_for_room:
                return None
            if poll.expired():
                held += [(t[0] + " (downloading)", t[1]) for t in tmp]
                raise self._no_room(want, used, held)

    def _create_part(self, want: _Want, need: int) -> str:
        name = f"{want.key}.{need}.{os.getpid()}.{secrets.token_hex(4)}{PART}"
        path = os.path.join(self.root, "tmp", name)
        fd = os.open(path, NEW_FILE, 0o600)
        try:
            preallocate(fd, want.size)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            if exc.errno in _DISK_FULL:
                raise self._disk_full(want) from exc
            raise
        os.close(fd)
        return path

    def _evict(self, key: str) -> bool:
        """Delete an entry nobody pins (call under the cache lock); False when it is held."""
        if key.startswith("/"):  # a file that is not an entry's: nobody locks it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, "entries", key[1:]))
            return True
        fd = self._try_lock(key, shared=False)
        if fd is None:
            return False
        try:
            for suffix in (MARK, DATA):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(key, suffix))
        finally:
            close_lock(fd)
        return True

    def _scan(self) -> tuple[dict[str, list[int]], list[tuple[str, int]]]:
        """{key: [last use ns, bytes]} of the entries (a file that is not an entry's is keyed
        "/name", last use 0), and (key, bytes) of the temporary files (a ``.part`` counts at
        least its reservation)."""
        entries: dict[str, list[int]] = {}
        for name, st in listing(os.path.join(self.root, "entries")):
            key, suffix = split_entry(name)
            entry = entries.setdefault(key, [0, 0])
            entry[1] += st.st_size
            if suffix == MARK:
                entry[0] = st.st_mtime_ns
        tmp = []
        for name, st in listing(os.path.join(self.root, "tmp")):
            parsed = parse_tmp(name)
            reserve = parsed[1] if parsed is not None else 0
            tmp.append((parsed[0] if parsed else name, max(st.st_size, reserve)))
        return entries, tmp

    def _drop_tmp(self, key: str | None = None) -> None:
        """Remove ``key``'s temporary files (its caller holds its lock ``LOCK_EX``), or with no
        key, under the cache lock, those whose download is not running (a live downloader
        holds its entry lock ``LOCK_EX``, so ``LOCK_SH | LOCK_NB`` fails)."""
        folder = os.path.join(self.root, "tmp")
        for name, _ in listing(folder):
            parsed = parse_tmp(name)
            if key is not None and (parsed is None or parsed[0] != key):
                continue
            if key is None and parsed is not None:
                fd = self._try_lock(parsed[0], shared=True)
                if fd is None:
                    continue
                close_lock(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))

    def _disk_full(self, want: _Want) -> CacheFullError:
        try:
            free = f"{size_text(shutil.disk_usage(self.root).free)} free there"
        except OSError:
            free = "free space unknown"
        return CacheFullError(
            f"no space left on the disk of the shard cache {self.root} for {want.label} "
            f"({size_text(want.size)}; {free}). Free space on that disk, set a smaller "
            f"cache_limit= (now {size_text(self.limit)}), or point cache_dir= at a larger disk"
        )

    def _no_room(self, want: _Want, used: int, held: list[tuple[str, int]]) -> CacheFullError:
        shown = ", ".join(f"{name} ({size_text(n)})" for name, n in held[:8])
        if len(held) > 8:
            shown += f", and {len(held) - 8} more"
        return CacheFullError(
            f"the shard cache {self.root} has no room for {want.label} ({size_text(want.size)}) "
            f"after waiting {self.wait:g} s: its budget is {size_text(self.limit)} and "
            f"{size_text(used)} are in use, "
            f"held by pinned entries and downloads in progress: {shown or 'none'}. Raise "
            "cache_limit=, or lower prefetch_shards= or num_workers so fewer shards are "
            "pinned at once"
        )


# -- helpers ----------------------------------------------------------------------------------


def default_limit(root: str) -> int:
    """The default budget for a cache at ``root``: see :data:`DEFAULT_LIMIT_FRACTION`."""
    probe = root
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    held = 0
    if os.path.isdir(root):
        for sub in ("entries", "tmp"):
            held += sum(s.st_size for _, s in listing(os.path.join(root, sub)))
    room = shutil.disk_usage(probe).free + held  # statvfs's f_bavail, on every platform
    return max(1, min(DEFAULT_LIMIT_MAX, int(room * DEFAULT_LIMIT_FRACTION)))


def _check_args(key: str, size: int, crc: int | None) -> None:
    if not is_key(key):
        raise ValueError(
            f"cache key must be 1 to 200 characters of A-Z, a-z, 0-9, '.', '_' or '-' "
            f"(and not '.' or '..'), got {key!r}"
        )
    if type(size) is not int or size < 0:
        raise ValueError(f"size must be an int number of bytes >= 0, got {size!r}")
    if crc is not None and (type(crc) is not int or not 0 <= crc < 2**32):
        raise ValueError(f"crc32c must be None or an unsigned 32-bit int, got {crc!r}")
