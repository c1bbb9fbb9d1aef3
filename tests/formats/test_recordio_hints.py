"""Access hints for ``.rec`` files larger than the page cache (``recordio/hints.py``): the
decision, byte-identical reads, and that the kernel really gets the advice (the mapping's
``rr`` flag in ``/proc/self/smaps``; a chunk's pages in the page cache after ``WILLNEED``,
seen with ``mincore``)."""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import sys
import time

import numpy as np
import pytest
from _recordio_util import face_set, write_shards

from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.formats.recordio.hints import HINT_FRACTION, AccessHints, page_cache_budget
from stoker.formats.recordio.seam import RecordIOReader

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and madvise")
PAGE = mmap.PAGESIZE


def _big_rec(tmp_path, n: int = 120, size: int = 20_000, seed: int = 0) -> str:
    """A .rec of ``n`` records of about ``size`` random bytes each (fsynced: evictable)."""
    rng = np.random.default_rng(seed)
    rec = str(tmp_path / "big.rec")
    with RecordWriter(rec, checksums=True) as w:
        for i in range(n):
            body = rng.integers(0, 256, int(rng.integers(size // 2, size)), np.uint8).tobytes()
            w.write(i, pack_header(IRHeader(0, float(i % 5), i, 0), body))
    fd = os.open(rec, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return rec


def _read_all(r: RecordIOReader, order: np.ndarray, chunk: int = 16) -> list[tuple]:
    out = []
    for c in range(0, len(order), chunk):
        idx = order[c : c + chunk]
        get = r.reader(idx)
        for i in idx.tolist():
            image, label, key, _ = get(i)
            out.append((bytes(image), label, key))
    return out


def _worker_copy(path: str, hints: AccessHints) -> RecordIOReader:
    """The reader as a loader worker holds it: set up, pickled, unpickled."""
    r = RecordIOReader(path)
    r.hints = hints
    try:
        return pickle.loads(pickle.dumps(r))
    finally:
        r.close()


def _vmflags(path: str) -> list[str]:
    """The VmFlags of each mapping of ``path`` in this process."""
    flags, current = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            # a mapping's header: "start-end perms offset dev inode [path]"; anonymous ones
            # have no path, and must end the run of the file's mapping as much as any other
            if len(head) >= 5 and "-" in head[0] and ":" in head[3] and head[4].isdigit():
                current = len(head) >= 6 and line.rstrip("\n").endswith(path)
            elif current and line.startswith("VmFlags:"):
                flags.append(line.split(":", 1)[1].split())
    return flags


# ---------------------------------------------------------------------------- the decision
def test_decision_by_threshold() -> None:
    h = AccessHints(budget=1000)  # fraction HINT_FRACTION
    limit = int(HINT_FRACTION * 1000)
    assert h.decide(limit + 1) is True
    assert h.decide(limit) is False
    assert AccessHints(budget=1000, fraction=2.0).decide(1500) is False
    assert AccessHints(mode=True, budget=10**15).decide(1) is True
    assert AccessHints(mode=False, budget=0).decide(10**15) is False
    for bad in ({"mode": "yes"}, {"budget": -1}, {"fraction": 0}):
        with pytest.raises(ValueError, match="AccessHints"):
            AccessHints(**bad)  # type: ignore[arg-type]


@linux
def test_budget_is_memavailable_at_most() -> None:
    with open("/proc/meminfo") as f:
        avail = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
    got = page_cache_budget()
    assert got is not None and 0 < got <= avail * 1.1  # MemAvailable moves between reads


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_budget_capped_by_cgroup_limit(tmp_path, version: str) -> None:
    # the kernel's own file formats, laid out under a root of the test's choosing
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    if version == "v2":
        (proc / "self" / "cgroup").write_text("0::/job/step\n")
        base, limit, stat = root, "memory.max", "anon 100000000\nfile 5\n"
    else:
        (proc / "self" / "cgroup").write_text("4:memory:/job/step\n3:cpu:/\n")
        base, limit, stat = root / "memory", "memory.limit_in_bytes", "rss 1\ntotal_rss 100000000\n"
    (base / "job" / "step").mkdir(parents=True)
    (base / "job" / limit).write_text("600000000\n")  # the parent's limit is the tighter
    (base / "job" / "step" / limit).write_text("max\n" if version == "v2" else f"{1 << 62}\n")
    (base / "job" / "step" / "memory.stat").write_text(stat)
    assert page_cache_budget(proc=str(proc), cgroup_root=str(root)) == 500_000_000
    (base / "job" / limit).write_text("max\n" if version == "v2" else f"{1 << 62}\n")
    assert page_cache_budget(proc=str(proc), cgroup_root=str(root)) == 4_000_000 * 1024


# ---------------------------------------------------------------------------- same bytes
def test_records_identical_with_and_without_hints(tmp_path) -> None:
    rec = _big_rec(tmp_path, n=60, size=6000)
    order = np.random.default_rng(1).permutation(60)
    got = {}
    for on in (True, False):
        for worker in (False, True):  # the slow path (set-up process) and the plain path
            if worker:
                r = _worker_copy(rec, AccessHints(mode=on))
            else:
                r = RecordIOReader(rec)
                r.hints = AccessHints(mode=on)
            got[on, worker] = _read_all(r, order)
            assert r._hints_on is on
            r.close()
    assert got[True, False] == got[False, False] == got[True, True] == got[False, True]


def test_sets_of_shards_and_face_sets_identical(tmp_path) -> None:
    mpath, payloads = write_shards(tmp_path, [7, 1, 12, 5])
    face = tmp_path / "face.rec"
    face_set(face, (3, 1, 4, 2))
    for path in (str(mpath), str(face)):
        runs = []
        for on in (True, False):
            r = _worker_copy(path, AccessHints(mode=on))
            order = np.random.default_rng(2).permutation(len(r))
            runs.append(_read_all(r, order, chunk=5))
            r.close()
        assert runs[0] == runs[1]
        assert len(runs[0]) == len(order)


# ---------------------------------------------------------------------------- the kernel sees it
@linux
def test_hints_set_random_read_on_the_mapping(tmp_path) -> None:
    rec = _big_rec(tmp_path, n=20, size=4000)
    path = os.path.realpath(rec)
    cases = [
        (AccessHints(mode=True), True),
        (AccessHints(mode=False), False),
        (AccessHints(budget=1000), True),  # "auto": the data is larger than the budget
        (AccessHints(), False),  # "auto" on a file the machine's page cache holds
    ]
    for hints, want in cases:
        r = _worker_copy(rec, hints)
        r.reader(np.arange(4))(0)
        flags = _vmflags(path)
        assert len(flags) == 1, flags
        assert ("rr" in flags[0]) is want, (hints, flags)
        assert r._hints_on is want
        r.close()


def _resident(path: str) -> np.ndarray:
    """One bool per page of ``path``: whether it is in the page cache (``mincore`` on a
    mapping of our own; file pages count whether or not this process touched them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return np.frombuffer(bytes(vec), np.uint8) & 1 == 1
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@linux
def test_willneed_fetches_the_chunk_before_it_is_read(tmp_path) -> None:
    rec = _big_rec(tmp_path, n=200, size=40_000)  # ~6 MB: ~30 pages between chunk records
    r = _worker_copy(rec, AccessHints(mode=True))  # set-up reads every label: evict after
    r.locate(0)  # opening reads the first records (the insightface check)

    def offset(i: int) -> int:
        return r.locate(i)[1]

    _evict(rec)
    before = _resident(rec)
    first = int(offset(20)) // PAGE
    if before[first:].any():  # pages this process maps (the first few) stay
        pytest.skip("this filesystem keeps its pages in memory (tmpfs): nothing to evict")
    chunk = np.array([150, 37, 90, 23])
    r.reader(chunk)  # the advice is given here, before any record is read
    spans = [(int(offset(int(i))) // PAGE, int(offset(int(i) + 1)) // PAGE) for i in chunk]
    deadline = time.monotonic() + 5
    while True:  # WILLNEED queues the reads; they land shortly after
        cached = _resident(rec)
        if all(cached[a : b + 1].all() for a, b in spans) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    for a, b in spans:
        assert cached[a : b + 1].all(), f"pages {a}..{b} of a chunk record not fetched"
    # exactly the chunk: the records between were not fetched
    assert not cached[int(offset(50)) // PAGE : int(offset(80)) // PAGE].any()
    r.close()
