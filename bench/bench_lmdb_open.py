"""What opening an untrusted LMDB database costs: the page check before the first open.

Writes an LSUN-style database of N small JPEGs (10,000 by default), then times, each on a
fresh cache directory (so the check and the key list are not cached) and then with both cached:

- the meta page check alone (plain reads of pages 0 and 1);
- the B-tree walk in a child process (``_walk.py``: a cursor pass over keys and values and a
  lookup of every key);
- a whole first open (``stoker.formats.open``: check, walk, key list, layout) and a cached open.

The database is in the page cache for every round (written just before, then read once).

    python bench/bench_lmdb_open.py [--records N] [--dir DIR]
    python bench/bench_lmdb_open.py --quick    # 2,000 records: a smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import cv2
import numpy as np
from _common import best_time, command_line, warm_page_cache

import stoker.formats
from stoker.formats.lmdb import guard
from stoker.formats.lmdb.location import locate
from stoker.formats.lmdb.pages import read_meta


def _write(path: str, n: int) -> None:
    import lmdb

    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    env = lmdb.open(path, map_size=1 << 32)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(f"{i * 2654435761 % (1 << 160):040x}".encode(), buf.tobytes())
    env.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=None, help="records (10,000; quick 2,000)")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--quick", action="store_true", help="2,000 records: a smoke run")
    args = ap.parse_args(argv)
    if args.records is None:
        args.records = 2_000 if args.quick else 10_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = tempfile.mkdtemp(dir=args.dir, prefix="bench_lmdb_open_")
    try:
        db = os.path.join(root, "db")
        _write(db, args.records)
        data = os.path.join(db, "data.mdb")
        warm_page_cache(data)
        loc = locate(db)
        rounds = 0

        def fresh_cache() -> None:
            nonlocal rounds
            rounds += 1
            os.environ["STOKER_CACHE_DIR"] = os.path.join(root, f"cache{rounds}")
            guard._SEEN.clear()

        meta = best_time(lambda: read_meta(data, db), repeat=20)
        walk = best_time(lambda: guard._walk(loc), repeat=5)

        def first_open() -> None:
            fresh_cache()
            stoker.formats.open(db).close()

        first = best_time(first_open, repeat=5)
        guard._SEEN.clear()  # the cached verdict is read from the cache directory
        cached = best_time(lambda: stoker.formats.open(db).close(), repeat=20)
        size = os.path.getsize(data)
        print(f"# {command_line()}")
        print(f"{args.records} records, data.mdb {size / 1e6:.1f} MB")
        print("| step | ms (best) |\n|---|---:|")
        print(f"| meta page check | {meta * 1e3:.2f} |")
        print(f"| B-tree walk in a child process | {walk * 1e3:.1f} |")
        print(f"| first open (check, walk, key list, layout) | {first * 1e3:.1f} |")
        print(f"| open with the verdict and key list cached | {cached * 1e3:.2f} |")
        t0 = time.perf_counter()
        with stoker.formats.open(db) as r:
            f = r.reader()
            for i in range(len(r)):
                f(i)
        print(f"(reading every record once: {(time.perf_counter() - t0) * 1e3:.0f} ms)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
