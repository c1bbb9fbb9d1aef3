"""Shared memory for the loader, allocated up front: anonymous files (:class:`SharedFd`, a
``memfd``) for the batch ring and a folder's listing, and named segments in ``/dev/shm``
(:class:`Segment`, swept when stale) for an array source's copy.

An anonymous file has no name: it is handed to a worker as a file descriptor while the worker
is started (:meth:`SharedFd.__reduce__`, the fork server's fd passing), mapped there and the
descriptor closed. The kernel frees it with the last process that maps it or holds it open, so
a SIGKILL of any process can leave nothing behind, and it is not charged to the ``/dev/shm``
mount (Docker's default is 64 MB) but to memory (and the memory cgroup) like any other page.

A named segment is a file ``/dev/shm/stoker_<pid>_<starttime>_<rand>``: ``pid`` and ``starttime``
(the owner's start time in clock ticks since boot, from ``/proc/<pid>/stat``) identify the
process that created it, so :func:`cleanup_stale` can tell a live owner from a dead one even
after the pid was reused.

- Space is reserved with ``posix_fallocate`` at creation, so a full ``/dev/shm`` is an
  ``ENOSPC`` error there and then, never a ``SIGBUS`` when a worker first touches a page.
- Mappings are made with libc ``mmap`` (no file descriptor is kept open) and wrapped in a
  :class:`Mapping` object whose arrays keep it alive: the memory is unmapped when the last
  array view of it is gone, so a view kept past ``close()`` stays valid instead of crashing.
- Python's ``multiprocessing.shared_memory`` is not used: on 3.11/3.12 it registers segments
  with the resource tracker, which warns about (and unlinks) segments other processes still use.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.errors import SharedMemoryError
from stoker._core.oscompat import at_fork_child, libc_function
from stoker._core.system import memory_available_bytes

__all__ = [
    "SHM_DIR",
    "Mapping",
    "Segment",
    "SharedFd",
    "memory_available_bytes",
    "probing",
    "cleanup_stale",
    "create_segment",
    "populate",
    "preflight",
    "reserve",
    "process_start_time",
    "shm_free_bytes",
]

SHM_DIR = "/dev/shm"
PREFIX = "stoker_"
MiB = 1 << 20

# libc's mmap, munmap and madvise (None where the process has no libc to open: Mapping then
# maps with Python's mmap, and populate() is a no-op)
_c_void_p, _c_size_t, _c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_mmap = libc_function(
    "mmap", _c_void_p, [_c_void_p, _c_size_t, _c_int, _c_int, _c_int, ctypes.c_long]
)
_munmap = libc_function("munmap", _c_int, [_c_void_p, _c_size_t])
_madvise = libc_function("madvise", _c_int, [_c_void_p, _c_size_t, _c_int])
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = mmap.PAGESIZE
_can_populate = _madvise is not None

# Segments this process created and has not unlinked yet (for the atexit sweep).
_owned: set[str] = set()
_owned_lock = threading.Lock()
_owner_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _owner_pid, _owned_lock
    _owner_pid = os.getpid()
    _owned.clear()
    _owned_lock = threading.Lock()


at_fork_child(_after_fork_in_child)


def process_start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _segment_name() -> str:
    pid = os.getpid()
    start = process_start_time(pid) or 0
    return f"{PREFIX}{pid}_{start}_{secrets.token_hex(4)}"


class Mapping:
    """A shared mapping of ``size`` bytes; ``array()`` gives a uint8 view that keeps it alive.
    Made with libc's ``mmap`` (no descriptor kept), or with Python's ``mmap`` where there is no
    libc to call (it keeps a duplicate descriptor, closed with the mapping)."""

    def __init__(self, fd: int, size: int, *, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.size = size
        self.writable = writable
        self.addr: int | None = None
        self._py: mmap.mmap | None = None
        if size == 0:
            return
        if _mmap is None:
            self._py = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
            self.addr = np.frombuffer(self._py, dtype=np.uint8).ctypes.data
            return
        addr = _mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise SharedMemoryError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
        self.addr = addr

    @property
    def __array_interface__(self) -> dict:
        if self.addr is None:
            return {"shape": (0,), "typestr": "|u1", "data": None, "version": 3}
        return {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.addr, not self.writable),
            "version": 3,
        }

    def array(self) -> np.ndarray:
        return np.asarray(self)

    def __del__(self) -> None:
        if self.addr is not None and self._py is None:
            _munmap(self.addr, self.size)
        self.addr = None  # a Python mmap goes with this object (no array refers to it now)


@dataclass(frozen=True)
class Segment:
    """A named segment: pickles as its name and size; ``attach()`` maps it in any process."""

    name: str
    size: int

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, self.name)

    def attach(self, *, writable: bool = True) -> Mapping:
        try:
            fd = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError as e:
            raise SharedMemoryError(
                e.errno, f"cannot open shared-memory segment {self.path}: {e.strerror}"
            ) from e
        try:
            return Mapping(fd, self.size, writable=writable)
        finally:
            os.close(fd)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with _owned_lock:
            _owned.discard(self.name)


_probe = threading.local()


@contextlib.contextmanager
def probing() -> Any:
    """While active (in this thread), a :class:`SharedFd` pickles as a placeholder: for
    pickles that are only inspected (``_process.names_main``), never unpickled."""
    _probe.on = True
    try:
        yield
    finally:
        _probe.on = False


def is_probing() -> bool:
    return bool(getattr(_probe, "on", False))


def handing_to_child() -> bool:
    """Whether a pickle made now goes to a process being started (its fds go with it)."""
    from multiprocessing import context

    return context.get_spawning_popen() is not None


class SharedFd:
    """An anonymous shared file (``memfd_create``, close-on-exec) of ``size`` bytes.

    In the process that made it, :attr:`owner` is true and the descriptor stays open (to map
    it, reserve ranges and hand it to workers started later) until :meth:`close`. It pickles
    only into a process being started by ``multiprocessing`` (its Popen duplicates the
    descriptor for the child: the fork server receives it over its socket); unpickled there,
    :meth:`attach` maps it once and closes the descriptor. Pickled anywhere else it raises
    ``TypeError``, except under :func:`probing`.
    """

    def __init__(self, fd: int, size: int, *, owner: bool) -> None:
        self._fd: int | None = fd
        self.size = size
        self.owner = owner
        self._pid = os.getpid()

    @classmethod
    def create(cls, size: int, *, name: str, reserved: bool = True) -> tuple[SharedFd, Mapping]:
        """A new anonymous file of ``size`` bytes, mapped writable here; reserved
        (``posix_fallocate``) unless ``reserved=False`` (then :func:`reserve` a range before
        anything touches it)."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError as e:
            raise SharedMemoryError(
                e.errno, f"cannot create anonymous shared memory: {e.strerror}"
            ) from e
        try:
            if size:
                if reserved:
                    _reserve_fd(fd, 0, size, size, anonymous=True)
                else:
                    os.ftruncate(fd, size)  # sparse until reserve()
            mapping = Mapping(fd, size, writable=True)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, owner=True), mapping

    def fileno(self) -> int:
        if self._fd is None:
            raise SharedMemoryError(errno.EBADF, "the shared memory's descriptor is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def attach(self, *, writable: bool = True) -> Mapping:
        """Map it; a received (not owned) descriptor is closed once mapped."""
        mapping = Mapping(self.fileno(), self.size, writable=writable)
        if not self.owner:
            self.close()
        return mapping

    def close(self) -> None:
        """Close the descriptor (the memory lives on while a mapping of it does); only in the
        process that holds it, never in a fork that inherited the object."""
        fd, self._fd = self._fd, None
        if fd is not None and os.getpid() == self._pid:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __reduce__(self) -> tuple:
        if is_probing():
            return _placeholder, (self.size,)
        from multiprocessing import context

        popen = context.get_spawning_popen()
        if popen is None or not hasattr(popen, "duplicate_for_child"):
            raise TypeError(
                "anonymous shared memory crosses only into a process being started "
                "(its descriptor goes with the start)"
            )
        return _received, (popen.DupFd(popen.duplicate_for_child(self.fileno())), self.size)


def _received(dupfd: Any, size: int) -> SharedFd:
    return SharedFd(dupfd.detach(), size, owner=False)


def _placeholder(size: int) -> SharedFd:  # pragma: no cover - probing pickles are not loaded
    raise TypeError("a probing pickle of anonymous shared memory cannot be loaded")


def shm_free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def preflight(need: int, *, slots: int, what: str = "slots", where: str = "shm") -> None:
    """Refuse (``SharedMemoryError``) when there is less than ``need`` bytes: free in
    ``/dev/shm`` (``where="shm"``, named segments) or available memory (``where="memory"``,
    anonymous ones: :func:`memory_available_bytes`)."""
    if where == "memory":
        try:
            free = memory_available_bytes()
        except OSError:
            return  # nothing to compare with: posix_fallocate still checks
        if free < need:
            raise SharedMemoryError(
                errno.ENOMEM,
                f"need {need / MiB:.1f} MiB of memory for {slots} {what}, {free / MiB:.1f} MiB "
                "is available (MemAvailable, capped by the memory cgroup's limit); lower "
                "prefetch/batch_size/workers or give the job more memory",
            )
        return
    try:
        free = shm_free_bytes()
    except OSError as e:
        raise SharedMemoryError(
            e.errno, f"{SHM_DIR} is not usable ({e.strerror}); the loader needs it for batches"
        ) from e
    if free < need:
        raise SharedMemoryError(
            errno.ENOSPC,
            f"need {need / MiB:.1f} MiB for {slots} {what}, {SHM_DIR} has {free / MiB:.1f} MiB "
            "free; lower prefetch/batch_size/workers or enlarge /dev/shm (docker --shm-size)",
        )


def _reserve_fd(fd: int, offset: int, length: int, total: int, *, anonymous: bool = False) -> None:
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if anonymous:
            where, room, fix = (
                "of shared memory",
                lambda: f"{memory_available_bytes() / MiB:.1f} MiB of memory is available",
                "give the job more memory",
            )
        else:
            where, room, fix = (
                f"in {SHM_DIR}",
                lambda: f"{SHM_DIR} has {shm_free_bytes() / MiB:.1f} MiB free",
                "enlarge /dev/shm (docker --shm-size)",
            )
        free = ""
        with contextlib.suppress(OSError):
            free = f"; {room()}"
        raise SharedMemoryError(
            e.errno,
            f"cannot reserve {total / MiB:.1f} MiB {where} ({e.strerror}){free}; "
            f"lower prefetch/batch_size/workers or {fix}",
        ) from e


def populate(arr: np.ndarray) -> None:
    """Map the pages under ``arr`` (a view of a reserved segment) writable in one call
    (``MADV_POPULATE_WRITE``) instead of one page fault per 4 KiB on first write: about half
    the cost on first touch. Best effort: on a kernel without it, the writes fault as usual."""
    global _can_populate
    if not _can_populate or arr.nbytes == 0:
        return
    start = arr.__array_interface__["data"][0]
    lo = start - start % _PAGE
    hi = start + arr.nbytes
    if _madvise(lo, hi - lo, _MADV_POPULATE_WRITE) != 0:
        if ctypes.get_errno() == errno.EINVAL:  # older kernel: never ask again
            _can_populate = False


def reserve(ring: SharedFd | Any, offset: int, length: int) -> None:
    """``posix_fallocate`` bytes ``[offset, offset + length)`` of ``ring``: afterwards no page
    there can fault with SIGBUS for lack of space. Pages already reserved are left as they
    are, so reserving a range twice is harmless."""
    if length <= 0:
        return
    if isinstance(ring, SharedFd):
        _reserve_fd(ring.fileno(), offset, length, ring.size, anonymous=True)
    else:  # the portable engine's ring (_named)
        ring.reserve(offset, length)


def create_segment(size: int) -> tuple[Segment, Mapping]:
    """Create and map a new segment of ``size`` bytes, reserved (``posix_fallocate``)."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    name = _segment_name()
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        raise SharedMemoryError(
            e.errno, f"cannot create shared-memory segment {path}: {e.strerror}"
        ) from e
    seg = Segment(name, size)
    with _owned_lock:
        _owned.add(name)
    try:
        if size:
            _reserve_fd(fd, 0, size, size)
        mapping = Mapping(fd, size, writable=True)
    except BaseException:
        os.close(fd)
        seg.unlink()
        raise
    os.close(fd)
    return seg, mapping


def unlink_owned() -> None:
    """Unlink every segment this process created and still owns (atexit / last resort).

    Does nothing in a forked child, which inherits the set but owns none of it."""
    if os.getpid() != _owner_pid:
        return
    with _owned_lock:
        names = list(_owned)
        _owned.clear()
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))


def _owner_alive(name: str) -> bool:
    parts = name[len(PREFIX) :].split("_")
    if len(parts) < 3:
        return True  # not one of ours in the expected shape: leave it alone
    try:
        pid, start = int(parts[0]), int(parts[1])
    except ValueError:
        return True
    now = process_start_time(pid)
    return now is not None and (start == 0 or now == start)


def cleanup_stale(*, dry_run: bool = False) -> list[str]:
    """Remove ``/dev/shm/stoker_*`` segments whose owner process is dead; return their names.

    A segment is stale when its owner pid no longer exists, is a zombie, or is now a different
    process (its start time differs from the one recorded in the name).
    """
    try:
        names = sorted(os.listdir(SHM_DIR))
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(PREFIX) or _owner_alive(name):
            continue
        if not dry_run:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                continue
            except OSError:
                continue
        removed.append(name)
    return removed
