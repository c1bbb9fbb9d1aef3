"""RandomResizedCrop(224) -> flip at ImageNet's size: the loader beside the plain chain, side
by side in one run, on JPEGs as dense as ImageNet's.

The data: genuine 500x375 JPEGs at quality 90 whose files weigh what ImageNet's do (70-110 KB
on average; ``imagenet_like``: multi-octave noise under film grain, so the entropy-coded data
is as dense as a photo's, not a smooth synthetic image that decodes fast), a third of them
progressive, some with restart markers, some 4:4:4 (``imagenet_like_set``), packed into a .rec.

Candidates, each over ``--epochs`` epochs after one untimed epoch, float32 NCHW normalised
(ImageNet mean and std) and uint8 NCHW:

  (L)   stoker.Loader, ``workers`` workers;
  (R)   (L) with region decode (``DecodeOptions(region=True)``: only the crop's box of each
        JPEG is decoded), where the region decoder is built;
  (C)   the plain chain, ``workers`` processes in a tight loop over the bytes in memory (no
        IPC): full decode, torchvision's crop box, the box resized to 224, flip, the write into
        a batch array; of its formulations (decoder: ``cv2.imdecode`` or simplejpeg; each of
        bench_loader.py's writes) the fastest per image on one core, timed before the rounds.

Also the first epoch of (L) over its second: a fresh loader each round, and a fresh process's
first loader (``fresh_epochs``, a child process each round, what a training script sees) over
epochs of the set once and ten times over (its fixed start-up weighs less in a longer epoch); the decode
alone per image on one core (simplejpeg), on these files and on the bench's sample JPEGs of the same
size (``stoker sample-data``: smooth, so they decode about twice as fast), which says why the
two sets give different L/C ratios: the decode, the same library on both sides, is a larger
share of each sample at real density. Each ratio is the median over ``--rounds`` rounds, each
round running every candidate once in alternating order.

    python bench/bench_realsize.py            # 2,000 images, 3 rounds
    python bench/bench_realsize.py --quick    # 300 images, 1 round

Target: L/C >= 1.0 for both dtypes (the loader at least the careful chain's rate).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import multiprocessing  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    alternated,
    bench_parser,
    command_line,
    make_images,
    median_range,
    stoker_transforms,
)

H, W = 375, 500
# (name, OpenCV's imwrite flags beyond quality 90), one in turn per image
VARIANTS = (
    ("4:2:0", []),
    ("progressive", ["IMWRITE_JPEG_PROGRESSIVE", 1]),
    ("restart markers", ["IMWRITE_JPEG_RST_INTERVAL", 4]),
    ("4:4:4", ["IMWRITE_JPEG_SAMPLING_FACTOR", "IMWRITE_JPEG_SAMPLING_FACTOR_444"]),
    ("4:2:0", []),
    ("progressive", ["IMWRITE_JPEG_PROGRESSIVE", 1]),
)


def imagenet_like(rng: np.random.Generator, h: int = H, w: int = W) -> np.ndarray:
    """An RGB uint8 image with a photo's spread of detail: six octaves of smooth colour noise
    (coarse shapes to fine texture) under luminance and colour grain."""
    import cv2

    img = np.zeros((h, w, 3), np.float32)
    for octave, amp in ((4, 60), (8, 40), (16, 28), (32, 20), (64, 14), (128, 10)):
        gh, gw = max(2, h * octave // 500), max(2, w * octave // 500)
        field = rng.normal(0, 1, (gh, gw, 1)) + rng.normal(0, 0.35, (gh, gw, 3))
        img += amp * cv2.resize(field.astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    img += rng.uniform(60, 190, 3).astype(np.float32)
    img += rng.normal(0, rng.uniform(8, 13), (h, w, 1)).astype(np.float32)
    img += rng.normal(0, 3, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: np.ndarray, variant: int) -> bytes:
    """``img`` (RGB) as a quality-90 JPEG of ``VARIANTS[variant % len(VARIANTS)]``."""
    import cv2

    flags = [cv2.IMWRITE_JPEG_QUALITY, 90]
    for v in VARIANTS[variant % len(VARIANTS)][1]:
        flags.append(getattr(cv2, v) if isinstance(v, str) else v)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(img[:, :, ::-1]), flags)
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()


def imagenet_like_set(root: Path, n: int, *, classes: int = 10, seed: int = 0) -> Path:
    """``n`` files (``imagenet_like``, variants in turn) in ``classes`` folders under ``root``;
    reused when it holds them already."""
    done = root / f".made-{n}-{seed}"
    if not done.exists():
        rng = np.random.default_rng(seed)
        for i in range(n):
            d = root / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:06d}.jpg").write_bytes(encode(imagenet_like(rng), i))
        done.touch()
    return root


# ---------------------------------------------------------------------------- the plain chain
def _payloads(rec: str, start: int, stop: int) -> list[bytes]:
    from stoker.formats.recordio import RecordFile

    r = RecordFile(rec)
    try:
        return [bytes(r.read_header(i)[1]) for i in range(start, stop)]
    finally:
        r.close()


def _chain(decoder: str, normalize: bool, write_variant: str):
    """``f(buf, rnd, row)``: the plain chain on one JPEG into CHW batch row ``row``."""
    import cv2
    import simplejpeg
    from bench_loader import chain_write, rrc_box

    cv2.setNumThreads(1)
    write = chain_write(normalize, write_variant)
    linear = cv2.INTER_LINEAR
    if decoder == "cv2.imdecode":

        def decode(buf):
            return cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_COLOR_RGB)
    else:

        def decode(buf):
            return simplejpeg.decode_jpeg(buf, colorspace="RGB")

    def run(buf, rnd, row) -> None:
        img = decode(buf)
        top, left, h, w = rrc_box(img.shape[0], img.shape[1], rnd)
        img = cv2.resize(img[top : top + h, left : left + w], (224, 224), interpolation=linear)
        write(cv2.flip(img, 1) if rnd.random() < 0.5 else img, row)

    return run


def chain_formulations(normalize: bool) -> list[tuple[str, str]]:
    from bench_loader import CHAIN_WRITES

    return [(d, w) for d in ("cv2.imdecode", "simplejpeg") for w in CHAIN_WRITES[normalize]]


def calibrate(rec: str, normalize: bool, n: int) -> tuple[tuple[str, str], list]:
    """The fastest chain formulation per image on one core over ``n`` records (3 rounds)."""
    bufs = _payloads(rec, 0, n)
    row = np.empty((3, 224, 224), np.float32 if normalize else np.uint8)
    forms = chain_formulations(normalize)
    times: dict = {f: [] for f in forms}
    for r in range(3):
        for f in alternated(forms, r):
            run, rnd = _chain(f[0], normalize, f[1]), random.Random(0)
            t = time.thread_time()
            for buf in bufs:
                run(buf, rnd, row)
            times[f].append((time.thread_time() - t) / n * 1e6)
    got = [(f, *median_range(times[f])) for f in forms]
    return min(got, key=lambda g: g[1])[0], got


def _chain_proc(rec, start, stop, form, normalize, epochs, go, conn) -> None:
    bufs = _payloads(rec, start, stop)
    run, rnd = _chain(form[0], normalize, form[1]), random.Random(start)
    out = np.empty((128, 3, 224, 224), np.float32 if normalize else np.uint8)
    go.wait()
    t0, j = time.perf_counter(), 0
    for _ in range(epochs):
        for buf in bufs:
            run(buf, rnd, out[j % 128])
            j += 1
    conn.send((j, time.perf_counter() - t0))


def run_chain(rec: str, n: int, form, normalize: bool, workers: int, epochs: int) -> float:
    """Images per second of ``workers`` chain processes at once, each over its share."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs, conns = [], []
    for k in range(workers):
        a, b = ctx.Pipe()
        lo, hi = k * n // workers, (k + 1) * n // workers
        p = ctx.Process(target=_chain_proc, args=(rec, lo, hi, form, normalize, epochs, go, b))
        p.start()
        procs.append(p)
        conns.append(a)
    time.sleep(1.0)  # every process has read its share
    go.set()
    got = [c.recv() for c in conns]
    for p in procs:
        p.join()
    return sum(j for j, _ in got) / max(t for _, t in got)


