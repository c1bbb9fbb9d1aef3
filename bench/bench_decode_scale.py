"""Whether a DCT-scaled JPEG decode can serve RandomResizedCrop(224) on ImageNet-sized photos.

libjpeg-turbo decodes at M/8 of the full size (simplejpeg picks the smallest scale that gives
at least ``min_height`` x ``min_width``). A sample's crop box could be drawn on the header's
size first and the image decoded at the smallest scale that still leaves the box 224 pixels a
side. This times, per image on one core, the decode of 500x375 sample JPEGs (the bench's
ImageNet case) at full size and at each scale down to 1/2, with the box a scale still serves
(224 / scale pixels a side at least) and the share of torchvision's RandomResizedCrop boxes on
a 500x375 image that are that large. Rounds alternate the scales' order; medians with their
spread.

    python bench/bench_decode_scale.py [--quick] [--rounds N]
"""

from __future__ import annotations

import os
import random
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import alternated, bench_parser, command_line, make_data, median_range  # noqa: E402

SCALES = (8, 7, 6, 5, 4)  # eighths


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "50 images, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (7; --quick: 3)")
    ap.add_argument("--work", default=None, help="data folder (default: a temporary one)")
    return ap.parse_args(argv)


def box_share(h: int, w: int, side: float, draws: int = 20_000) -> float:
    """The share of torchvision's RandomResizedCrop boxes on an ``h`` x ``w`` image (its
    defaults) at least ``side`` pixels in both sides."""
    from bench_loader import rrc_box

    rnd = random.Random(0)
    hits = 0
    for _ in range(draws):
        _top, _left, bh, bw = rrc_box(h, w, rnd)
        hits += bh >= side and bw >= side
    return hits / draws


def main() -> int:
    import simplejpeg

    from stoker.formats.recordio import RecordFile

    args = parse_args()
    n = 50 if args.quick else 200
    rounds = args.rounds or (3 if args.quick else 7)
    work = Path(args.work or os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    _images, rec = make_data(work, n=n, size=(375, 500), name=f"rrc_375x500_{n}")
    r = RecordFile(rec)
    payloads = [bytes(r.read_header(i)[1]) for i in range(len(r))]
    r.close()
    h, w, _, _ = simplejpeg.decode_jpeg_header(payloads[0])
    times: dict[int, list[float]] = {m: [] for m in SCALES}
    shapes: dict[int, tuple[int, ...]] = {}
    for k in range(rounds):
        for m in alternated(list(SCALES), k):
            mh, mw = -(-h * m // 8), -(-w * m // 8)
            t = time.thread_time()
            for p in payloads:
                img = simplejpeg.decode_jpeg(p, colorspace="RGB", min_height=mh, min_width=mw)
            times[m].append((time.thread_time() - t) / len(payloads) * 1e6)
            shapes[m] = img.shape
    print(f"command: {command_line()}")
    print(f"# {len(payloads)} JPEGs of {w}x{h}, one core, simplejpeg {simplejpeg.__version__}")
    print(
        "| scale | decoded | µs/image, median (min..max) | / full size | box it serves | boxes that large |"
    )
    print("|---|---|---:|---:|---:|---:|")
    full = median_range(times[8])[0]
    for m in SCALES:
        med, lo, hi = median_range(times[m])
        side = 224 * 8 / m
        share = box_share(h, w, side)
        dims = f"{shapes[m][1]}x{shapes[m][0]}"
        print(
            f"| {m}/8 | {dims} | {med:.0f} ({lo:.0f}..{hi:.0f}) | {med / full:.2f} "
            f"| {side:.0f} px | {100 * share:.1f} % |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
