"""The last step of a sample, per image on one core: a uint8 HWC crop (a view of a larger
resized image, as a crop gives it) written into a batch row, as float32 CHW normalised
(ImageNet mean and std) or as uint8 CHW, by each way there is to write it.

float32 CHW, from the crop:
  stoker          Normalize.write: cv2.split into uint8 planes, then per plane one
                  cv2.addWeighted pass (convert, scale, shift) from the uint8 plane into the
                  row's plane
  in place        the way before: split, then per plane a conversion into the row's plane
                  and cv2.addWeighted (scale, shift) over it in place (the same bits for a
                  plane of a multiple of 64 values; the float plane written twice)
  table           split, then a 256-entry table per plane (cv2.LUT): the previous way
  numpy chain     np.ascontiguousarray of the CHW view, astype(float32), subtract, multiply
                  into the row (the plain chain, contiguous first)
  numpy strided   astype(float32) of the transposed view, subtract, multiply into the row
  split + ufunc   split, then np.multiply(plane, gain, out=row plane) and np.add in place
  transform       the crop copied into a float32 HWC scratch, cv2.transform (gain, bias) in
                  place, cv2.split into the row's planes
float32 HWC: stoker's (copy into the row, cv2.transform in place) against the table.
uint8 CHW: stoker's write_chw (a copy, then cv2.split into the row's planes) against
NumPy's transposing copy (``row[...] = crop.transpose(2, 0, 1)``) and a contiguous copy first.

Rounds alternate the candidates' order; each round times a pass over the same crops with the
thread's CPU clock. Printed: µs per image, the median of the rounds with their spread, and
each candidate's median over stoker's. Every float candidate's pixels are checked against the
float64 formula (at most 1e-6 apart).

    python bench/bench_normalize.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from _common import MEAN, STD, alternated, bench_parser, command_line, median_range  # noqa: E402

from stoker.transforms import Normalize  # noqa: E402
from stoker.transforms.fused import write_chw  # noqa: E402

Write = Callable[[np.ndarray, np.ndarray], None]


def candidates(size: int) -> dict[str, tuple[str, Write]]:
    """name -> (output kind, write(crop, row))."""
    chw_op = Normalize(MEAN, STD, layout="CHW")
    mean = (np.asarray(MEAN, np.float32) * 255).reshape(3, 1, 1)
    inv = (1 / (np.asarray(STD, np.float32) * 255)).reshape(3, 1, 1)
    gain = (1 / (255 * np.asarray(STD))).astype(np.float32)
    bias = (-np.asarray(MEAN) / np.asarray(STD)).astype(np.float32)
    matrix = np.zeros((3, 4), np.float32)
    matrix[[0, 1, 2], [0, 1, 2]] = gain
    matrix[:, 3] = bias
    planes = [np.empty((size, size), np.uint8) for _ in range(3)]
    luts = [
        ((np.arange(256) / 255 - MEAN[k]) / STD[k]).astype(np.float32).reshape(256, 1)
        for k in range(3)
    ]
    scratch = np.empty((size, size, 3), np.float32)

    def table(crop: np.ndarray, row: np.ndarray) -> None:
        cv2.split(np.ascontiguousarray(crop), planes)
        for k in range(3):
            cv2.LUT(planes[k], luts[k], dst=row[k])

    def in_place(crop: np.ndarray, row: np.ndarray) -> None:
        cv2.split(np.ascontiguousarray(crop), planes)
        for k in range(3):
            np.copyto(row[k], planes[k], casting="unsafe")
            cv2.addWeighted(row[k], float(gain[k]), row[k], 0.0, float(bias[k]), dst=row[k])

    def numpy_chain(crop: np.ndarray, row: np.ndarray) -> None:
        x = np.ascontiguousarray(crop.transpose(2, 0, 1)).astype(np.float32)
        x -= mean
        np.multiply(x, inv, out=row)

    def numpy_strided(crop: np.ndarray, row: np.ndarray) -> None:
        x = crop.transpose(2, 0, 1).astype(np.float32)
        x -= mean
        np.multiply(x, inv, out=row)

    def split_ufunc(crop: np.ndarray, row: np.ndarray) -> None:
        cv2.split(np.ascontiguousarray(crop), planes)
        for k in range(3):
            np.multiply(planes[k], gain[k], out=row[k])
            np.add(row[k], bias[k], out=row[k])

    def transform(crop: np.ndarray, row: np.ndarray) -> None:
        np.copyto(scratch, crop, casting="unsafe")
        cv2.transform(scratch, matrix, dst=scratch)
        cv2.split(scratch, [row[0], row[1], row[2]])

    hwc_op = Normalize(MEAN, STD)
    lut_hwc = np.stack([lut[:, 0] for lut in luts], 1).reshape(256, 1, 3)

    def hwc_table(crop: np.ndarray, row: np.ndarray) -> None:
        cv2.LUT(np.ascontiguousarray(crop), lut_hwc, dst=row)

    def u8_numpy(crop: np.ndarray, row: np.ndarray) -> None:
        row[...] = crop.transpose(2, 0, 1)

    def u8_contiguous(crop: np.ndarray, row: np.ndarray) -> None:
        row[...] = np.ascontiguousarray(crop).transpose(2, 0, 1)

    return {
        "float32 CHW: stoker (split + addWeighted from uint8)": (
            "f",
            lambda c, r: chw_op.write(c, r, chw=True),
        ),
        "float32 CHW: split, convert into the row, addWeighted in place": ("f", in_place),
        "float32 CHW: table (split + LUT)": ("f", table),
        "float32 CHW: numpy chain, contiguous first": ("f", numpy_chain),
        "float32 CHW: numpy, strided astype": ("f", numpy_strided),
        "float32 CHW: split + numpy ufuncs out=": ("f", split_ufunc),
        "float32 CHW: float copy + transform + split": ("f", transform),
        "float32 HWC: stoker (copy + transform)": ("h", lambda c, r: hwc_op.write(c, r, chw=False)),
        "float32 HWC: table (LUT)": ("h", hwc_table),
        "uint8 CHW: stoker write_chw": ("u", lambda c, r: write_chw(c, r)),
        "uint8 CHW: numpy transposing copy": ("u", u8_numpy),
        "uint8 CHW: contiguous copy, then transpose": ("u", u8_contiguous),
    }


def crops(size: int, n: int) -> list[np.ndarray]:
    """``n`` crops of ``size`` from photo-like images 16 px larger, views as a crop gives."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        y, x = np.mgrid[0 : size + 16, 0 : size + 16].astype(np.float32)
        img = np.stack([x * 2 + i, y * 2, 128 + 60 * np.sin((x + y) / 9)], -1)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        t, left = rng.integers(0, 17, 2)
        out.append(img[t : t + size, left : left + size])
    return out


