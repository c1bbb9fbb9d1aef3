"""Shuffled reads of a ``.rec`` twice the size of the page cache it may use, without and with
the access hints of ``stoker/formats/recordio/hints.py``, beside the same file warm.

Writes a ``.rec`` of noise JPEGs (10-25 KB each, ``--size-mb`` in all) with the RecordIO
writer, then, in a child process, reads the same shuffled positions in chunks of ``--chunk``
(what a loader worker gets per batch) through a worker's copy of the RecordIO reader, in
rounds side by side:

- cold-bounded, hints off and on: the file is evicted from the page cache
  (``posix_fadvise(DONTNEED)``) before the round, and during it the page cache the child may
  fill is bounded to ``--bound-mb`` (default half the file). The bound is a memory cgroup of
  the child's own with that much room above what the process holds (cgroup v1
  ``memory.limit_in_bytes`` or v2 ``memory.max``) where the cgroup tree lets it make one
  (root, or a delegated v2 subtree); else the round trims the file's cached pages itself
  after each chunk (``mincore`` counts them; windows are dropped, oldest cursor first, down
  to 3/4 of the bound), which costs both candidates the same few syscalls;
- warm, hints off and on: after a full sequential read, nothing evicted, no bound.

Each is run reading only (the record bytes are touched, as a decoder would) and reading and
decoding (``stoker.codecs.decode``). A round stops after ``--reads`` records or
``--round-seconds``, whichever comes first. No sampler runs during a round; the cgroup's peak
is read after it. Reported: records/s, MB/s of record bytes, and the ratios hints/no hints
and cold/warm.

    python bench/bench_bigfile.py [--quick] [--size-mb 300] [--bound-mb N] [--reads 3000]
        [--chunk 32] [--round-seconds 20] [--dir DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from _common import command_line

MB = 1 << 20
PAGE = mmap.PAGESIZE


# ---------------------------------------------------------------------------- data
def make_rec(path: str, size_bytes: int, seed: int = 0) -> int:
    """A ``.rec`` (with ``.idx``) of noise JPEGs until ``size_bytes``; its record count.
    A pool of 256 distinct images is written over and over: the page cache sees bytes, not
    pictures, and encoding every record would take longer than the rounds."""
    import simplejpeg

    from stoker.formats.recordio import IRHeader, RecordWriter, pack_header

    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(256):
        side = int(rng.integers(72, 112))
        pixels = rng.integers(0, 256, (side, side, 3), np.uint8)
        pool.append(simplejpeg.encode_jpeg(pixels, quality=90))
    n = written = 0
    with RecordWriter(path, checksums=False) as w:
        while written < size_bytes:
            img = pool[n % len(pool)]
            w.write(n, pack_header(IRHeader(0, float(n % 10), n, 0), img))
            written += len(img) + 32
            n += 1
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return n


def read_ahead_kb(path: str) -> str:
    """The read-ahead window of the device holding ``path`` (what a miss reads around)."""
    st = os.stat(path)
    base = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (f"{base}/queue/read_ahead_kb", f"{base}/../queue/read_ahead_kb"):
        try:
            with open(q) as f:
                return f.read().strip() + " KiB"
        except OSError:
            continue
    return "unknown"


# ---------------------------------------------------------------------------- page cache
class Residency:
    """Which pages of one file are in the page cache (``mincore`` on a mapping of our own
    that is never touched, so it holds no page)."""

    def __init__(self, path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._libc, self.path, self.size = libc, path, os.path.getsize(path)
        self.fd = os.open(path, os.O_RDONLY)
        self._addr = libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, self.fd, 0)
        if self._addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} for mincore failed")
        self._vec = (ctypes.c_ubyte * ((self.size + PAGE - 1) // PAGE))()

    def pages(self) -> np.ndarray:
        if self._libc.mincore(self._addr, self.size, self._vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return np.frombuffer(self._vec, np.uint8) & 1

    def evict(self, lo: int = 0, n: int = 0) -> None:
        os.posix_fadvise(self.fd, lo, n, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self._libc.munmap(self._addr, self.size)
        os.close(self.fd)


class CgroupBound:
    """A memory cgroup of this process's own (a child of the one it runs in), whose limit
    keeps the page cache it fills within ``bound`` bytes above what it holds otherwise."""

    def __init__(self, bound: int) -> None:
        self.bound, self.dir, self.kind = bound, "", ""
        self._home = ""
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        for _, ctl, rel in lines:
            if "memory" in ctl.split(","):
                self._try(f"/sys/fs/cgroup/memory{rel.rstrip('/')}", "v1")
            elif ctl == "" and not self.dir:
                self._try(f"/sys/fs/cgroup{rel.rstrip('/')}", "v2")
            if self.dir:
                return
        raise OSError("no memory cgroup this process may make a child of")

    def _try(self, home: str, kind: str) -> None:
        d = os.path.join(home, f"stoker-bench-bigfile-{os.getpid()}")
        try:
            os.mkdir(d)
        except OSError:
            return
        limit = "memory.limit_in_bytes" if kind == "v1" else "memory.max"
        try:
            if not os.path.exists(os.path.join(d, limit)):
                raise OSError("no memory controller in the child")
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            os.rmdir(d)
            return
        self.dir, self.kind, self._home = d, kind, home

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(value)

    def _read(self, name: str) -> int:
        with open(os.path.join(self.dir, name)) as f:
            return int(f.read().split()[0])

    def _usage(self) -> int:
        return self._read("memory.usage_in_bytes" if self.kind == "v1" else "memory.current")

    def start(self) -> None:
        """Bound from here on: the limit is what the process holds now plus the bound."""
        limit = str(self._usage() + self.bound)
        self._write("memory.limit_in_bytes" if self.kind == "v1" else "memory.max", limit)
        self._base = self._usage()
        if self.kind == "v1":
            self._write("memory.max_usage_in_bytes", "0")
        elif os.path.exists(os.path.join(self.dir, "memory.peak")):
            self._write("memory.peak", "0")  # resettable peak (Linux 6.12+)

    def tick(self) -> None:
        pass

    def stop(self) -> float:
        """Lift the bound; the peak page cache of the round in MB (as the cgroup saw it)."""
        name = "memory.max_usage_in_bytes" if self.kind == "v1" else "memory.peak"
        try:
            peak = (self._read(name) - self._base) / MB
        except OSError:
            peak = float("nan")
        self.off()
        return peak

    def off(self) -> None:
        self._write(
            "memory.limit_in_bytes" if self.kind == "v1" else "memory.max",
            "-1" if self.kind == "v1" else "max",
        )

    def close(self) -> None:
        with open(os.path.join(self._home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


class TrimBound:
    """Without a cgroup: after each chunk, when more than ``bound`` bytes of the file are
    cached, drop 4 MiB windows (from a rotating cursor) until 3/4 of it remain. A window is
    unmapped from the reader's own mapping first: the kernel drops no page a process maps."""

    kind = "trim"
    WINDOW = 4 * MB

    def __init__(self, bound: int, res: Residency) -> None:
        self.bound, self.res, self.cursor, self.mm = bound, res, 0, None
        self.peak = 0

    def start(self, mm: mmap.mmap | None = None) -> None:
        self.mm, self.peak = mm, 0

    def tick(self) -> None:
        pages = self.res.pages()
        cached = int(pages.sum()) * PAGE
        self.peak = max(self.peak, cached)
        if cached <= self.bound:
            return
        per = self.WINDOW // PAGE
        nwin = (pages.shape[0] + per - 1) // per
        while cached > self.bound * 3 // 4:
            lo = self.cursor * per
            held = int(pages[lo : lo + per].sum()) * PAGE
            if held:
                n = min(self.WINDOW, self.res.size - lo * PAGE)
                if self.mm is not None:
                    self.mm.madvise(mmap.MADV_DONTNEED, lo * PAGE, n)
                self.res.evict(lo * PAGE, n)
                cached -= held
            self.cursor = (self.cursor + 1) % nwin

    def stop(self) -> float:
        self.mm = None
        return self.peak / MB

    def off(self) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- rounds (child)
