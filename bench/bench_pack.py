"""Packing throughput beside a plain copy of the same files, measured in one run.

Makes sample data (20,000 JPEGs of 112x112 by default; ``--quick``: 600), warms the page
cache, then times ``cp -r`` and ``tar`` of the folder and ``stoker.pack`` with 1 worker, with
all workers, and with ``resize`` (re-encode). Prints images/s, MB/s and each method's time divided by the time of ``cp -r`` and of ``tar``
(1.0 means as fast as that copy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import cpu_count, make_images, warm_page_cache


def _tree_bytes(root: str) -> tuple[int, int]:
    n = size = 0
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".jpg"):
                n += 1
                size += os.path.getsize(os.path.join(d, f))
    return n, size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="600 images instead of 20,000")
    ap.add_argument("--images", type=int, default=None, help="number of images")
    ap.add_argument("--size", type=int, default=112, help="image side (default 112)")
    ap.add_argument("--workers", type=int, default=None, help="'all workers' (default: all cores)")
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from stoker import pack

    n_images = args.images or (600 if args.quick else 20_000)
    classes = 100 if n_images >= 10_000 else 10
    per_class = max(1, n_images // classes)
    all_workers = args.workers or cpu_count()
    work = args.dir or tempfile.mkdtemp(prefix="stoker-bench-pack-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, f"sample-{classes}x{per_class}-{args.size}")
    t0 = time.perf_counter()
    make_images(src, n=n_images, size=args.size, classes=classes)
    n, nbytes = _tree_bytes(src)
    print(
        f"data: {n} JPEGs {args.size}x{args.size}, {nbytes / 1e6:.1f} MB "
        f"({nbytes / max(n, 1) / 1e3:.1f} KB each), made/reused in {time.perf_counter() - t0:.1f} s; "
        f"{cpu_count()} cores, python {sys.version.split()[0]}",
        flush=True,
    )
    warm_page_cache(src)
    rows: list[tuple[str, float]] = []

    def timed(name: str, fn) -> None:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        rows.append((name, dt))
        print(f"  {name}: {dt:.2f} s", flush=True)

    try:
        dst = os.path.join(work, "copy")
        timed("cp -r", lambda: subprocess.run(["cp", "-r", src, dst], check=True))
        tar = os.path.join(work, "copy.tar")
        timed("tar -cf", lambda: subprocess.run(["tar", "-cf", tar, "-C", src, "."], check=True))
        shutil.rmtree(dst, ignore_errors=True)
        os.unlink(tar)
        for name, kw in [
            ("pack, 1 worker", {"workers": 1}),
            (f"pack, {all_workers} workers", {"workers": all_workers}),
            (
                f"pack --resize {args.size // 2}, {all_workers} workers",
                {"workers": all_workers, "resize": args.size // 2},
            ),
        ]:
            out = os.path.join(work, "packed")
            timed(name, lambda kw=kw, out=out: pack(src, out, overwrite=True, progress=False, **kw))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    cp_s, tar_s = rows[0][1], rows[1][1]
    print()
    print(f"{'method':<34} {'seconds':>8} {'images/s':>10} {'MB/s':>8} {'/ cp -r':>8} {'/ tar':>7}")
    for name, dt in rows:
        print(
            f"{name:<34} {dt:>8.2f} {n / dt:>10.0f} {nbytes / 1e6 / dt:>8.1f} "
            f"{dt / cp_s:>8.2f} {dt / tar_s:>7.2f}"
        )
    print("(/ cp -r, / tar: time of the method divided by the time of that copy; 1.0 = as fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