def check(name: str, kind: str, fn: Write, crop: np.ndarray) -> None:
    """A float candidate's pixels against the float64 formula; a uint8 one's against the
    transposed crop."""
    want = crop.transpose(2, 0, 1) if kind == "u" else None
    if kind != "u":
        exact = (crop / 255.0 - np.asarray(MEAN)) / np.asarray(STD)
        want = exact.transpose(2, 0, 1) if kind == "f" else exact
    row = np.empty(want.shape, np.uint8 if kind == "u" else np.float32)
    fn(crop, row)
    err = float(np.abs(row - want).max())
    if err > (0 if kind == "u" else 1e-6):
        raise SystemExit(f"{name}: pixels {err:g} from the formula")


def run(size: int, n: int, rounds: int) -> None:
    cands = candidates(size)
    imgs = crops(size, n)
    rows = {
        kind: np.empty((n, 3, size, size) if kind != "h" else (n, size, size, 3), dtype)
        for kind, dtype in (("f", np.float32), ("h", np.float32), ("u", np.uint8))
    }
    for name, (kind, fn) in cands.items():
        check(name, kind, fn, imgs[0])
    times: dict[str, list[float]] = {name: [] for name in cands}
    for r in range(rounds + 1):  # round 0 warms caches and scratch buffers, not counted
        for name in alternated(list(cands), r):
            kind, fn = cands[name]
            out = rows[kind]
            t = time.thread_time()
            for i, crop in enumerate(imgs):
                fn(crop, out[i])
            if r:
                times[name].append((time.thread_time() - t) / n * 1e6)
    print(f"\n{size}x{size} crops, {n} per round, {rounds} rounds")
    print("| candidate | µs/image, median (min..max) | / stoker's |")
    print("|---|---:|---:|")
    ref = {k: median_range(times[next(n for n in cands if cands[n][0] == k)])[0] for k in "fhu"}
    for name, (kind, _fn) in cands.items():
        med, lo, hi = median_range(times[name])
        print(f"| {name} | {med:.1f} ({lo:.1f}..{hi:.1f}) | {med / ref[kind]:.2f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = bench_parser(__doc__, "64 crops, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (9; --quick: 3)")
    ap.add_argument("--images", type=int, default=None, help="crops per round (512)")
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    cv2.setNumThreads(1)
    rounds = args.rounds or (3 if args.quick else 9)
    n = args.images or (64 if args.quick else 512)
    print(f"command: {command_line()}")
    print(f"one core; OpenCV {cv2.__version__}, NumPy {np.__version__}")
    for size in (112, 224):
        run(size, n, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
