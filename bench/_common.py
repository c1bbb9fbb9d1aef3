"""What the bench scripts share: the memory sampler, CPU time of a process tree, the best of
several rounds, paired rounds (median and spread, alternating order), page-cache warming, the
usable core count, sample data and the command line.

Nothing here imports stoker at module level: ``bench_revisions.py`` imports this module in
child processes that import an older stoker, which may lack the names the current one has.
Worker processes started by multiprocessing re-import this module by name (``bench/`` is on
their ``sys.path`` as it is on the parent's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


# ---------------------------------------------------------------------------- machine
def cpu_count() -> int:
    """Cores this process may run on (affinity mask, capped by a cgroup CPU quota)."""
    try:
        from stoker._core.system import usable_cores  # no public name for it
    except ImportError:  # an older stoker (bench_revisions): the affinity mask alone
        return len(os.sched_getaffinity(0))
    return usable_cores()


def bench_parser(doc: str | None, quick: str):
    """An argument parser showing ``doc`` as written, with ``--quick`` (its help: ``quick``,
    what the smoke run does), which every bench takes."""
    import argparse

    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=quick)
    return ap


def command_line() -> str:
    """The command that started this run, as a reader would type it again."""
    return " ".join([os.path.basename(sys.executable), *sys.argv])


# ---------------------------------------------------------------------------- CPU time
def tree_rusage() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    import resource

    t = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        t += r.ru_utime + r.ru_stime
    return t


def tree_cpu() -> dict[int, float]:
    """CPU seconds so far of this process tree, by process: this process (with its waited-for
    children) and each live descendant (with the children it has waited for: a fork server's
    workers that have exited count there). Two of these give the tree's use in between
    (:func:`cpu_between`), including processes started in between; a process that both starts
    and exits in between counts only when a process of the tree waited for it."""
    import psutil

    out = {os.getpid(): tree_rusage()}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = t.user + t.system + t.children_user + t.children_system
    return out


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the tree used between two :func:`tree_cpu` snapshots."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


# ---------------------------------------------------------------------------- memory sampler
class PeakPSS:
    """Samples this process and all its descendants every ``every`` s: the peak PSS (MiB), the
    peak PSS without file-backed pages (``Pss_Anon + Pss_Shmem``: what the run itself holds,
    not the page cache of the data file it reads), and the CPU seconds they used.

    With ``memory=False`` (rounds that time a candidate) there is no sampling thread: only the
    tree's CPU times at the start and at ``snapshot()``/the end. Reading ``smaps_rollup`` walks
    every page table of the tree, longer with a loader's batch ring mapped in three processes
    than for the limit loop: the sampler's CPU comes out of the run it measures, and more from
    some candidates than from others (docs/loader.md, "Benchmark", has the figures)."""

    def __init__(self, every: float = 0.25, *, memory: bool = True) -> None:
        import psutil

        self._psutil = psutil
        self.memory = memory
        self.every = every
        self.peak = 0.0
        self.peak_anon = 0.0
        self._cpu: dict[int, float] = {}
        self._base: dict[int, float] = {}
        self._self_cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of the tree, less what this sampler itself used."""
        used = sum(self._cpu.get(p, 0.0) - self._base.get(p, 0.0) for p in self._cpu)
        return used - self._self_cpu

    @property
    def main_cpu_seconds(self) -> float:
        """The part of :attr:`cpu_seconds` this process used (a loader's main process): the
        rest is its descendants' (the worker server and the workers)."""
        me = os.getpid()
        return self._cpu.get(me, 0.0) - self._base.get(me, 0.0) - self._self_cpu

    def _sample(self, first: bool = False) -> None:
        ps = self._psutil
        me = ps.Process()
        pss = anon = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
                if first or p.pid not in self._cpu:
                    self._base.setdefault(p.pid, cpu if first else 0.0)
                self._cpu[p.pid] = cpu
                if not self.memory:
                    continue
                with open(f"/proc/{p.pid}/smaps_rollup") as f:
                    for line in f:
                        k, _, v = line.partition(":")
                        if k == "Pss":
                            pss += int(v.split()[0])
                        elif k in ("Pss_Anon", "Pss_Shmem"):
                            anon += int(v.split()[0])
            except (ps.Error, OSError, ValueError):
                pass
        self.peak = max(self.peak, pss / 1024)
        self.peak_anon = max(self.peak_anon, anon / 1024)

    def snapshot(self) -> float:
        """Sample now; the tree's CPU seconds so far (for a figure over part of the run)."""
        self._sample()
        return self.cpu_seconds

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.is_set():
            self._sample()
            self._self_cpu = time.thread_time() - t0
            self._stop.wait(self.every)

    def __enter__(self) -> PeakPSS:
        self._sample(first=True)
        if self.memory:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.memory:
            self._stop.set()
            self._thread.join()
        self._sample()

    def figures(self) -> dict:
        """The peak memory figures, when sampled (none for a timed round)."""
        return {"pss": self.peak, "pss_anon": self.peak_anon} if self.memory else {}


# ---------------------------------------------------------------------------- rounds
# How best_of combines a figure over rounds: a shared machine only ever slows a run down, so
# the highest rate and the least time are the least disturbed; memory keeps the highest seen.
HIGHER_IS_BETTER = frozenset({"rate"})
LOWER_IS_BETTER = frozenset({"cpu_ms_per_image", "first"})
PEAKS = frozenset({"pss", "pss_anon"})


