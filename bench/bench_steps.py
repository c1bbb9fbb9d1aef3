"""Where a 112-px image's CPU time goes in a loader worker and in the plain chain (e), step by
step, per image on one core.

The loader bench's images and chain (resize 128 -> random crop 112 -> flip, then float32 NCHW
normalised or uint8 NCHW): each step on its own over the same records, in one process with one
OpenCV thread, ``--rounds`` rounds with the order of the steps reversed every other round;
thread CPU time per image, median (min..max). Stoker's steps are those of ``fill_chunk``: the
record read with its CRC32C check, the JPEG header read (simplejpeg's, and the marker walk
the worker's decoder runs), the decode, the seeded draws (from a
generator re-keyed per sample, and from the first blocks of a chunk of 128 computed at once,
which is how ``fill_chunk`` takes them for this chain), the
window resize, the flip (or the copy of an unmirrored crop), the split into planes and, in
float32, the conversion, scale and shift of each plane into the row; then the whole row writer
and the whole ``fill_chunk`` per sample (its rows in a private batch array: the ring and the
IPC around a chunk are the loader bench's business), also as it ran before it took the first
blocks, with a generator re-keyed per sample; each of those two against the other, and the
whole chain against ``fill_chunk``, as a ratio per round. The chain's steps are ``cv2.imdecode``,
``cv2.resize`` to 128x128 and the fastest of ``bench_loader.CHAIN_WRITES`` (crop and flip are
views), then the whole chain.

Then the same steps timed in place: each side's whole loop run as it runs (stoker's as the row
writer runs it, on records read through the source's reader chunk by chunk; the chain's as (e)
runs it), with a ``perf_counter_ns`` read between its steps, so each step pays the caches the
steps before it left (a step timed alone runs over warm ones). The steps' sum is the loop's
time (plus about 0.1 µs per clock read); it says where the whole loop's time goes, which the
steps timed alone do not add up to.

    python bench/bench_steps.py            # 2,000 records, 9 rounds
    python bench/bench_steps.py --quick    # 300 records, 3 rounds
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import bench_parser, command_line, make_data, median_range, stoker_transforms

_OPEN: list = []


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "300 records, 3 rounds")
    ap.add_argument("--images", type=int, default=None, help="records timed (2,000)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, order alternating (9)")
    ap.add_argument("--work", default=None, help="data folder (default: a temporary one)")
    return ap.parse_args(argv)


def stoker_steps(rec: str, n: int, normalize: bool) -> dict:
    """name -> f() running one step over the ``n`` records (per image: divide by n)."""
    import cv2

    from stoker._core.seeding import SampleRngs
    from stoker.loader import Loader
    from stoker.loader._worker import Task, fill_chunk
    from stoker.transforms.fused import _window_plan

    ld = Loader(rec, batch_size=256, transforms=stoker_transforms("112", normalize=normalize),
                layout="NCHW", shuffle=False, seed=0, workers=0)  # fmt: skip
    _OPEN.append(ld)  # its source stays open while the steps run
    src, pipe = ld.source, ld.pipeline
    order = np.random.default_rng(0).permutation(len(src))[:n].astype(np.int64)
    gis = order.tolist()
    read = src.reader(order)
    payloads = [bytes(read(gi)[0]) for gi in gis]
    decode, write = pipe.decoder(), pipe.row_writer()
    assert write is not None
    imgs = [decode(p) for p in payloads]
    rows = np.empty((256, *pipe.row_shape()), pipe.dtype)
    views = (rows, np.empty(256, np.int64), np.empty(256, np.int64), np.empty(256, np.int64))
    rngs = SampleRngs(0, 0)
    draws = [tuple(rngs.at(gi).random(3).tolist()) for gi in gis]
    buf, scratch = np.empty((120, 120, 3), np.uint8), np.empty((112, 112, 3), np.uint8)
    planes = [np.empty((112, 112), np.uint8) for _ in range(3)]
    plans = [_window_plan(112, 112, 128, 128, int(u0 * 17), int(u1 * 17), 112, 112)
             for u0, u1, _ in draws]  # fmt: skip
    norm = pipe._tail  # the trailing Normalize (None in uint8)
    import simplejpeg

    from stoker.codecs.jpeg import jpeg_frame

    def each(fn):
        return lambda: [fn(j) for j in range(n)]

    def resize(j):
        ys, xs, size, _, _ = plans[j]
        cv2.resize(imgs[j][ys, xs], size, dst=buf, interpolation=cv2.INTER_LINEAR)

    def flip(j):
        ky, kx = plans[j][3], plans[j][4]
        if draws[j][2] < 0.5:
            cv2.flip(buf[ky, kx], 1, dst=scratch)
        else:
            np.copyto(scratch, buf[ky, kx])

    def split(j):
        cv2.split(scratch, [rows[j % 256][k] for k in range(3)] if not normalize else planes)

    def scale(j):
        row = rows[j % 256]
        for k in range(3):  # as Normalize.planes_writer: convert, scale, shift in one pass
            p = planes[k]
            cv2.addWeighted(p, norm._gain[k], p, 0.0, norm._bias[k], dst=row[k], dtype=cv2.CV_32F)

    def each_chunk(fn):  # per 128 samples, as a worker's chunk of a 256 batch over 2 workers
        def run():
            for b in range(0, n, 128):
                fn(b)

        return run

    def chunks():
        for b in range(0, n, 128):
            task = Task(1, 0, 0, 0, None, 256, b % 256, order[b : b + 128], 0, None, 0)
            fill_chunk(task, source=src, pipeline=pipe, seed=0, views=views, on_error="raise")

    steps = {
        "record read + CRC32C check": each(lambda j: read(gis[j])),
        "JPEG header (simplejpeg)": each(lambda j: simplejpeg.decode_jpeg_header(payloads[j])),
        "JPEG header (marker walk)": each(lambda j: jpeg_frame(payloads[j])),
        "JPEG decode to RGB (simplejpeg)": each(
            lambda j: simplejpeg.decode_jpeg(payloads[j], colorspace="RGB")
        ),
        "seeded draws (re-key, random(3))": each(lambda j: rngs.at(gis[j]).random(3)),
        "seeded draws (first blocks of 128)": each_chunk(
            lambda b: rngs.first_blocks(order[b : b + 128]).tolist()
        ),
        "window resize 105x105 -> 120x120": each(resize),
        "flip, or copy of the crop": each(flip),
        "split into planes": each(split),
    }
    if normalize:
        steps["convert, scale, shift: 3 planes into the row"] = each(scale)
    steps["the whole row writer (draws to row)"] = each(
        lambda j: write(imgs[j], rngs.at(gis[j]), rows[j % 256])
    )
    steps["fill_chunk per sample (read to row)"] = chunks

    def chunks_rekeyed():  # the way before first_blocks: a generator re-keyed per sample
        from stoker.loader import _worker

        was, _worker.FIRST_BLOCKS_FROM = _worker.FIRST_BLOCKS_FROM, 1 << 62
        try:
            chunks()
        finally:
            _worker.FIRST_BLOCKS_FROM = was

    steps["fill_chunk per sample, draws from a re-keyed generator"] = chunks_rekeyed
    return steps


def chain_steps(rec: str, n: int, normalize: bool) -> dict:
    import random

    import cv2
    from bench_loader import CHAIN_WRITES, _chain_112, _chain_setup, chain_write

    payloads, _, _ = _chain_setup(rec, "112", 0, n)
    imgs = [cv2.imdecode(b, cv2.IMREAD_COLOR_RGB) for b in payloads]
    big = [cv2.resize(i, (128, 128), interpolation=cv2.INTER_LINEAR) for i in imgs]
    rnd = random.Random(0)
    crops = [_chain_112(i, rnd) for i in imgs]
    rows = np.empty((256, 3, 112, 112), np.float32 if normalize else np.uint8)
    best = None
    for v in CHAIN_WRITES[normalize]:  # its fastest write, as (e) runs it
        w = chain_write(normalize, v)
        t = time.thread_time()
        for j in range(n):
            w(crops[j], rows[j % 256])
        took = time.thread_time() - t
        if best is None or took < best[0]:
            best = (took, v, w)
    assert best is not None
    write = best[2]

    def whole():
        r = random.Random(0)
        for j in range(n):
            write(_chain_112(cv2.imdecode(payloads[j], cv2.IMREAD_COLOR_RGB), r), rows[j % 256])

    return {
        "cv2.imdecode to RGB": lambda: [cv2.imdecode(b, cv2.IMREAD_COLOR_RGB) for b in payloads],
        "cv2.resize to 128x128": lambda: [
            cv2.resize(i, (128, 128), interpolation=cv2.INTER_LINEAR) for i in imgs
        ],
        f"crop, flip (views), write: {best[1]}": lambda: [
            write(_chain_112(b, rnd), rows[j % 256]) for j, b in enumerate(big)
        ],
        "the whole chain": whole,
    }


def stoker_in_place(rec: str, n: int, normalize: bool):
    """``(step names, run)``: ``run(acc)`` goes through the row writer's steps for ``n``
    records inline, adding each step's nanoseconds to ``acc`` (one slot per step)."""
    import cv2
    import simplejpeg

    from stoker._core.seeding import SampleRngs
    from stoker.codecs.jpeg import jpeg_frame
    from stoker.transforms.fused import _window_plan

    ld = _OPEN[0]
    src, norm = ld.source, ld.pipeline._tail
    order = np.random.default_rng(0).permutation(len(src))[:n].astype(np.int64)
    rows = np.empty((256, 3, 112, 112), np.float32 if normalize else np.uint8)
    buf, scratch = np.empty((120, 120, 3), np.uint8), np.empty((112, 112, 3), np.uint8)
    planes = [np.empty((112, 112), np.uint8) for _ in range(3)]
    coefs = [(norm._gain[k], norm._bias[k]) for k in range(3)] if normalize else []
    plans: dict = {}
    header, decode, f32 = jpeg_frame, simplejpeg.decode_jpeg, cv2.CV_32F
    resize, linear, flip, split, weighted = (
        cv2.resize,
        cv2.INTER_LINEAR,
        cv2.flip,
        cv2.split,
        cv2.addWeighted,
    )
    names = ["record read + CRC32C check", "JPEG header", "JPEG decode", "seeded draws",
             "window resize", "flip, or copy of the crop", "split into planes"]  # fmt: skip
    names += ["convert, scale, shift into the row"] if normalize else []

    def run(acc: np.ndarray) -> None:
        from time import perf_counter_ns as ns

        rngs = SampleRngs(0, 0)
        for b in range(0, n, 128):
            idx = order[b : b + 128]
            read = src.reader(idx)
            t = ns()
            firsts = rngs.first_blocks(idx).tolist()  # the chunk's draws, as fill_chunk takes them
            acc[3] += ns() - t
            for row, gi in enumerate(idx.tolist(), start=b % 256):
                t0 = ns()
                p = read(gi)[0]
                t1 = ns()
                header(p)
                t2 = ns()
                img = decode(p, colorspace="RGB")
                t3 = ns()
                u0, u1, u2 = firsts[row - b % 256][:3]
                t4 = ns()
                top, left = int(u0 * 17), int(u1 * 17)
                plan = plans.get((top, left))
                if plan is None:
                    plan = plans[(top, left)] = _window_plan(
                        112, 112, 128, 128, top, left, 112, 112
                    )
                ys, xs, size, ky, kx = plan
                out = resize(img[ys, xs], size, dst=buf if size == (120, 120) else None,
                             interpolation=linear)  # fmt: skip
                head = out[ky, kx]
                t5 = ns()
                if u2 < 0.5:
                    flip(head, 1, dst=scratch)
                    head = scratch
                elif not normalize:  # the uint8 writer copies an unmirrored crop first
                    np.copyto(scratch, head)
                    head = scratch
                t6 = ns()
                dest = rows[row]
                split(head, planes if normalize else [dest[0], dest[1], dest[2]])
                t7 = ns()
                for k, (g, c) in enumerate(coefs):
                    weighted(planes[k], g, planes[k], 0.0, c, dst=dest[k], dtype=f32)
                t8 = ns()
                acc[:8] += (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7)

    return names, run


