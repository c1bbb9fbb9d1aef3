"""The loader's CPU cost of checking CRC32C: one Loader epoch over the same .rec with
``RecordSource(path, checksums=True)`` and ``checksums=False``, alternating, in 9 pairs; CPU
microseconds per delivered image of the whole process tree, and the median on/off ratio.

    python bench/bench_checksums.py REC   # a .rec with its .crc32c (e.g. from bench_revisions)
"""

from __future__ import annotations

import statistics
import sys

from _common import cpu_between, tree_cpu

import stoker
from stoker.loader import RecordSource
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize


def run(checksums, rec):
    t = Compose([Resize(128, shorter_side=True), RandomCrop(112), HorizontalFlip()])
    b = tree_cpu()
    n = 0
    with stoker.Loader(
        RecordSource(rec, checksums=checksums),
        batch_size=256,
        transforms=t,
        shuffle=True,
        seed=0,
        workers=2,
    ) as ld:
        for x, _y in ld:
            n += len(x)
        a = tree_cpu()
    return cpu_between(b, a) / n * 1e6


if __name__ == "__main__":
    rec = sys.argv[1]
    ratios = []
    for i in range(9):
        order = (True, False) if i % 2 else (False, True)
        r = {c: run(c, rec) for c in order}
        ratios.append(r[True] / r[False])
        print(
            f"pair {i + 1}: crc on {r[True]:.1f} off {r[False]:.1f} us/image  on/off {ratios[-1]:.3f}",
            flush=True,
        )
    print(f"median on/off {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
