"""Storage reads, cold and warm: the sampled files one by one, the same payloads from one
packed file, or the sampled records through the format's reader.

Cold reads: the page cache cannot be dropped without root, but a process may ask the kernel
to evict the clean pages of a file it can open (``posix_fadvise(POSIX_FADV_DONTNEED)``). The
cold pass does that for each sampled file (or record range) just before reading it, so it reads
from the device when the kernel honours the request. On tmpfs or some network filesystems it
does not; the report says so when cold and warm come out alike.

A set in object storage (:func:`measure_remote`): its records are read from the shard cache
as local files are; besides, one shard is downloaded whole without the cache (MB/s, and the
time to first byte of a one-byte GET), the cache's budget, use and free space are read, and
:class:`RemoteStorage` says whether the cache bounds the run under the loader's shuffle mode.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from stoker._core.oscompat import BINARY, read_at
from stoker.doctor.measure.source import SourceSample
from stoker.doctor.measure.timing import Stage, time_loop

__all__ = [
    "RemoteStorage",
    "evict",
    "measure_read_files",
    "measure_read_packed",
    "measure_read_records",
    "measure_remote",
    "size_text",
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
        fd = os.open(path, os.O_RDONLY | BINARY)
        try:
            for offset, length in ranges:
                evict(fd, offset, length)
        finally:
            os.close(fd)


def _timed_reads(
    read: Callable[[T], bytes],
    items: list[T],
    *,
    seconds: float,
    cold: bool,
    what: str,
    max_seconds: float | None = None,
) -> tuple[Stage, list[bytes]]:
    """Read ``items`` one by one: a cold pass reads each once, a warm pass reads each once
    untimed (so that every page is in the cache and every one-time cost of the reader is
    paid: warm means warm), then cycles for ``seconds`` (up to ``max_seconds`` until its
    interval is tight). Returns the stage and the payloads of the first pass."""
    out: list[bytes] = []
    nbytes = 0
    if not cold:
        for item in items:
            out.append(read(item))

    def one(item: T) -> None:
        nonlocal nbytes
        b = read(item)
        nbytes += len(b)
        if len(out) < len(items):
            out.append(b)

    n, wall, cpu, queued, spread = time_loop(
        one,
        items,
        seconds=seconds if not cold else 1e9,
        cycle=not cold,
        max_seconds=None if cold else max_seconds,
    )
    if cold:
        label = f"cold: {'record pages' if what == 'records' else 'pages'} evicted before reading"
    else:
        label = "warm: page cache"
    name = f"read {what} ({'cold' if cold else 'warm'})"
    return Stage(name, "storage", n, wall, cpu, nbytes, label, queued, spread), out


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def measure_read_files(
    sample: SourceSample, *, seconds: float, cold: bool, max_seconds: float | None = None
) -> tuple[Stage, list[bytes]]:
    """Read the sampled files one by one (as a loader over a folder does)."""
    if cold:
        for p in sample.files:
            _evict_ranges(p, [(0, 0)])
    return _timed_reads(
        _read_file, sample.files, seconds=seconds, cold=cold, what="files", max_seconds=max_seconds
    )


def unreadable(sample: SourceSample, until: float = math.inf) -> tuple[list[tuple[int, str]], int]:
    """``(j, "Type: message")`` for each sampled item that cannot be read (a file that cannot
    be opened, a record whose framing or checksum is broken), in the order of the sample, and
    how many were looked at: all, or those read by ``until`` (``time.perf_counter``; at least
    8)."""
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

    bad: list[tuple[int, str]] = []
    for j, item in enumerate(items):
        if j >= 8 and time.perf_counter() > until:
            return bad, j
        try:
            read(item)
        except Exception as e:  # noqa: BLE001 - each failure is reported with its sample
            bad.append((j, f"{type(e).__name__}: {e}"))
    return bad, len(items)


def measure_read_records(
    sample: SourceSample, *, seconds: float, cold: bool, max_seconds: float | None = None
) -> tuple[Stage, list[bytes]]:
    """Read the sampled records through the format's reader (as the loader does)."""
    reader = sample.records
    if reader is None:
        raise ValueError(f"{sample.path}: not a records source")
    if cold:
        _evict_records(sample)
    get, as_bytes = reader.reader(np.asarray(sample.positions, np.int64), ()), reader.stored_bytes

    def read(i: int) -> bytes:
        return bytes(as_bytes(get(i)[0]))  # touch every byte, as a decoder will

    return _timed_reads(
        read, sample.positions, seconds=seconds, cold=cold, what="records", max_seconds=max_seconds
    )


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
        fd = os.open(tmp, os.O_RDONLY | BINARY)
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
        nbytes += len(read_at(fd, item[1], item[0]))

    n, wall, cpu, queued, spread = time_loop(read, offsets, seconds=seconds, cycle=not cold)
    if cold:
        note = f"one file of the sampled payloads in {where}, pages evicted"
        return Stage("read packed (cold)", "storage", n, wall, cpu, nbytes, note, queued, spread)
    note = "page cache"
    return Stage("read packed (warm)", "storage", n, wall, cpu, nbytes, note, queued, spread)