def chain_in_place(rec: str, n: int, normalize: bool, variant: str):
    """``(step names, run)`` for (e)'s loop with ``variant``'s write, as ``stoker_in_place``."""
    import random

    import cv2
    from bench_loader import _chain_setup, chain_write

    payloads, _, _ = _chain_setup(rec, "112", 0, n)
    write = chain_write(normalize, variant)
    rows = np.empty((256, 3, 112, 112), np.float32 if normalize else np.uint8)
    names = ["cv2.imdecode", "cv2.resize to 128x128", f"crop, flip, write: {variant}"]

    def run(acc: np.ndarray) -> None:
        from time import perf_counter_ns as ns

        rnd = random.Random(0)
        for j, b in enumerate(payloads):
            t0 = ns()
            img = cv2.imdecode(b, cv2.IMREAD_COLOR_RGB)
            t1 = ns()
            img = cv2.resize(img, (128, 128), interpolation=cv2.INTER_LINEAR)
            t2 = ns()
            y, x = rnd.randint(0, 16), rnd.randint(0, 16)
            img = img[y : y + 112, x : x + 112]
            write(img[:, ::-1] if rnd.random() < 0.5 else img, rows[j % 256])
            t3 = ns()
            acc[:3] += (t1 - t0, t2 - t1, t3 - t2)

    return names, run


