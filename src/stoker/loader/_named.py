"""The portable engine's batch ring: one named shared-memory segment made with
``multiprocessing.shared_memory`` (POSIX shared memory on Linux and macOS, a named file
mapping on Windows), which pickles as its name and size, so a worker started with ``spawn``
maps it by name.

Ownership. The main process creates it (``SharedMemory(create=True)``, which registers the
name with ``multiprocessing``'s resource tracker), maps it a second time for its own views and
closes the ``SharedMemory`` object at once: its own mapping then has no exported buffers to
refuse a ``close()``, and a batch view kept past the loader's ``close()`` stays valid (the
mapping goes with its last view). :meth:`NamedRing.close` unlinks the name (POSIX) and
unregisters it.

Workers map the segment by name and never register it: before Python 3.13 a
``SharedMemory(name)`` attach registers the name with the resource tracker like a creation
does, and a tracker that outlives the attaching process unlinks the segment it did not make
(3.13 added ``track=False``). So a worker never builds a ``SharedMemory``: it opens the name
(``shm_open`` through the module ``multiprocessing.shared_memory`` itself uses; on Windows an
``mmap`` with the segment's ``tagname``) and maps it. The same code on every Python version.

Names. ``stoker_<pid>_<start>_<rand>`` as for ``_shm.Segment`` (owner pid and start time, so
``_shm.cleanup_stale`` sweeps a dead owner's segment on Linux), cut to 30 characters: macOS
limits a POSIX shared-memory name, with its leading ``/``, to 31. After a SIGKILL of main the
resource tracker (a process of its own, which sees main's end) unlinks what main had
registered; where it could not (it was killed too), the next loader start on the node unlinks
the name its ring's entry in the node registry lists (``_node``: no listing of names needed,
which macOS has not), and on Linux ``_shm.cleanup_stale`` sweeps it from ``/dev/shm`` as well.
On Windows a mapping is no file at all: it vanishes with its last handle, so nothing is left.

Reservation. Where ``posix_fallocate`` exists (Linux), :meth:`NamedRing.reserve` backs a range
of the segment before use, as the Linux engine does (a full ``/dev/shm`` is an error then, not
a ``SIGBUS`` in a worker). macOS backs a shared-memory object at ``ftruncate``; a Windows
mapping commits its pages at creation, so a lack of memory is an error there.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import sys
from typing import Any

import numpy as np

from stoker._core.errors import SharedMemoryError

__all__ = ["NAME_MAX", "NamedRing", "segment_name", "unlink_name"]

NAME_MAX = 30  # characters, without the leading "/" that POSIX adds (macOS: 31 with it)
_POSIX = os.name == "posix"


def segment_name(pid: int | None = None, start: int | None = None) -> str:
    """``stoker_<pid>_<start>_<rand>``, at most :data:`NAME_MAX` characters (the start time
    is dropped, as ``0``, when it does not fit beside 4 random hex digits)."""
    from stoker.loader._shm import PREFIX, process_start_time

    pid = os.getpid() if pid is None else pid
    start = (process_start_time(pid) or 0) if start is None else start
    head = f"{PREFIX}{pid}_{start}_"
    if len(head) + 4 > NAME_MAX:
        head = f"{PREFIX}{pid}_0_"
    return head + secrets.token_hex(8)[: NAME_MAX - len(head)]


def _map(name: str, size: int) -> Any:
    """Map segment ``name`` without registering it anywhere (see the module docstring); the
    mapping's ``array()`` is a uint8 view that keeps it. On POSIX the mapping is
    ``_shm.Mapping`` (no descriptor kept open: Python's ``mmap`` keeps a duplicate)."""
    if not _POSIX:  # Windows: open the named mapping by its tag
        return _Mapped(mmap.mmap(-1, size, tagname=name))  # type: ignore[call-arg,unused-ignore]
    import _posixshmem  # the module multiprocessing.shared_memory uses

    from stoker.loader._shm import Mapping

    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    except OSError as e:
        raise SharedMemoryError(
            e.errno, f"cannot open shared-memory segment {name}: {e.strerror}"
        ) from e
    try:
        return Mapping(fd, size, writable=True)
    finally:
        os.close(fd)


def unlink_name(name: str) -> None:
    """Unlink segment ``name`` left by a dead process (POSIX; gone already is fine)."""
    if not _POSIX:
        return  # a Windows mapping has no name left to unlink once its handles are gone
    import _posixshmem

    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)


class _Mapped:
    """A Windows mapping of the ring: ``array()`` gives a uint8 view that keeps it."""

    def __init__(self, mm: mmap.mmap) -> None:
        self._mm = mm

    def array(self) -> np.ndarray:
        return np.frombuffer(self._mm, dtype=np.uint8)


class NamedRing:
    """A named segment of ``size`` bytes. In the process that made it (``owner``) it holds
    the name until :meth:`close`; pickled, it is ``(name, size)``, and the copy only maps."""

    def __init__(self, name: str, size: int, *, owner: bool = False, shm: Any = None) -> None:
        self.name, self.size, self.owner = name, size, owner
        self._shm = shm  # the creating SharedMemory (closed; kept to unlink the name)

    @classmethod
    def create(cls, size: int) -> tuple[NamedRing, Any]:
        """A new segment, mapped writable here."""
        from multiprocessing.shared_memory import SharedMemory

        if size <= 0:
            raise ValueError(f"size must be > 0, got {size}")
        if sys.platform.startswith("linux"):  # the segment is a file in /dev/shm there
            from stoker.loader._shm import preflight

            preflight(size, slots=1, what="batch ring")
        name = segment_name()
        try:
            shm = SharedMemory(name=name, create=True, size=size)
        except OSError as e:
            raise SharedMemoryError(
                e.errno, f"cannot create shared-memory segment {name}: {e.strerror}"
            ) from e
        try:
            mapped = _map(name, size)
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        shm.close()  # no view of its own mapping exists: the segment lives on by name
        return cls(name, size, owner=True, shm=shm), mapped

    def __reduce__(self) -> tuple:
        return NamedRing, (self.name, self.size)

    @property
    def closed(self) -> bool:
        return self.owner and self._shm is None

    def attach(self, *, writable: bool = True) -> Any:
        """Map it (read-write: a worker writes its rows)."""
        return _map(self.name, self.size)

    def reserve(self, offset: int, length: int) -> None:
        """Back bytes ``[offset, offset + length)`` where ``posix_fallocate`` exists."""
        if not (_POSIX and hasattr(os, "posix_fallocate")) or length <= 0:
            return
        import _posixshmem

        from stoker.loader._shm import _reserve_fd

        fd = _posixshmem.shm_open("/" + self.name, os.O_RDWR, mode=0o600)
        try:
            _reserve_fd(fd, offset, length, self.size)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unlink the name (the owner only; the memory lives on while a mapping does)."""
        shm, self._shm = self._shm, None
        if shm is not None:
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()

    unlink = close  # as _shm.Segment (an array source's copy may be either)
