"""Opening a large `.idx`: the MS1M case (5.8M records).

Writes a 5.8M-line `.idx` beside a sparse `.rec` (records are never read, only the index is
opened), then times in one run: the first open (parse + validate + write the binary cache),
a parse without the cache, and cached opens. `--quick` uses 580k lines.

    python bench/bench_index.py [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from _common import best_time

from stoker.formats.recordio import RecordFile
from stoker.formats.recordio.index import cache_path


def _write(dirpath: str, n: int) -> str:
    rec = os.path.join(dirpath, f"ms1m_like_{n}.rec")
    idx = rec[:-4] + ".idx"
    stride = 4096  # a typical 112x112 face JPEG plus its header, padded
    with open(rec, "wb") as f:
        f.truncate(n * stride + 8)  # sparse: no disk used, offsets are all inside the file
    keys = np.arange(n, dtype=np.int64)
    lines = np.char.add(np.char.add(keys.astype(str), "\t"), (keys * stride).astype(str))
    with open(idx, "w") as f:
        f.write("\n".join(lines.tolist()))
        f.write("\n")
    past = time.time() - 60  # older than the cache's racy-mtime window
    os.utime(idx, (past, past))
    return rec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = 580_000 if args.quick else 5_800_000
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        t0 = time.perf_counter()
        rec = _write(d, n)
        made = time.perf_counter() - t0
        idx = rec[:-4] + ".idx"
        print(f"{n:,} records, .idx {os.path.getsize(idx) / 1e6:.0f} MB, written in {made:.1f} s")

        def first_open() -> None:
            if os.path.exists(cache_path(idx)):
                os.unlink(cache_path(idx))
            RecordFile(rec, cache=True).close()

        def parse_only() -> None:
            RecordFile(rec, cache=False).close()

        def cached_open() -> None:
            RecordFile(rec, cache=True).close()

        rows = [
            ("first open (parse, validate, write cache)", best_time(first_open, 1)),
            ("open without the cache (parse + validate)", best_time(parse_only)),
            ("open with the binary cache", best_time(cached_open)),
        ]
        print(f"{'case':45} {'ms':>9}")
        for name, s in rows:
            print(f"{name:45} {s * 1e3:9.2f}")
        print(f"cached open is {rows[1][1] / rows[2][1]:.0f}x faster than a parse")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