# ---------------------------------------------------------------------------- the loader
def run_loader(rec: str, normalize: bool, workers: int, epochs: int, region: bool = False) -> dict:
    """Images per second over ``epochs`` epochs after an untimed one; the first epoch's rate."""
    import stoker
    from stoker.pipeline import DecodeOptions

    loader = stoker.Loader(
        rec,
        batch_size=128,
        workers=workers,
        layout="NCHW",
        transforms=stoker_transforms("224", normalize=normalize),
        seed=0,
        decode=DecodeOptions(region=region),
    )
    with loader:
        rates = []
        for _ in range(epochs + 1):
            t0, seen = time.perf_counter(), 0
            for batch in loader:
                seen += len(batch.images)
            rates.append(seen / (time.perf_counter() - t0))
    return {"rate": statistics.median(rates[1:]), "first": rates[0], "second": rates[1]}


def fresh_epochs(rec: str, normalize: bool, workers: int, times: int) -> float:
    """A fresh interpreter's first loader (what a training script sees) over epochs of the set
    ``times`` over (a sampler repeating it, shuffled): its first epoch's rate over its second's.
    Runs this file with ``--fresh`` in a child process."""
    import json
    import subprocess

    argv = [sys.executable, __file__, "--fresh", json.dumps([rec, normalize, workers, times])]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1]))


