"""``stoker index`` at collection scale: 1,000 tars x 1,000 samples (local, synthetic: each
sample one small JPEG and its ``.cls``, written with ``tarfile`` as a published collection's
tars are), indexed once; then, on a warm page cache, the manifest's size, the time from a fresh
interpreter's ``Loader(...)`` to its first batch, and the anonymous memory (``USS``) of each
worker after a stretch of shuffled reading at 2 and at 8 workers.

    python bench/bench_index_scale.py             # 1,000 x 1,000
    python bench/bench_index_scale.py --quick     # 100 x 200: a smoke run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import simplejpeg
from _common import command_line, cpu_count, warm_page_cache

FIRST_BATCH = """
import json, sys, time
t0 = time.perf_counter()
import stoker, psutil
ld = stoker.Loader(sys.argv[1], batch_size=64, shuffle=True, seed=0, workers=int(sys.argv[2]))
it = iter(ld)
next(it)
first = time.perf_counter() - t0
for _ in range(int(sys.argv[3])):
    next(it)
uss = [psutil.Process(pid).memory_full_info().uss for pid in ld.worker_pids()]
print(json.dumps({"first_batch_s": first, "worker_uss_mb": [u / 2**20 for u in uss]}))
ld.close()
"""


def write_tars(folder: str, tars: int, per: int) -> None:
    jpeg = simplejpeg.encode_jpeg(np.full((16, 16, 3), 128, np.uint8))
    for t in range(tars):
        with tarfile.open(os.path.join(folder, f"shard-{t:06d}.tar"), "w") as tf:
            for k in range(per):
                key = f"{t:06d}{k:06d}"
                for suffix, data in (("jpg", jpeg), ("cls", str(k % 10).encode())):
                    info = tarfile.TarInfo(f"{key}.{suffix}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="100 tars x 200 samples")
    ap.add_argument("--workers", type=int, default=4, help="index threads (default 4)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tars, per = (100, 200) if args.quick else (1000, 1000)
    work = tempfile.mkdtemp(prefix="stoker-bench-index-")
    print(f"command: {command_line()}\n{cpu_count()} cores, python {sys.version.split()[0]}")
    try:
        t0 = time.perf_counter()
        write_tars(work, tars, per)
        nbytes = sum(os.path.getsize(os.path.join(work, n)) for n in os.listdir(work))
        print(f"wrote {tars} tars x {per} samples ({nbytes / 1e9:.2f} GB) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
        from stoker.pack.index import index_collection

        out = os.path.join(work, "coll.stoker.json")
        pattern = os.path.join(work, f"shard-{{000000..{tars - 1:06d}}}.tar")
        t0 = time.perf_counter()
        index_collection(pattern, out, workers=args.workers, progress=False)
        dt = time.perf_counter() - t0
        print(f"index: {dt:.1f} s, {tars / dt:.1f} tars/s, {nbytes / 1e6 / dt:.0f} MB/s "
              f"({args.workers} threads)")  # fmt: skip
        print(f"manifest: {os.path.getsize(out) / 1e6:.3f} MB", flush=True)
        for name in os.listdir(work):
            warm_page_cache(os.path.join(work, name))
        for workers in (2, 8):
            got = subprocess.run(
                [sys.executable, "-c", FIRST_BATCH, out, str(workers), "50"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(got.stdout.strip().splitlines()[-1])
            uss = r["worker_uss_mb"]
            print(f"{workers} workers: first batch {r['first_batch_s']:.2f} s from a fresh "
                  f"interpreter; worker USS {min(uss):.0f}..{max(uss):.0f} MB")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
