"""The loaders of this node: every loader with a batch ring registers it in one node-wide
folder, so that a new ring's preflight counts what the other loaders have yet to reserve, and
the doctor can report the node's total.

NOTE: the registry

Folder ``<temp dir>/stoker-loaders-<uid>/`` (a 0700 folder in the node's temporary folder,
``$TMPDIR`` or ``/tmp``, which every process of the node, every rank of a job, sees; nothing in
it is large, and ``/dev/shm`` stays free of names). ``lock`` is the registry's lock (flock). Each live ring has a file ``PID.RAND.json``
that its loader holds ``LOCK_EX`` for as long as the ring lives, holding JSON: ``ring`` (its
bytes), ``reserved`` (bytes reserved with ``posix_fallocate`` so far), ``workers``, ``pid``,
``what`` (the source) and, for the portable engine's named ring, ``segment`` (its name). A
file whose lock is free belongs to a dead process and is removed by the next reader, which
first unlinks the named segment it lists: after a SIGKILL that took the resource tracker
too (a signal to the process group), the next loader start on the node sweeps the ring, on
macOS as well, where no shared-memory name can be listed.

A ring's memory is taken when its slots are reserved, slot by slot, as the loader first
dispatches to them (``_feed``), and what is reserved already shows in ``MemAvailable``. So a
new ring fits when ``MemAvailable`` (capped by the memory cgroup) holds it together with the
part of every other live ring that is not reserved yet. Preflight and registration happen
under the registry's lock, so eight ranks starting at once see each other; each reservation
updates its entry. Entries are written in place through the held descriptor (a few hundred
bytes; a reader takes the registry's lock, so it never sees half an update).

A process that dies (any signal) loses its flock, and with it the entry; its memfd ring goes
with its last mapping. A forked child closes the descriptors it inherited
(``os.register_at_fork``), so it never keeps a parent's entry alive.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stoker._core.errors import SharedMemoryError
from stoker._core.held import live_bodies
from stoker._core.oscompat import (
    OWN_FILE,
    at_fork_child,
    lock,
    locks_available,
    owned_by_user,
    user_id,
    write_at,
)
from stoker.loader import _shm

__all__ = ["NodeEntry", "live_rings", "node_loaders", "preflight_and_register", "registry_dir"]

MiB = 2**20
_HELD: set[int] = set()  # this process's entry descriptors (closed in a forked child)


def registry_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"stoker-loaders-{user_id()}")


@dataclass(frozen=True)
class Ring:
    """One live loader's ring, as its entry says."""

    pid: int
    ring: int
    reserved: int
    workers: int
    what: str

    @property
    def pending(self) -> int:
        """Bytes of the ring not reserved yet (not in ``MemAvailable``'s count)."""
        return max(0, self.ring - self.reserved)


class NodeEntry:
    """This loader's entry in the registry: :meth:`reserved` as slots are reserved,
    :meth:`close` when the ring goes (process exit does it too)."""

    def __init__(self, path: str, fd: int, body: dict[str, Any]) -> None:
        self._path, self._fd, self._body, self._pid = path, fd, body, os.getpid()

    def add_reserved(self, nbytes: int) -> None:
        if self._fd < 0 or self._pid != os.getpid():
            return
        self._body["reserved"] = min(self._body["ring"], self._body["reserved"] + int(nbytes))
        with contextlib.suppress(OSError), _locked():
            _write(self._fd, self._body)

    def name_segment(self, name: str) -> None:
        """The ring is the named segment ``name`` (the portable engine): whoever finds this
        entry's process dead unlinks it."""
        if self._fd < 0 or self._pid != os.getpid():
            return
        self._body["segment"] = name
        with contextlib.suppress(OSError), _locked():
            _write(self._fd, self._body)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0 or self._pid != os.getpid():
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        _HELD.discard(fd)
        os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def preflight_and_register(
    ring: int, *, slots: int, workers: int, what: str, reserved: int = 0, check: bool = True
) -> NodeEntry | None:
    """Refuse (``SharedMemoryError``) a ring of ``ring`` bytes that the memory available, less
    what the node's other live rings have yet to reserve, cannot hold; else register it, with
    ``reserved`` of its bytes reserved already (``check=False``: a kept ring, whose memory was
    checked when it was made). ``None`` (no registry) where the registry's folder cannot be
    used: then the ring is compared with the memory available alone."""
    try:
        folder = _ensure_dir()
    except OSError:
        folder = None
    if folder is None:
        if check:
            _check(ring, slots, [])
        return None
    with _locked():
        others = _scan(folder)
        if check:
            _check(ring, slots, others)
        path = os.path.join(folder, f"{os.getpid()}.{secrets.token_hex(6)}.json")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OWN_FILE, 0o600)
        _HELD.add(fd)
        body: dict[str, Any] = {"v": 1, "pid": os.getpid(), "ring": int(ring)}
        body.update(reserved=int(reserved), workers=int(workers), what=what[:300])
        lock(fd, block=False)
        _write(fd, body)
    return NodeEntry(path, fd, body)