def one_round(
    base, res, bound, order, *, cold: bool, hints: bool, decode: bool, chunk: int, cap: float
) -> dict:
    from stoker.codecs import decode as decode_jpeg
    from stoker.formats.recordio.hints import AccessHints

    base.hints = AccessHints(mode=hints)
    r = pickle.loads(pickle.dumps(base))  # noqa: S301 - a loader worker's copy, made here
    mm = r.records.shards[0]._mm  # the reader's mapping, for the trim fallback only
    if cold:
        res.evict()
        bound.start(mm) if isinstance(bound, TrimBound) else bound.start()
    else:
        bound.off()
        with open(res.path, "rb", buffering=0) as f:
            while f.read(8 * MB):
                pass
    left = int(res.pages().sum()) * PAGE / MB
    nbytes = done = 0
    tick = bound.tick if cold else (lambda: None)
    t0 = time.perf_counter()
    for c in range(0, order.shape[0], chunk):
        idx = order[c : c + chunk]
        get = r.reader(idx)
        for i in idx.tolist():
            image = get(i)[0]
            nbytes += len(image)
            if decode:
                decode_jpeg(image)
            else:
                bytes(image)  # touch every page, as a decoder does
        done += idx.shape[0]
        tick()
        if time.perf_counter() - t0 > cap:
            break
    dt = time.perf_counter() - t0
    peak = bound.stop() if cold else float("nan")
    r.close()
    return {
        "cold": cold,
        "hints": hints,
        "decode": decode,
        "records": done,
        "seconds": dt,
        "rec_s": done / dt,
        "mb_s": nbytes / dt / 1e6,
        "cached_at_start_mb": left,
        "peak_cache_mb": peak,
    }


