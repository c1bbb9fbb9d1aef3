"""What an LMDB set of raw Caffe Datums costs per image on the way to the batch: the pixels the
reader hands over (``Reader.encoded`` per sample: a raw Datum arrives as its decoded array) next
to the PNG round trip the reader used to make of every raw Datum (write a stored-deflate PNG of
the pixels, then decode it), each from the database value to the decoded uint8 RGB array.

Writes N raw Datums (256 x 256 x 3 by default) with the ``lmdb`` package, then times both ways
in paired rounds (the order alternates each round), CPU seconds per image, single process, the
database in the page cache.

    python bench/bench_lmdb_raw.py [--records N] [--size PX] [--rounds R]
    python bench/bench_lmdb_raw.py --quick    # 200 records, 3 rounds: a smoke run
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
from _common import alternated, bench_parser, command_line, median_range

import stoker.formats
from stoker.codecs import decode
from stoker.formats.lmdb.datum import encode_png, parse_datum


def _write(path: str, n: int, size: int) -> None:
    import lmdb

    rng = np.random.default_rng(0)
    chw = rng.integers(0, 255, (3, size, size), dtype=np.uint8).tobytes()
    head = bytes([0x08, 3, 0x10]) + _varint(size) + b"\x18" + _varint(size)
    value = head + b"\x22" + _varint(len(chw)) + chw
    env = lmdb.open(path, map_size=max(1 << 26, n * (len(value) + 256) * 2))
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(b"%08d" % i, value + b"\x28" + _varint(i % 10))
    env.close()


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "200 records, 3 rounds: a smoke run")
    ap.add_argument("--records", type=int, default=None, help="records (2,000; quick 200)")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels (256)")
    ap.add_argument("--rounds", type=int, default=None, help="paired rounds (9; quick 3)")
    args = ap.parse_args(argv)
    args.records = args.records or (200 if args.quick else 2_000)
    args.rounds = args.rounds or (3 if args.quick else 9)
    return args


def main() -> None:
    args = parse_args()
    work = tempfile.mkdtemp(prefix="stoker-lmdb-raw-")
    try:
        path = os.path.join(work, "raw")
        _write(path, args.records, args.size)
        r = stoker.formats.open(path)
        env = r._env()  # the old way starts from the same value the reader looks up
        keys = [b"%08d" % i for i in range(args.records)]

        def arrays() -> None:
            f = r.reader(np.arange(args.records), ())
            for i in range(args.records):
                img = f(i)[0]
                assert img.shape[2] == 3

        def png_round_trip() -> None:
            with env.begin() as txn:
                for k in keys:
                    d = parse_datum(txn.get(k))
                    decode(encode_png(d.data, d.channels, d.height, d.width))

        ways = {"arrays": arrays, "png round trip": png_round_trip}
        arrays(), png_round_trip()  # warm: the page cache, the key list, the codecs
        per: dict[str, list[float]] = {w: [] for w in ways}
        for k in range(args.rounds):
            for name in alternated(list(ways), k):
                t = time.process_time()
                ways[name]()
                per[name].append((time.process_time() - t) / args.records * 1e6)
        r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# {command_line()}")
    print(f"{args.records} raw Datums of {args.size} x {args.size} x 3, {args.rounds} rounds")
    print("| way | CPU µs per image: median (min-max) |")
    print("|---|---|")
    for name, v in per.items():
        med, lo, hi = median_range(v)
        print(f"| {name} | {med:.0f} ({lo:.0f}-{hi:.0f}) |")
    ratios = [a / b for a, b in zip(per["png round trip"], per["arrays"])]
    med, lo, hi = median_range(ratios)
    print(f"png round trip / arrays, paired: {med:.2f}x ({lo:.2f}-{hi:.2f})")


if __name__ == "__main__":
    main()