def _fresh_child(rec: str, normalize: bool, workers: int, times: int) -> None:
    import stoker
    import stoker.formats
    from stoker.sampling import Sampler

    class Repeated(Sampler):
        def __init__(self, n: int) -> None:
            self.n = n

        def indices(self, epoch: int) -> np.ndarray:
            order = np.tile(np.arange(self.n), times)
            return np.random.default_rng(epoch).permutation(order)

        def __len__(self) -> int:
            return self.n * times

    t = stoker_transforms("224", normalize=normalize)
    with stoker.formats.open(rec) as r:
        n = len(r)
    loader = stoker.Loader(
        rec, batch_size=128, workers=workers, layout="NCHW", transforms=t, sampler=Repeated(n)
    )
    rates = []
    with loader:
        for _ in range(2):
            t0, seen = time.perf_counter(), 0
            for batch in loader:
                seen += len(batch.images)
            rates.append(seen / (time.perf_counter() - t0))
    print(rates[0] / rates[1])


def decode_costs(rec: str, sample_rec: str, n: int) -> list[tuple[str, str, float]]:
    """Per image on one core: (set, what, µs), the best of 4 passes. What: the whole decode;
    and with the region decoder, a RandomResizedCrop(224) box of the image, and its last pixel
    alone (the rows above it skipped: about the entropy decoding, which no box can skip)."""
    import simplejpeg

    from stoker.codecs import REGION
    from stoker.transforms import RandomResizedCrop

    crop, rng, out = RandomResizedCrop(224), np.random.default_rng(0), []
    one = np.empty((1, 1, 3), np.uint8)
    for name, path in (("ImageNet-like", rec), ("sample-data", sample_rec)):
        bufs = _payloads(path, 0, n)
        boxes = [crop.params((H, W), rng) for _ in bufs]
        runs = {"whole decode": lambda b, box: simplejpeg.decode_jpeg(b, colorspace="RGB")}
        if REGION is not None:
            runs["the box's region"] = lambda b, box: REGION(
                b, *box, np.empty((box[2], box[3], 3), np.uint8), False
            )
            runs["the last pixel"] = lambda b, box: REGION(b, H - 1, W - 1, 1, 1, one, False)
        for what, fn in runs.items():
            best = float("inf")
            for _ in range(4):
                t = time.thread_time()
                for b, box in zip(bufs, boxes):
                    fn(b, box)
                best = min(best, (time.thread_time() - t) / n * 1e6)
            out.append((name, what, best))
    return out


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "300 images, 1 round")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    return ap.parse_args(argv)