def live_rings() -> list[Ring]:
    """Every live loader ring of this node (this process's too)."""
    folder = registry_dir()
    if not os.path.isdir(folder):
        return []
    with _locked():
        return _scan(folder)


def node_loaders() -> list[dict[str, Any]]:
    """The live loaders of this node with a batch ring (every process of this user): for each,
    ``pid``, ``ring`` and ``reserved`` bytes, ``workers`` and ``what`` it reads."""
    return [
        {"pid": r.pid, "ring": r.ring, "reserved": r.reserved, "workers": r.workers, "what": r.what}
        for r in live_rings()
    ]


def _check(ring: int, slots: int, others: list[Ring]) -> None:
    try:
        free = _shm.memory_available_bytes()
    except OSError:
        return  # nothing to compare with: posix_fallocate still checks
    pending = sum(r.pending for r in others)
    if ring + pending <= free:
        return
    text = (
        f"need {ring / MiB:.1f} MiB of memory for {slots} batch slots, {free / MiB:.1f} MiB is "
        "available (MemAvailable, capped by the memory cgroup's limit)"
    )
    if others:
        pids = ", ".join(str(r.pid) for r in others[:8]) + (" ..." if len(others) > 8 else "")
        text += (
            f" and {len(others)} other loader(s) on this node (processes {pids}) have yet to "
            f"reserve {pending / MiB:.1f} MiB of their rings"
        )
    raise SharedMemoryError(
        errno.ENOMEM,
        text + "; lower prefetch/batch_size/workers, run fewer loaders per node, or give the "
        "job more memory",
    )


def _ensure_dir() -> str:
    if not locks_available():
        raise OSError(errno.ENOSYS, "no file locks here: the node registry is off")
    folder = registry_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or not owned_by_user(st):
        raise OSError(errno.EPERM, f"{folder} is not this user's folder")
    return folder


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    fd = os.open(os.path.join(registry_dir(), "lock"), os.O_RDWR | os.O_CREAT | OWN_FILE, 0o600)
    try:
        lock(fd)
        yield
    finally:
        os.close(fd)


def _write(fd: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    write_at(fd, raw, 0)
    os.ftruncate(fd, len(raw))


def _scan(folder: str) -> list[Ring]:
    """The live entries (under the registry's lock); a dead process's file is removed."""
    return [r for r in map(_ring_of, live_bodies(folder, _unlink_segment)) if r is not None]


def _unlink_segment(body: Any) -> None:
    """Unlink the named ring a dead loader's entry lists (only a name stoker makes)."""
    name = body.get("segment") if isinstance(body, dict) else None
    if isinstance(name, str) and name.startswith(_shm.PREFIX) and "/" not in name:
        from stoker.loader._named import unlink_name

        unlink_name(name)


def _ring_of(body: Any) -> Ring | None:
    try:
        return Ring(
            int(body["pid"]),
            int(body["ring"]),
            int(body["reserved"]),
            int(body["workers"]),
            str(body.get("what", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _forget() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


at_fork_child(_forget)