def _tempfile(directory: str | None) -> tuple[int, str]:
    for d in (directory, None):
        try:
            return tempfile.mkstemp(prefix=".stoker-doctor-", suffix=".tmp", dir=d)
        except OSError:
            continue
    raise OSError("cannot create a temporary file for the packed-read measurement")


# -- a set in object storage ------------------------------------------------------------------

#: GETs of one byte timed for the time to first byte (the median is kept)
_TTFB_TRIES = 3


@dataclass(frozen=True)
class RemoteStorage:
    """A set in object storage: one shard downloaded whole without the cache (throughput and
    time to first byte), the shard cache (folder, budget, use, free space) and what the set
    needs of it under the loader's shuffle mode."""

    url: str  # the manifest's URL, without credentials
    shard: str  # the shard downloaded (its .rec's URL)
    shard_bytes: int
    download_s: float | None  # None: not measured (``skipped`` says why)
    ttfb_s: float | None
    cache_dir: str
    cache_limit: int
    cache_used: int
    cache_free: int  # free bytes where the cache lives
    set_bytes: int  # what readers cache: each shard's .rec, .idx and checksum file
    shards: int
    largest_shard_bytes: int
    record_bytes: float  # mean bytes of one record in the .rec files
    shuffle: str  # "true" | "shards"
    window: int
    prefetch_shards: int
    skipped: str = ""

    @property
    def mb_per_s(self) -> float | None:
        if not self.download_s:
            return None
        return self.shard_bytes / self.download_s / 1e6

    @property
    def samples_per_s(self) -> float | None:
        """Records per second the download rate delivers (the most a run that downloads
        every epoch can read)."""
        mb = self.mb_per_s
        return None if mb is None or self.record_bytes <= 0 else mb * 1e6 / self.record_bytes

    @property
    def budget(self) -> int:
        """The bytes the cache can really hold: its budget, or what the disk leaves."""
        return min(self.cache_limit, self.cache_used + self.cache_free)

    @property
    def holds_set(self) -> bool:
        return self.set_bytes <= self.budget

    @property
    def shards_need(self) -> int:
        """Bytes ``shuffle="shards"`` keeps cached at once: ``2 * window + prefetch_shards``
        shards of the largest size."""
        return (2 * self.window + self.prefetch_shards) * self.largest_shard_bytes

    @property
    def bounds(self) -> bool:
        """Whether the cache bounds the run: a loader of this order is refused at open (a
        global shuffle over a set larger than the budget, or a budget too small for the
        shard-order window; ``docs/remote.md``)."""
        if self.holds_set:
            return False
        return self.shuffle != "shards" or self.budget < self.shards_need

    def epoch_s(self) -> float | None:
        """Seconds to download the whole set once at the measured rate."""
        mb = self.mb_per_s
        return None if mb is None else self.set_bytes / (mb * 1e6)

    def verdict(self) -> str:
        """Whether the cache bounds the run, and what to change when it does."""
        gb = size_text
        rate = ""
        if self.mb_per_s is not None:
            t = self.epoch_s() or 0.0
            rate = (f" (about {t:,.0f}" if t >= 10 else f" (about {t:.2g}") + (
                f" s at the measured {self.mb_per_s:,.1f} MB/s, at most "
                f"{self.samples_per_s or 0:,.0f} records/s from storage)"
            )
        need = (
            f"{gb(self.shards_need)}: 2 x window {self.window} + prefetch_shards "
            f"{self.prefetch_shards} shards of up to {gb(self.largest_shard_bytes)}"
        )
        room = f"the cache's budget ({gb(self.cache_limit)}"
        if self.budget < self.cache_limit:
            room += f", of which the disk leaves {gb(self.budget)}"
        room += ")"
        if self.holds_set:
            return (
                f"the cache does not bound the run: {room} holds the whole set "
                f"({gb(self.set_bytes)}); the first epoch downloads it{rate}, later epochs read "
                "the cached copies"
            )
        if self.shuffle != "shards":
            return (
                f"the cache bounds the run: the set ({gb(self.set_bytes)}) is larger than {room}, "
                "and shuffle=True reads from any shard in any batch, so a loader with it is "
                "refused at open (it would fetch a whole shard for nearly every sample). Use "
                f'shuffle="shards" (its budget: {need}) or a cache_limit of at least '
                f"{gb(self.set_bytes)}; downloading the set once takes{rate or ' a while'}"
            )
        if self.budget < self.shards_need:
            return (
                f'the cache bounds the run: {room} is smaller than what shuffle="shards" keeps '
                f"cached ({need}), so a loader with it is refused at open. Raise cache_limit to "
                "at least that, or lower the window or prefetch_shards"
            )
        return (
            f"the cache does not bound the run: the set ({gb(self.set_bytes)}) is larger than "
            f'{room}, but with shuffle="shards" the budget is enough ({need}); each epoch '
            f"downloads every shard once{rate}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["record_bytes"]
        ttfb = d.pop("ttfb_s")
        return {
            **d,
            "ttfb_ms": None if ttfb is None else 1e3 * ttfb,
            "mb_per_s": self.mb_per_s,
            "samples_per_s": self.samples_per_s,
            "shards_need": self.shards_need,
            "holds_set": self.holds_set,
            "bounds": self.bounds,
            "text": self.verdict(),
        }


def size_text(n: float) -> str:
    """Bytes for a reader: ``1.2 GB``, ``350.0 MB``, ``93.4 kB``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} bytes"


def measure_remote(
    reader: Any, *, shuffle: bool | str = True, window: int, prefetch_shards: int
) -> RemoteStorage:
    """Download the largest shard of a remote set (any format: its reader's
    :meth:`~stoker.formats.base.Reader.remote`) once, without the cache, into a
    temporary file in the cache's folder (throughput; the time to first byte from one-byte
    GETs), and read the cache's budget, use and free space."""
    from stoker.formats.remote import redact

    remote = reader.remote()
    shards = None if remote is None else remote.shards
    if shards is None:
        raise ValueError(f"{reader.path}: not a set in object storage")
    files = shards.files
    sizes = [sum(f.size for f in s) for s in shards.entries]  # what the cache holds of each
    data = [s[0].size for s in shards.entries]  # each shard's data file comes first
    j = int(np.argmax(data))
    url, size = shards.url(j), data[j]
    cache = files.cache
    used, free = cache.usage(), _free_bytes(cache.root)
    download_s, ttfb_s, skipped = None, None, ""
    if size > free:
        skipped = (
            f"{redact(url)} ({size_text(size)}) does not fit in the free space ({size_text(free)})"
        )
    else:
        ttfb_s = _ttfb(files, url)
        download_s = _download_s(files, url, size)
    records = int(np.sum(reader.shard_sizes()))
    return RemoteStorage(
        url=redact(files.url),
        shard=redact(url),
        shard_bytes=size,
        download_s=download_s,
        ttfb_s=ttfb_s,
        cache_dir=cache.root,
        cache_limit=cache.limit,
        cache_used=used,
        cache_free=free,
        set_bytes=int(sum(sizes)),
        shards=len(sizes),
        largest_shard_bytes=max(sizes) if sizes else 0,
        record_bytes=sum(data) / records if records else 0.0,
        shuffle="shards" if shuffle == "shards" else "true",
        window=window,
        prefetch_shards=prefetch_shards,
        skipped=skipped,
    )


def _free_bytes(path: str) -> int:
    """Free bytes for this user on the filesystem of ``path`` (or its nearest parent)."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return int(st.f_bavail * st.f_frsize)


def _ttfb(files: Any, url: str) -> float | None:
    """The median time of a one-byte ranged GET of ``url`` (request to first byte)."""
    fs = files.remote.fs()
    times = []
    for _ in range(_TTFB_TRIES):
        t0 = time.perf_counter()
        try:
            fs.cat_file(url, start=0, end=1)
        except Exception:  # noqa: BLE001 - the download below names what is wrong
            return None
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _download_s(files: Any, url: str, size: int) -> float:
    """Seconds to download ``url`` whole, as the cache does (stoker's ranged reads with their
    retries), into a temporary file in the cache's folder, removed after."""
    folder = files.cache.root
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".stoker-doctor-", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            t0 = time.perf_counter()
            files.remote.download(url, out, size=size, what="doctor")
            out.flush()
            return time.perf_counter() - t0
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
