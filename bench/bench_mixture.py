"""A mixture of two sets against one set of the same images, the loader's steady rate side by
side in one run.

Makes ``--images`` sample JPEGs and packs them three times: as one RecordIO set (the single-set
loader's), and as a RecordIO set A and a TFRecord set B (the mixture ``Loader([A, B],
weights=[0.5, 0.5], epoch_size=N)``: epochs of the single set's length, half from each set). In rounds
whose candidate order alternates, each loader (decode, Resize(128) -> RandomCrop(112) -> flip,
shuffled, ``--workers``) runs ``--epochs`` epochs; the steady rate is the images per second of
the epochs after the first (workers warm). The table gives each round's rates and the median
ratio mixture / single with its spread; the target is a ratio of at least 0.95.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    alternated,
    bench_parser,
    command_line,
    cpu_count,
    make_images,
    median_range,
    stoker_transforms,
)


def steady_rate(source, args, **kw) -> float:
    """Images per second over the epochs after the first of one loader."""
    from stoker import Loader

    with Loader(
        source,
        batch_size=args.batch_size,
        transforms=stoker_transforms("112", normalize=False),
        shuffle=True,
        seed=0,
        workers=args.workers,
        **kw,
    ) as loader:
        for _ in loader:
            pass
        n, t0 = 0, time.perf_counter()
        for _ in range(args.epochs - 1):
            n += sum(len(b) for b in loader)
        return n / (time.perf_counter() - t0)


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "600 images, 3 epochs, 2 rounds")
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None, help="default: the usable cores")
    ap.add_argument("--work", default=None, help="a folder for the data (default: a temp one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.epochs, args.rounds = 600, 3, 2
    args.workers = cpu_count() if args.workers is None else args.workers
    return args


def main(argv: list[str] | None = None) -> int:
    from stoker import pack

    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        images = make_images(work / "images", n=args.images, size=(144, 128), seed=1)
        sets = {}
        for name, fmt in (("one", "recordio"), ("a", "recordio"), ("b", "tfrecord")):
            out = work / name / "train"
            pack(images, out, format=fmt, shard_size=500, overwrite=True, progress=False)
            sets[name] = str(out) + ".stoker.json"
        candidates = {
            "single": (sets["one"], {}),
            "mixture": (
                [sets["a"], sets["b"]],
                {"weights": [0.5, 0.5], "epoch_size": args.images},
            ),
        }
        rates: dict[str, list[float]] = {k: [] for k in candidates}
        for r in range(args.rounds):
            for name in alternated(list(candidates), r):
                source, kw = candidates[name]
                rates[name].append(steady_rate(source, args, **kw))
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f} img/s" for k, v in rates.items()))
    ratios = [m / s for m, s in zip(rates["mixture"], rates["single"])]
    med, lo, hi = median_range(ratios)
    print(f"\n{command_line()}")
    print(f"{args.images} images, {args.workers} workers, batch {args.batch_size}")
    print("| loader | steady img/s (median) |\n|---|---|")
    for k, v in rates.items():
        print(f"| {k} | {statistics.median(v):,.0f} |")
    print(f"mixture / single: {med:.3f} ({lo:.3f}..{hi:.3f}); target >= 0.95")
    return 0


if __name__ == "__main__":
    sys.exit(main())