def in_place(rec: str, n: int, rounds: int, normalize: bool, variant: str) -> None:
    """Print the in-place table for one dtype: both loops, rounds alternating."""
    sides = [("stoker", *stoker_in_place(rec, n, normalize)),
             ("(e)", *chain_in_place(rec, n, normalize, variant))]  # fmt: skip
    per: dict[str, list[np.ndarray]] = {who: [] for who, _, _ in sides}
    for r in range(rounds):
        for who, _names, run in sides if r % 2 == 0 else sides[::-1]:
            acc = np.zeros(8)
            run(acc)
            per[who].append(acc / n / 1e3)
    kind = "float32" if normalize else "uint8"
    print(f"\n| {kind} NCHW, 112 px, in place | step | µs/image, median (min..max) |")
    print("|---|---|---:|")
    for who, names, _run in sides:
        got = np.array(per[who])
        for k, name in enumerate(names):
            med, lo, hi = median_range(got[:, k].tolist())
            print(f"| {who} | {name} | {med:.1f} ({lo:.1f}..{hi:.1f}) |")
        med, lo, hi = median_range(got.sum(1).tolist())
        print(f"| {who} | **the loop** | **{med:.1f}** ({lo:.1f}..{hi:.1f}) |")


def main() -> int:
    args = parse_args()
    import cv2

    cv2.setNumThreads(1)
    n = args.images or (300 if args.quick else 2000)
    rounds = args.rounds or (3 if args.quick else 9)
    work = Path(args.work or os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    _, rec = make_data(work, n=max(n, 600 if args.quick else 20_000), size=112,
                       name=f"s112_{600 if args.quick else 20_000}")  # fmt: skip
    print(f"command: {command_line()}  ({n} records, {rounds} rounds, load {os.getloadavg()})")
    for normalize in (True, False):
        groups = [
            ("stoker", stoker_steps(rec, n, normalize)),
            ("(e)", chain_steps(rec, n, normalize)),
        ]
        steps = [(who, name, fn) for who, got in groups for name, fn in got.items()]
        times: dict[tuple[str, str], list[float]] = {(w, s): [] for w, s, _ in steps}
        for r in range(rounds):
            for who, name, fn in steps if r % 2 == 0 else steps[::-1]:
                t = time.thread_time()
                fn()
                times[(who, name)].append((time.thread_time() - t) / n * 1e6)
        print(
            f"\n| {'float32' if normalize else 'uint8'} NCHW, 112 px | step | µs/image, median (min..max) |"
        )
        print("|---|---|---:|")
        for (who, name), v in times.items():
            med, lo, hi = median_range(v)
            print(f"| {who} | {name} | {med:.1f} ({lo:.1f}..{hi:.1f}) |")
        new, old = (
            times[("stoker", "fill_chunk per sample (read to row)")],
            times[("stoker", "fill_chunk per sample, draws from a re-keyed generator")],
        )  # run back to back in every round: a ratio per round
        med, lo, hi = median_range([o / n for n, o in zip(new, old)])
        print(
            f"\nfill_chunk with draws from a re-keyed generator / as it runs, per round: "
            f"{med:.3f} ({lo:.3f}..{hi:.3f}), {len(new)} rounds"
        )
        whole = times[("(e)", "the whole chain")]  # the same rounds: a ratio per round
        med, lo, hi = median_range([c / f for f, c in zip(new, whole)])
        print(
            f"the whole chain (e) / fill_chunk per sample, per round: "
            f"{med:.3f} ({lo:.3f}..{hi:.3f}), {len(new)} rounds (above 1: stoker's sample is cheaper)"
        )
        chain = next(name for who, name in times if who == "(e)" and name.startswith("crop"))
        in_place(rec, n, rounds, normalize, chain.split(": ", 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