def run_rounds(spec: dict) -> dict:
    from stoker.formats.recordio.hints import AccessHints, page_cache_budget
    from stoker.formats.recordio.seam import RecordIOReader

    rec, bound_bytes = spec["rec"], spec["bound"]
    res = Residency(rec)
    bound: CgroupBound | TrimBound = TrimBound(bound_bytes, res)
    if spec["bound_by"] != "trim":
        try:
            bound = CgroupBound(bound_bytes)
        except OSError:
            if spec["bound_by"] == "cgroup":
                raise
    out: dict = {"bound_kind": bound.kind, "rounds": []}
    try:
        base = RecordIOReader(rec)
        order = np.random.default_rng(spec["seed"]).permutation(len(base))[: spec["reads"]]
        base.labels()  # kept for the pickles; then unmapped: the kernel evicts no mapped page
        base.close()
        if isinstance(bound, CgroupBound):
            res.evict()
            bound.start()
            budget = page_cache_budget()
            out["auto"] = {"budget_mb": (budget or 0) / MB, "on": AccessHints().decide(res.size)}
            bound.stop()
        out["auto_unbounded"] = AccessHints().decide(res.size)
        res.evict()
        out["evictable"] = bool(res.pages()[len(res.pages()) // 8 :].sum() == 0)
        for decode in (False, True):
            for cold, hints in ((True, False), (True, True), (False, False), (False, True)):
                got = one_round(
                    base,
                    res,
                    bound,
                    order,
                    cold=cold,
                    hints=hints,
                    decode=decode,
                    chunk=spec["chunk"],
                    cap=spec["cap"],
                )
                out["rounds"].append(got)
                print(f"  {_name(got)}: {got['rec_s']:.0f} records/s", file=sys.stderr, flush=True)
    finally:
        bound.close()
        res.close()
    return out


def _name(r: dict) -> str:
    return f"{'cold-bounded' if r['cold'] else 'warm'}, hints {'on' if r['hints'] else 'off'}, {'read+decode' if r['decode'] else 'read'}"


# ---------------------------------------------------------------------------- report
def report(out: dict, args, size: int, n: int, ra: str) -> None:
    print(f"file: {size / MB:.0f} MiB, {n:,} records of {size / n / 1e3:.1f} KB, read-ahead {ra}")
    how = {
        "v1": "a cgroup v1 memory limit",
        "v2": "a cgroup v2 memory.max",
        "trim": "trimming after each chunk (overshoots within a chunk)",
    }
    print(f"page cache bound: {args.bound_mb} MiB, by {how[out['bound_kind']]}")
    if not out["evictable"]:
        print(
            "WARNING: the file's pages stay cached after POSIX_FADV_DONTNEED (tmpfs?): cold rounds are warm"
        )
    if "auto" in out:
        a = out["auto"]
        print(
            f"hints 'auto' inside the bound: {'on' if a['on'] else 'off'} (budget {a['budget_mb']:.0f} MiB); without it: {'on' if out['auto_unbounded'] else 'off'}"
        )
    print(f"\n{'round':<40} {'records':>8} {'records/s':>10} {'MB/s':>8} {'peak cache MiB':>15}")
    rows = {(r["cold"], r["hints"], r["decode"]): r for r in out["rounds"]}
    for r in out["rounds"]:
        peak = "" if r["peak_cache_mb"] != r["peak_cache_mb"] else f"{r['peak_cache_mb']:.0f}"
        print(f"{_name(r):<40} {r['records']:>8} {r['rec_s']:>10.0f} {r['mb_s']:>8.1f} {peak:>15}")
    print()
    for decode in (False, True):
        what = "read+decode" if decode else "read"
        on, off = rows[True, True, decode], rows[True, False, decode]
        won, woff = rows[False, True, decode], rows[False, False, decode]
        print(
            f"{what}: cold hints/no hints {on['rec_s'] / off['rec_s']:.1f}x; "
            f"cold/warm without hints {off['rec_s'] / woff['rec_s']:.2f}, with hints "
            f"{on['rec_s'] / won['rec_s']:.2f}; warm hints/no hints {won['rec_s'] / woff['rec_s']:.2f}"
        )
    print(f"\ncommand: {command_line()}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="64 MiB, 400 reads and at most 5 s a round"
    )
    ap.add_argument("--size-mb", type=int, default=None, help="the .rec's size (default 300)")
    ap.add_argument(
        "--bound-mb", type=int, default=None, help="page cache allowed (default half the file)"
    )
    ap.add_argument(
        "--reads", type=int, default=None, help="records a round reads at most (default 3000)"
    )
    ap.add_argument("--chunk", type=int, default=32, help="records per chunk (a batch / workers)")
    ap.add_argument(
        "--round-seconds", type=float, default=None, help="a round stops after this (default 20)"
    )
    ap.add_argument(
        "--bound-by",
        choices=("auto", "cgroup", "trim"),
        default="auto",
        help="how the page cache is bounded (auto: a cgroup where one can be made, else trim)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where the file is written (not tmpfs)")
    ap.add_argument("--rounds", help=argparse.SUPPRESS)  # the child: a JSON spec
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds:
        print(json.dumps(run_rounds(json.loads(args.rounds))))
        return 0
    args.size_mb = args.size_mb or (64 if args.quick else 300)
    args.reads = args.reads or (400 if args.quick else 3000)
    args.round_seconds = args.round_seconds or (5.0 if args.quick else 20.0)
    args.bound_mb = args.bound_mb or args.size_mb // 2
    work = tempfile.mkdtemp(prefix="stoker-bigfile-", dir=args.dir)
    try:
        rec = os.path.join(work, "big.rec")
        t0 = time.perf_counter()
        n = make_rec(rec, args.size_mb * MB, seed=args.seed)
        size = os.path.getsize(rec)
        print(f"wrote {size / MB:.0f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
        spec = {
            "rec": rec,
            "bound": args.bound_mb * MB,
            "reads": args.reads,
            "chunk": args.chunk,
            "cap": args.round_seconds,
            "seed": args.seed,
            "bound_by": args.bound_by,
        }
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--rounds", json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        report(json.loads(child.stdout.strip().splitlines()[-1]), args, size, n, read_ahead_kb(rec))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
