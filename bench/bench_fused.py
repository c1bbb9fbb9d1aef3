"""Per-image CPU time of the fused chain against the same chain run step by step, in one
process: ``Pipeline.fill_row`` with ``fuse=True`` (the default: a recognised
resize → crop → flip head runs as one op, resizing only the kept window and mirroring
straight into the batch row) against ``fuse=False`` (every step on its own, then the copy
into the row), on the same images with the same per-sample generators.

Rounds alternate (fused first in odd rounds, plain first in even ones); each round times a
pass over the images with the thread's CPU clock, so a busy machine slows both alike. The
ratio printed is plain/fused per round (above 1: the fused path is faster), as the median
of the rounds with their spread. ``decode+`` rows include the JPEG decode both sides share
(``Pipeline.decode_image``, scale-on-decode on); ``cv2.setNumThreads(1)``: one core.

    python bench/bench_fused.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from stoker._core.seeding import SampleRngs
from stoker._core.specs import ArraySpec
from stoker.pipeline import Pipeline
from stoker.transforms import (
    CenterCrop,
    Compose,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    RandomResizedCrop,
    Resize,
)

IMAGENET = Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass(frozen=True)
class Case:
    name: str
    hw: tuple[int, int]
    chain: Compose
    layout: str


CASES = [
    Case(
        "112: resize 128, crop 112, flip; uint8",
        (112, 112),
        Compose([Resize(128), RandomCrop(112), HorizontalFlip()]),
        "NHWC",
    ),
    Case(
        "112: ... + normalise; float32 CHW",
        (112, 112),
        Compose([Resize(128), RandomCrop(112), HorizontalFlip(), Normalize(0.5, 0.5)]),
        "NCHW",
    ),
    Case(
        "224: resize 256, crop 224, flip; uint8",
        (224, 224),
        Compose([Resize(256), RandomCrop(224), HorizontalFlip()]),
        "NHWC",
    ),
    Case(
        "224: ... + normalise; float32 CHW",
        (224, 224),
        Compose([Resize(256), RandomCrop(224), HorizontalFlip(), Normalize(0.5, 0.5)]),
        "NCHW",
    ),
    Case(
        "400x500: RandomResizedCrop 224, flip, normalise",
        (400, 500),
        Compose([RandomResizedCrop(224), HorizontalFlip(), IMAGENET]),
        "NCHW",
    ),
    Case(
        "400x500: resize 256 (shorter), centre crop 224",
        (400, 500),
        Compose([Resize(256, shorter_side=True), CenterCrop(224)]),
        "NHWC",
    ),
]


def photo(hw: tuple[int, int], seed: int) -> np.ndarray:
    """A smooth colour image with noise: something a JPEG encoder treats like a photo."""
    h, w = hw
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(seed)
    fx, fy = rng.uniform(0.02, 0.2, 2)
    img = np.stack(
        [
            127 + 100 * np.sin(fx * x + seed),
            127 + 100 * np.cos(fy * y),
            127 + 80 * np.sin(fx * x) * np.cos(fy * y),
        ],
        axis=-1,
    ) + rng.normal(0, 10, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def jpegs(hw: tuple[int, int], n: int) -> list[bytes]:
    out = []
    for i in range(n):
        ok, buf = cv2.imencode(".jpg", photo(hw, i)[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
        assert ok
        out.append(buf.tobytes())
    return out


def pass_time(fn: Callable[[int], None], n: int) -> float:
    """CPU seconds per image of ``fn(0) ... fn(n - 1)`` on this thread."""
    t0 = time.thread_time()
    for i in range(n):
        fn(i)
    return (time.thread_time() - t0) / n


def run_case(case: Case, n_images: int, rounds: int, reps: int) -> list[str]:
    bufs = jpegs(case.hw, n_images)
    spec = ArraySpec((None, None, 3), "uint8")
    pipes = {
        f: Pipeline(spec, transforms=case.chain, layout=case.layout, fuse=f) for f in (True, False)
    }
    assert pipes[True]._fused is not None and pipes[False]._fused is None
    rows = {f: np.empty(p.row_shape(), p.dtype) for f, p in pipes.items()}
    imgs = {f: [p.decode_image(b) for b in bufs] for f, p in pipes.items()}
    rngs = SampleRngs(0, 0)

    def step(f: bool, decode: bool) -> Callable[[int], None]:
        p, row, pre = pipes[f], rows[f], imgs[f]

        def one(i: int) -> None:
            k = i % n_images
            img = p.decode_image(bufs[k]) if decode else pre[k]
            p.fill_row(img, rngs.at(i), row, None, what="bench")

        return one

    lines = []
    for decode in (False, True):
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for f in (True, False) if r % 2 == 0 else (False, True):
                times[f].append(pass_time(step(f, decode), reps))
        ratios = [p / f for p, f in zip(times[False], times[True])]
        label = ("decode+" if decode else "") + case.name
        lines.append(
            f"{label:<52} {statistics.median(times[False]) * 1e6:8.1f} "
            f"{statistics.median(times[True]) * 1e6:8.1f}   {statistics.median(ratios):5.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f})"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and images")
    ap.add_argument("--rounds", type=int, default=None, help="paired rounds (default 9)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 9)
    reps = 100 if args.quick else 400
    cv2.setNumThreads(1)
    print(f"one core (cv2.setNumThreads(1)); OpenCV {cv2.__version__}, NumPy {np.__version__}")
    print(f"{rounds} paired rounds of {reps} images, thread CPU time, medians (spread of ratio)")
    print(f"{'chain':<52} {'plain µs':>8} {'fused µs':>8}   plain/fused")
    for case in CASES:
        for line in run_case(case, 32, rounds, reps):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
