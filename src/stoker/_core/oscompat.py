"""What differs between operating systems under the loader, the shard cache and pack, in one
place: file locks, the C library, fork hooks, the user's id and positional file I/O. Every other
module calls these and never imports ``fcntl`` or ``msvcrt`` or opens libc itself, so that
``import stoker`` and the portable loader engine work where those do not exist.

File locks (:func:`lock`, :func:`unlock`) are advisory, whole-file and per open file, and go
with their process, whatever ends it:

- POSIX: ``fcntl.flock`` (shared or exclusive).
- Windows: ``LockFileEx`` on the descriptor's handle (``msvcrt.get_osfhandle``), shared or
  exclusive. It locks one byte far past any content (:data:`WINDOWS_LOCK_OFFSET`): a Windows
  lock is mandatory over the bytes it covers, and a reader must still read a held file's JSON.
  ``msvcrt.locking`` is not used: it has no shared lock, and its blocking mode gives up after
  10 s.
- Neither: :func:`locks_available` is False and :func:`lock` raises ``OSError(ENOSYS)``; the
  callers that can run without a lock (the loader's node registry) then do without it.

:func:`libc` is the C library of this process (``ctypes.CDLL(None)``, which names the
symbols the process already has), or ``None`` where that cannot be opened (Windows): the
callers fall back to Python's own ``mmap`` or skip a hint.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "OWN_FILE",
    "WINDOWS_LOCK_OFFSET",
    "at_fork_child",
    "libc",
    "libc_function",
    "lock",
    "locks_available",
    "owned_by_user",
    "read_at",
    "unlock",
    "user_id",
    "write_at",
]

try:
    import fcntl as _fcntl
except ImportError:  # Windows
    _fcntl = None  # type: ignore[assignment,unused-ignore]

#: ``os.open`` flags for the small files stoker keeps for itself (locks, markers, registry
#: entries): close-on-exec and no symlink followed where those exist, binary on Windows
OWN_FILE = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
WINDOWS_LOCK_OFFSET = 1 << 62  # the byte a Windows lock covers: past any file's content
_LOCKFILE_FAIL_IMMEDIATELY = 0x1
_LOCKFILE_EXCLUSIVE_LOCK = 0x2
_ERROR_LOCK_VIOLATION = 33
_ERROR_IO_PENDING = 997


def locks_available() -> bool:
    """Whether this platform has the file locks :func:`lock` takes."""
    return _fcntl is not None or sys.platform == "win32"


def lock(fd: int, *, shared: bool = False, block: bool = True) -> None:
    """Lock the open file ``fd`` (shared or exclusive). With ``block=False`` a lock held
    elsewhere is ``BlockingIOError``; with ``block=True`` it waits. Taking the other kind
    while holding one converts it on POSIX; on Windows :func:`unlock` first."""
    if _fcntl is not None:
        how = _fcntl.LOCK_SH if shared else _fcntl.LOCK_EX
        _fcntl.flock(fd, how if block else how | _fcntl.LOCK_NB)
    elif sys.platform == "win32":
        flags = (0 if shared else _LOCKFILE_EXCLUSIVE_LOCK) | (
            0 if block else _LOCKFILE_FAIL_IMMEDIATELY
        )
        _windows_lock("LockFileEx", fd, flags)
    else:
        raise OSError(
            errno.ENOSYS, "this platform has no file locks (neither flock nor LockFileEx)"
        )


def unlock(fd: int) -> None:
    """Release this descriptor's lock (closing the last descriptor of the file does too)."""
    if _fcntl is not None:
        _fcntl.flock(fd, _fcntl.LOCK_UN)
    elif sys.platform == "win32":
        _windows_lock("UnlockFileEx", fd, None)


class _Overlapped(ctypes.Structure):
    _fields_ = [
        ("Internal", ctypes.c_size_t),
        ("InternalHigh", ctypes.c_size_t),
        ("Offset", ctypes.c_uint32),
        ("OffsetHigh", ctypes.c_uint32),
        ("hEvent", ctypes.c_void_p),
    ]


def _windows_lock(call: str, fd: int, flags: int | None) -> None:
    """``LockFileEx(handle, flags, 0, 1, 0, &at)`` or ``UnlockFileEx(handle, 0, 1, 0, &at)``
    on one byte at :data:`WINDOWS_LOCK_OFFSET`."""
    import msvcrt

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
    handle = ctypes.c_void_p(msvcrt.get_osfhandle(fd))  # type: ignore[attr-defined,unused-ignore]
    at = _Overlapped(0, 0, WINDOWS_LOCK_OFFSET & 0xFFFFFFFF, WINDOWS_LOCK_OFFSET >> 32, None)
    if flags is None:
        ok = kernel32.UnlockFileEx(handle, 0, 1, 0, ctypes.byref(at))
    else:
        ok = kernel32.LockFileEx(handle, flags, 0, 1, 0, ctypes.byref(at))
    if ok:
        return
    err = ctypes.get_last_error()  # type: ignore[attr-defined,unused-ignore]
    if err in (_ERROR_LOCK_VIOLATION, _ERROR_IO_PENDING):
        raise BlockingIOError(errno.EAGAIN, "the file is locked by another process")
    raise OSError(errno.EIO, f"{call} failed with Windows error {err}")


@functools.cache
def libc() -> Any:
    """This process's C library (``ctypes.CDLL(None)``: the symbols it has already, without
    the ``ldconfig`` subprocess that ``find_library`` runs), or ``None`` where there is none
    to open that way (Windows)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError, AttributeError):
        return None


def libc_function(name: str, restype: Any, argtypes: list[Any]) -> Any:
    """The C function ``name`` of :func:`libc` with its types set, or ``None`` where there is
    no libc or no such function (callers degrade: a hint skipped, Python's ``mmap`` used)."""
    lib = libc()
    try:
        fn = getattr(lib, name) if lib is not None else None
    except AttributeError:
        return None
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


def at_fork_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in each forked child (``os.register_at_fork``); nothing where processes are
    never forked (Windows)."""
    register = getattr(os, "register_at_fork", None)
    if register is not None:
        register(after_in_child=fn)


def user_id() -> str:
    """This user, for per-user folder names: the uid on POSIX, the login name elsewhere."""
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return str(getuid())
    import getpass

    name = getpass.getuser()
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "user"


def owned_by_user(st: os.stat_result) -> bool:
    """Whether ``st`` (of a folder this process made or found) is this user's; True where the
    platform has no uids (Windows: the folder's ACL, inherited from the user's temp folder)."""
    getuid = getattr(os, "getuid", None)
    return getuid is None or st.st_uid == getuid()


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes of ``fd`` at ``offset`` (``os.pread``; seek and read elsewhere)."""
    pread = getattr(os, "pread", None)
    if pread is not None:
        return bytes(pread(fd, size, offset))
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, size)


def write_at(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset`` (``os.pwrite``; seek and write elsewhere)."""
    pwrite = getattr(os, "pwrite", None)
    view = memoryview(data)
    while view:
        if pwrite is not None:
            n = pwrite(fd, view, offset)
        else:
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.write(fd, view)
        view, offset = view[n:], offset + n
