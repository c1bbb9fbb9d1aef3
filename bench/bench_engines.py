"""Packing with ``engine="ray"`` beside the local process pool, on the same folder in one run.

Makes sample data (20,000 JPEGs of 112x112 by default; ``--quick``: 600, 1 round), warms the page
cache, then packs it with the local pool and with Ray (one task per shard, ``--shard-size``
images each), each with 1 and with 2 worker processes (Ray: a Ray started by this bench with
``num_cpus`` 1 or 2, one task per CPU), in ``--rounds`` alternating rounds. Ray's start and its
workers' first start are outside the clock (a warm-up task runs first); everything a pack call
does (listing, the tasks, the finalize that verifies every shard) is inside. Prints images/s
per candidate (median over rounds), the overhead ratio Ray / local at the same worker count,
and the scaling from 1 to 2 workers of each engine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from _common import command_line, cpu_count, make_images, warm_page_cache


def _pack(src: str, out: str, workers: int, engine: str, shard_size: int) -> float:
    from stoker import pack

    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    t0 = time.perf_counter()
    report = pack(
        src,
        out,
        workers=workers if engine == "local" else None,
        engine=engine,
        shard_size=shard_size,
        progress=False,
    )
    dt = time.perf_counter() - t0
    return report.written / dt


def _ray_round(ray, src: str, out: str, workers: int, shard_size: int) -> float:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING")
    try:
        warm = ray.remote(num_cpus=1)(_noop)
        ray.get([warm.remote() for _ in range(workers)])  # workers started before the clock
        return _pack(src, out, workers, "ray", shard_size)
    finally:
        ray.shutdown()


def _noop() -> int:
    import stoker.pack.steps  # noqa: F401 - what a shard task imports

    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="600 images and 1 round: a smoke run")
    ap.add_argument("--images", type=int, default=None, help="number of images")
    ap.add_argument("--size", type=int, default=112, help="image side (default 112)")
    ap.add_argument("--shard-size", type=int, default=None, help="images per shard")
    ap.add_argument(
        "--rounds", type=int, default=None, help="alternating rounds (default 2; --quick: 1)"
    )
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"command: {command_line()}", flush=True)
    try:
        import ray
    except ImportError:
        print("ray is not installed (pip install stoker[ray]); nothing to compare")
        return 0
    n_images = args.images or (600 if args.quick else 20_000)
    args.rounds = args.rounds or (1 if args.quick else 2)
    shard_size = args.shard_size or max(100, n_images // 20)
    classes = 100 if n_images >= 10_000 else 10
    work = args.dir or tempfile.mkdtemp(prefix="stoker-bench-engines-")
    src = os.path.join(work, f"sample-{classes}x{n_images // classes}-{args.size}")
    make_images(src, n=n_images, size=args.size, classes=classes)
    print(
        f"data: {n_images} JPEGs {args.size}x{args.size}, shards of {shard_size}; "
        f"{cpu_count()} cores, python {sys.version.split()[0]}, ray {ray.__version__}",
        flush=True,
    )
    out = os.path.join(work, "out", "set")
    rates: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for workers in (1, 2):
            warm_page_cache(src)
            rates.setdefault(("local", workers), []).append(
                _pack(src, out, workers, "local", shard_size)
            )
            warm_page_cache(src)
            rates.setdefault(("ray", workers), []).append(
                _ray_round(ray, src, out, workers, shard_size)
            )
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\n| engine | workers | images/s (median) | rounds | ray / local |")
    print("|---|---:|---:|---|---:|")
    for (engine, workers), v in sorted(rates.items()):
        ratio = med[(engine, workers)] / med[("local", workers)]
        each = ", ".join(f"{x:,.0f}" for x in v)
        print(f"| {engine} | {workers} | {med[(engine, workers)]:,.0f} | {each} | {ratio:.2f} |")
    for engine in ("local", "ray"):
        print(f"scaling 1 -> 2 workers, {engine}: {med[(engine, 2)] / med[(engine, 1)]:.2f}x")
    shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
