"""``stoker sample-data DIR``: a folder of photo-like JPEGs with a learnable class signal."""

from __future__ import annotations

import argparse
import time

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


def _size(text: str) -> int | tuple[int, int]:
    try:
        if "x" in text:
            h, w = text.lower().split("x")
            return int(h), int(w)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected S or HxW, got {text!r}") from None


HELP = "make a folder of sample images to try things on"
DESCRIPTION = """Make DIR/class_NN/*.jpg: N classes x K photo-like images a small CNN can
learn."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="output folder")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    p.add_argument("--per-class", type=int, default=100, help="images per class (default 100)")
    p.add_argument("--size", type=_size, default=112, help="S or HxW pixels (default 112)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--format", choices=("jpg", "png"), default="jpg", help="file format")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty folder")


def run(args: argparse.Namespace) -> int:
    from stoker.cli._remote import guarded

    return guarded("sample-data", args, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from stoker.cli._errors import folder_problem, refuse
    from stoker.pack import make_sample_data

    problem = folder_problem(args.dir, "DIR")
    if problem is not None:
        return refuse("sample-data", problem)
    t0 = time.perf_counter()
    path = make_sample_data(
        args.dir,
        classes=args.classes,
        per_class=args.per_class,
        size=args.size,
        seed=args.seed,
        fmt=args.format,
        workers=args.workers,
        overwrite=args.overwrite,
    )
    dt = time.perf_counter() - t0
    n = args.classes * args.per_class
    print(
        f"{n} images in {args.classes} classes under {path} ({dt:.1f} s, {n / max(dt, 1e-9):.0f} images/s)"
    )
    return 0