def best_of(runs: list[dict]) -> dict:
    """The best round of a candidate, figure by figure: the highest rate, the least CPU per
    image and the earliest first batch (the least disturbed rounds), the highest memory (the
    conservative figure); nested results (a second epoch) likewise. Adds ``rounds``."""
    out = _best(runs)
    out["rounds"] = len(runs)
    return out


def _best(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in {k for r in runs for k in r}:
        values = [r[key] for r in runs if r.get(key) is not None]
        if not values:
            continue
        if isinstance(values[0], dict):
            out[key] = _best(values)
        elif key in HIGHER_IS_BETTER or key in PEAKS:
            out[key] = max(values)
        elif key in LOWER_IS_BETTER:
            out[key] = min(values)
    return out


def best_time(fn, repeat: int = 3) -> float:
    """The least wall time of ``repeat`` calls of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------- page cache
_READ_ALL = """import sys
b = bytearray(1 << 24)
for p in sys.argv[1:]:
    with open(p, 'rb', buffering=0) as f:
        while f.readinto(b):
            pass
"""


def warm_page_cache(path: str | os.PathLike[str]) -> None:
    """Read the files of a candidate's input (a .rec with its side files and the index and
    label caches stoker derived from them, or every file of an image folder) once, right before the candidate runs, so that it reads
    them from memory like every other candidate. Once before all rounds is not enough: a
    kernel may drop page-cache pages nobody has mapped for a while (proactive reclaim such
    as DAMON's; docs/loader.md), and a candidate
    would then read from the disk what another loaded before its clock started. In a child
    process: the read buffer must not stay in the heap of the process whose memory is
    measured."""
    p = Path(path)
    files = (
        [f for f in p.rglob("*") if f.is_file()]
        if p.is_dir()
        else [f for f in p.parent.glob(p.stem + ".*") if f.is_file()]
    )
    files += _derived_caches(files)
    for i in range(0, len(files), 2000):  # argv stays short
        chunk = [str(f) for f in files[i : i + 2000]]
        subprocess.run([sys.executable, "-c", _READ_ALL, *chunk], check=True)


def _derived_caches(files: list[Path]) -> list[Path]:
    """The entries stoker keeps in its cache directory for these files (a ``.idx``'s binary
    index, a ``.rec``'s label table): a loader reads them at its start, so they are its input
    as much as the files are."""
    from stoker.formats.recordio.index import cache_path
    from stoker.formats.recordio.labelcache import label_cache_path

    out = []
    for f in files:
        entry = (
            cache_path(f)
            if f.suffix == ".idx"
            else label_cache_path(str(f))
            if f.suffix == ".rec"
            else None
        )
        if entry is not None and os.path.isfile(entry):
            out.append(Path(entry))
    return out


# ---------------------------------------------------------------------------- sample data
def make_images(
    root: str | os.PathLike[str], *, n: int, size, classes: int = 10, seed: int = 0
) -> Path:
    """``classes`` folders of ``n // classes`` sample JPEGs each under ``root`` (reused when an
    identical call made them before)."""
    from stoker import make_sample_data

    make_sample_data(root, classes=classes, per_class=max(1, n // classes), size=size, seed=seed)
    return Path(root)


def make_data(work: Path, *, n: int, size, name: str) -> tuple[str, str]:
    """An image folder of ``n`` sample JPEGs (10 classes, seed 1) and its packed .rec, under
    ``work`` by ``name``; both reused when there."""
    from stoker import pack

    images = make_images(work / f"images_{name}", n=n, size=size, seed=1)
    rec = work / f"{name}.rec"
    if not rec.exists():
        pack(images, rec, overwrite=True, progress=False)
    return str(images), str(rec)


# ---------------------------------------------------------------------------- the 112 pipeline
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def stoker_transforms(kind: str, *, normalize: bool):
    """The loader bench's augmentation: ``"112"`` is Resize(128, shorter side) ->
    RandomCrop(112) -> HorizontalFlip; ``"224"`` is RandomResizedCrop(224) -> HorizontalFlip;
    then Normalize (ImageNet mean and std) when ``normalize``."""
    from stoker.transforms import (
        Compose,
        HorizontalFlip,
        Normalize,
        RandomCrop,
        RandomResizedCrop,
        Resize,
    )

    if kind == "112":
        ops = [Resize(128, shorter_side=True), RandomCrop(112), HorizontalFlip()]
    else:
        ops = [RandomResizedCrop(224), HorizontalFlip()]
    if normalize:
        ops.append(Normalize(MEAN, STD))
    return Compose(ops)


# ---------------------------------------------------------------------------- paired rounds
def median_range(values) -> tuple[float, float, float]:
    """The median of ``values`` and their spread: (median, min, max)."""
    import statistics

    v = list(values)
    return statistics.median(v), min(v), max(v)


def alternated(names: list[str], index: int) -> list[str]:
    """The order of a group of candidates in its ``index``-th timed run: as given when
    ``index`` is even, reversed when odd, so that over the rounds each of two neighbours runs
    first as often as the other and a slow drift of the machine falls on both alike."""
    return list(names) if index % 2 == 0 else list(reversed(names))