def main() -> int:
    if sys.argv[1:2] == ["--fresh"]:
        import json

        _fresh_child(*json.loads(sys.argv[2]))
        return 0
    args = parse_args()
    n, rounds = (300, 1) if args.quick else (args.images, args.rounds)
    import stoker

    print(command_line())
    work = Path(tempfile.gettempdir()) / "stoker-bench-realsize"
    rec, sample = str(work / f"imagenet_like_{n}.rec"), str(work / f"sample_{n}.rec")
    if not Path(rec).exists():
        stoker.pack(imagenet_like_set(work / f"images_{n}", n), rec, overwrite=True, progress=False)
    if not Path(sample).exists():
        stoker.pack(
            make_images(work / f"sample_images_{n}", n=n, size=(H, W)), sample, progress=False
        )
    sizes = [p.stat().st_size for p in (work / f"images_{n}").rglob("*.jpg")]
    print(
        f"{n} JPEGs {W}x{H}, mean {np.mean(sizes) / 1e3:.0f} KB ({min(sizes) / 1e3:.0f}..."
        f"{max(sizes) / 1e3:.0f}); {args.workers} workers / processes, batch 128\n"
    )
    print("# the decode alone, per image on one core (µs)")
    for name, what, cost in decode_costs(rec, sample, min(n, 300)):
        print(f"  {name:14s} {what:18s} {cost:7.0f}")
    forms = {}
    for norm in (True, False):
        forms[norm], got = calibrate(rec, norm, min(n, 200))
        print(f"\n# the plain chain's formulations, {'float32' if norm else 'uint8'} (µs/img):")
        for f, med, lo, hi in got:
            print(f"  {f[0]:13s} {f[1]:34s} {med:6.0f} ({lo:.0f}..{hi:.0f})")
    from stoker.codecs import REGION

    names = ["L", "C"] if REGION is None else ["L", "R", "C"]
    rates: dict = {}
    for r in range(rounds):
        for norm in (True, False):
            for c in alternated(names, r):
                if c == "C":
                    got = {"rate": run_chain(rec, n, forms[norm], norm, args.workers, args.epochs)}
                else:
                    got = run_loader(rec, norm, args.workers, args.epochs, region=c == "R")
                rates.setdefault((c, norm), []).append(got)
    print("\n# images/s (median over rounds), and ratios")
    for norm in (True, False):
        dt = "float32" if norm else "uint8"
        med = {c: statistics.median(g["rate"] for g in rates[(c, norm)]) for c in names}
        print(f"  {dt}: " + "  ".join(f"{c} {med[c]:.0f}" for c in names))
        for a, b in (("L", "C"), ("R", "C"), ("R", "L"))[: len(names) * 2 - 3]:
            each = [x["rate"] / y["rate"] for x, y in zip(rates[(a, norm)], rates[(b, norm)])]
            m, lo, hi = median_range(each)
            print(f"    {a}/{b} = {m:.2f}x ({lo:.2f}..{hi:.2f})")
        first = [g["first"] / g["second"] for g in rates[("L", norm)]]
        print(
            f"    L first epoch / second epoch, a loader of this process = {statistics.median(first):.2f}"
        )
        for times in (1, 10):  # a fresh process each round: their median
            fresh = [fresh_epochs(rec, norm, args.workers, times) for _ in range(rounds)]
            m, lo, hi = median_range(fresh)
            print(
                f"    L first epoch / second, a fresh process, {n * times} images = {m:.2f} ({lo:.2f}..{hi:.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
