"""Per-worker memory of a folder source as its listing grows: the old way (each worker unpickles
its own list of path strings) against the listing in shared memory (workers map it).

No files are made: the listing is fake (``FolderSource._from_listing``) and ``read`` is
replaced by one that looks the path up, as a real read does, and returns a 1x1 image, so a
full epoch touches every path of the listing in the workers. Per worker: USS and PSS
(``/proc/PID/smaps_rollup``) right after start (config unpickled) and after one epoch.

    python bench/bench_folder_memory.py [--sizes 100000 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from stoker._core.specs import ArraySpec  # noqa: E402
from stoker.loader import FolderSource, Loader, Source  # noqa: E402

PIXEL = np.zeros((1, 1, 3), np.uint8)


class SharedListing(FolderSource):
    """Today's FolderSource; read() looks the path up and returns a pixel."""

    encoded = False

    @property
    def sample_spec(self) -> ArraySpec:
        return ArraySpec((1, 1, 3), "uint8")

    def read(self, i: int):
        self.file_path(i)
        return PIXEL, self._labels[i]


class ListOfPaths(Source):
    """The old FolderSource: ``paths`` a list of str pickled into every worker."""

    encoded = False

    def __init__(self, root: str, files: list[str], labels: np.ndarray) -> None:
        self.root, self.paths, self._labels = root, files, labels

    def __len__(self) -> int:
        return len(self.paths)

    def key(self, i: int) -> int:
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self.paths), dtype=np.int64)

    def labels(self) -> np.ndarray:
        return self._labels

    @property
    def sample_spec(self) -> ArraySpec:
        return ArraySpec((1, 1, 3), "uint8")

    def read(self, i: int):
        os.path.join(self.root, self.paths[i])
        return PIXEL, self._labels[i]

    def fingerprint(self) -> dict:
        return {"type": "list", "len": len(self.paths)}


def _mem(pid: int) -> tuple[float, float]:
    info = psutil.Process(pid).memory_full_info()
    return info.uss / 2**20, info.pss / 2**20


def _maps_ring(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("/memfd:stoker-ring" in line for line in f)


def measure(src: Source) -> dict:
    with Loader(src, batch_size=4096, workers=2) as ld:
        ld._ensure_running(None)
        pids = ld.worker_pids()
        while not all(_maps_ring(p) for p in pids):
            time.sleep(0.02)
        start = [_mem(p) for p in pids]
        t0 = time.perf_counter()
        n = sum(len(b.labels) for b in ld)
        epoch = time.perf_counter() - t0
        after = [_mem(p) for p in pids]
    assert n == len(src)
    return {"start": start, "after": after, "epoch_s": epoch}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="(100000 1000000)")
    ap.add_argument("--quick", action="store_true", help="one listing of 20,000 paths")
    args = ap.parse_args(argv)
    args.sizes = args.sizes or ([20_000] if args.quick else [100_000, 1_000_000])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        "| paths | listing | per worker at start: USS / PSS MiB | after an epoch: USS / PSS MiB |"
    )
    print("|---:|---|---:|---:|")
    for n in args.sizes:
        names = [f"n{i % 1000:04d}/{i:08d}_{i * 2654435761 % 10**10:010d}.JPEG" for i in range(n)]
        labels = np.arange(n, dtype=np.int64) % 1000
        for kind in ("list of str (old)", "shared blob (new)"):
            if kind.startswith("list"):
                src: Source = ListOfPaths("/data/train", names, labels)
            else:
                src = SharedListing._from_listing("/data/train", names, labels, ["c"] * 1000)
            got = measure(src)
            src.close()

            def fmt(ms: list[tuple[float, float]]) -> str:
                return " ; ".join(f"{u:.1f} / {p:.1f}" for u, p in ms)

            print(f"| {n:,} | {kind} | {fmt(got['start'])} | {fmt(got['after'])} |", flush=True)


if __name__ == "__main__":
    main()
