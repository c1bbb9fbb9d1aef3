"""Storage reads, cold and warm: the sampled files one by one, the same payloads from one
packed file, or the sampled records through the format's reader.

Cold reads: the page cache cannot be dropped without root, but a process may ask the kernel
to evict the clean pages of a file it can open (``posix_fadvise(POSIX_FADV_DONTNEED)``). The
cold pass does that for each sampled file (or record range) just before reading it, so it reads
from the device when the kernel honours the request. On tmpfs or some network filesystems it
does not; the report says so when cold and warm come out alike.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from stoker.doctor.measure.source import SourceSample
from stoker.doctor.measure.timing import Stage, time_loop

__all__ = [
    "evict",
    "measure_read_files",
    "measure_read_packed",
    "measure_read_records",
    "unreadable",
]

T = TypeVar("T")

#: bytes evicted from each sampled record's offset (a record rarely spans more)
_RECORD_SPAN = 1 << 20


def evict(fd: int, offset: int = 0, length: int = 0) -> bool:
    """Ask the kernel to drop the cached pages of a file range (no root needed).

    The pages stay when another process maps them; the report compares cold with warm.
    """
    try:
        os.fdatasync(fd)  # dirty pages cannot be dropped; write them out first
    except OSError:
        pass
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        return True
    except (AttributeError, OSError):
        return False


def _evict_ranges(path: str, ranges: Sequence[tuple[int, int]]) -> None:
    """Evict ``(offset, length)`` ranges of one file (length 0: to the end)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset, length in ranges:
                evict(fd, offset, length)
        finally:
            os.close(fd)


def _timed_reads(
    read: Callable[[T], bytes], items: list[T], *, seconds: float, cold: bool, what: str
) -> tuple[Stage, list[bytes]]:
    """Read ``items`` one by one: a cold pass reads each once, a warm pass cycles for
    ``seconds``. Returns the stage and the payloads of the first pass."""
    out: list[bytes] = []
    nbytes = 0

    def one(item: T) -> None:
        nonlocal nbytes
        b = read(item)
        nbytes += len(b)
        if len(out) < len(items):
            out.append(b)

    n, wall, cpu, queued = time_loop(
        one, items, seconds=seconds if not cold else 1e9, cycle=not cold
    )
    if cold:
        label = f"cold: {'record pages' if what == 'records' else 'pages'} evicted before reading"
    else:
        label = "warm: page cache"
    name = f"read {what} ({'cold' if cold else 'warm'})"
    return Stage(name, "storage", n, wall, cpu, nbytes, label, queued), out


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def measure_read_files(
    sample: SourceSample, *, seconds: float, cold: bool
) -> tuple[Stage, list[bytes]]:
    """Read the sampled files one by one (as a loader over a folder does)."""
    if cold:
        for p in sample.files:
            _evict_ranges(p, [(0, 0)])
    return _timed_reads(_read_file, sample.files, seconds=seconds, cold=cold, what="files")


def unreadable(sample: SourceSample) -> list[tuple[int, str]]:
    """``(j, "Type: message")`` for each sampled item that cannot be read (a file that cannot
    be opened, a record whose framing or checksum is broken), in the order of the sample."""
    if sample.kind == "folder":
        items: list[Any] = list(sample.files)
        read: Callable[[Any], object] = _read_file
    else:
        if sample.records is None:
            raise ValueError(f"{sample.path}: not a records source")
        records = sample.records
        items = list(sample.positions)

        def read(i: int) -> object:  # a reader per record: a chunk's reader may check them all
            return records.reader(np.asarray([i], np.int64), ())(i)

    bad = []
    for j, item in enumerate(items):
        try:
            read(item)
        except Exception as e:  # noqa: BLE001 - each failure is reported with its sample
            bad.append((j, f"{type(e).__name__}: {e}"))
    return bad


def measure_read_records(
    sample: SourceSample, *, seconds: float, cold: bool
) -> tuple[Stage, list[bytes]]:
    """Read the sampled records through the format's reader (as the loader does)."""
    reader = sample.records
    if reader is None:
        raise ValueError(f"{sample.path}: not a records source")
    if cold:
        _evict_records(sample)
    get = reader.reader(np.asarray(sample.positions, np.int64), ())

    def read(i: int) -> bytes:
        return bytes(get(i)[0])  # touch every byte, as a decoder will

    return _timed_reads(read, sample.positions, seconds=seconds, cold=cold, what="records")


def _evict_records(sample: SourceSample) -> None:
    """Evict the pages of the sampled records, in the file that holds each; where the format
    cannot say where a record lives, the pages of every data file of the set."""
    reader = sample.records
    assert reader is not None
    ranges: dict[str, list[tuple[int, int]]] = {}
    for i in sample.positions:
        where = reader.locate(i)
        if where is None:
            ranges = {f: [(0, 0)] for f in reader.files()}
            break
        ranges.setdefault(where[0], []).append((int(where[1]), _RECORD_SPAN))
    for path, rs in ranges.items():
        _evict_ranges(path, rs)


def measure_read_packed(
    payloads: list[bytes], *, seconds: float, directory: str | None
) -> tuple[Stage, Stage]:
    """Write the sampled payloads back to back into one temporary file next to the data and
    read them with ``pread`` (what a packed ``.rec`` costs): cold, then warm."""
    fd_tmp, tmp = _tempfile(directory)
    try:
        offsets = []
        pos = 0
        with os.fdopen(fd_tmp, "wb") as f:
            for b in payloads:
                offsets.append((pos, len(b)))
                f.write(b)
                pos += len(b)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            evict(fd)
            where = os.path.dirname(tmp)
            cold = _packed_pass(fd, offsets, seconds=1e9, cold=True, where=where)
            warm = _packed_pass(fd, offsets, seconds=seconds, cold=False, where=where)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return cold, warm


def _packed_pass(
    fd: int, offsets: list[tuple[int, int]], *, seconds: float, cold: bool, where: str
) -> Stage:
    nbytes = 0

    def read(item: tuple[int, int]) -> None:
        nonlocal nbytes
        nbytes += len(os.pread(fd, item[1], item[0]))

    n, wall, cpu, queued = time_loop(read, offsets, seconds=seconds, cycle=not cold)
    if cold:
        note = f"one file of the sampled payloads in {where}, pages evicted"
        return Stage("read packed (cold)", "storage", n, wall, cpu, nbytes, note, queued)
    return Stage("read packed (warm)", "storage", n, wall, cpu, nbytes, "page cache", queued)


def _tempfile(directory: str | None) -> tuple[int, str]:
    for d in (directory, None):
        try:
            return tempfile.mkstemp(prefix=".stoker-doctor-", suffix=".tmp", dir=d)
        except OSError:
            continue
    raise OSError("cannot create a temporary file for the packed-read measurement")
