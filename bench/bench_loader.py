"""Loader throughput, side by side, in one run on the same sample data.

112x112 JPEGs, batch 256, resize 128 -> random crop 112 -> flip -> float32 NCHW normalised,
``--workers`` worker processes (default 2), one epoch each:

  (a)  PIL ImageFolder-style dataset + torch.utils.data.DataLoader (torchvision's ops written out)
  (b)  the same with OpenCV
  (c)  stoker.Loader from the packed .rec, record CRC check on (the loader's default)
  (c') stoker.Loader, uint8 NCHW output (normalisation left to the GPU edge)
  (d)  stoker's pipeline in a tight loop: the loader worker's own decode + augment + write into
       a batch array (``Pipeline.fill_row``) over bytes already in memory, no IPC, in
       ``workers`` processes at once, their rates summed; (d') the same with uint8 output
  (e)  the plain chain in a tight loop, the same way, as a careful engineer writes it:
       cv2.imdecode, cv2.resize to 128x128, random crop 112, random flip, then the fastest of
       its formulations of the write into a batch array (``CHAIN_WRITES``: one contiguous CHW
       copy, then float and per-channel normalisation in place, and others), timed per image
       on one core before the rounds (``calibrate_chain``), so that a slow baseline cannot
       flatter stoker; (e') the same chain stopped at uint8 CHW, its fastest copy likewise

Then the same on a .rec 10x as long (200,000 images for the default 20,000: the records repeated
under new keys, with their CRC side-car; (e) loops 10 times over its share of the records), whose
one epoch spreads a loader's start-up as a real dataset does; the ImageNet case,
RandomResizedCrop(224) -> flip -> normalise from 500x375 JPEGs (ImageNet's typical size)
against the chain written plainly (cv2 decode, torchvision's crop box, resize the box to 224,
flip, normalise), both dtypes; and the 112 pipeline on those JPEGs with and without
scale-on-decode. Last, the first batch of a loader in a fresh process, with the start-up
step by step (``bench_startup.py``).

    python bench/bench_loader.py            # 20k images, memory round + 5 paired rounds
    python bench/bench_loader.py --quick    # 600 images, 1 round, no memory figures: a smoke run

A first round samples every candidate's memory (PSS of the process tree, 4 times a second);
its rates are not counted, since the sampler's CPU comes out of the run it measures, and more
for some candidates than for others (see ``PeakPSS``). The timed rounds run with no sampler.
Candidates run in groups, each candidate that a ratio compares next to the one it is compared
with ((e, c, d), (a, c, b), ...); a group keeps its order in even rounds and runs reversed in
odd ones (``alternated``), so each ratio is a median over rounds of pairs that ran side by side,
each side first as often as the other, printed with its spread (min..max). Beside each ratio by
images/s: CPU microseconds per delivered image, for stoker the whole process tree over its epoch
(main process, worker server, workers; start-up included), for a tight loop its processes
inside their timed loops: the figure that carries over to a machine with more cores. The torch
baselines run in a child process each, so torch never enters the process that measures stoker.

Targets: c/a >= 4; c/e >= 1 and c'/e' >= 1 (20k and 200k images, and the ImageNet case);
first batch in a fresh process < 0.3 s; peak PSS of the tree <= 600 MiB and flat in dataset
size.
torch is imported lazily (worker processes re-import this module).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# One BLAS/OpenMP thread in this process and in the tight loops' processes (a loader's workers
# set it themselves): an idle OpenBLAS thread spins after a BLAS call and bills the process it
# lives in, on whichever side of a ratio that happens to be. Set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    MEAN,
    STD,
    PeakPSS,
    alternated,
    command_line,
    cpu_count,
    make_data,
    median_range,
    stoker_transforms,
    tree_rusage,
    warm_page_cache,
)

# whether PeakPSS samples memory (set per round by main(), and by --no-memory in a child run)
MEASURE_MEMORY = True


def _result(n: int, elapsed: float, first: float | None, mem: PeakPSS) -> dict:
    return {
        "images": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "first": first,
        "cpu_ms_per_image": 1000 * mem.cpu_seconds / max(n, 1),
    } | mem.figures()


# ---------------------------------------------------------------------------- baselines
def _files(root: str) -> list[tuple[str, int]]:
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    out = []
    for ci, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                out.append((os.path.join(root, c, f), ci))
    return out


class PILFolder:
    """torchvision ImageFolder + Resize(128) + RandomCrop(112) + RandomHorizontalFlip +
    ToTensor + Normalize, written out, so that torchvision is not needed."""

    def __init__(self, root: str, *, resize: int = 128, crop: int = 112, rrc: int | None = None):
        self.samples = _files(root)
        self.resize, self.crop, self.rrc = resize, crop, rrc

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import random

        import torch
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        if self.rrc:
            img = _pil_rrc(img, self.rrc)
        else:
            w, h = img.size
            s = self.resize
            nw, nh = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
            img = img.resize((nw, nh), Image.BILINEAR)
            x = random.randint(0, nw - self.crop)
            y = random.randint(0, nh - self.crop)
            img = img.crop((x, y, x + self.crop, y + self.crop))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        t = (
            torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())
            .permute(2, 0, 1)
            .float()
            .div(255)
        )
        m = torch.tensor(MEAN).view(3, 1, 1)
        s_ = torch.tensor(STD).view(3, 1, 1)
        return (t - m) / s_, label


def rrc_box(height: int, width: int, rnd) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (scale 0.08..1, ratio 3/4..4/3), drawn from the
    ``random.Random`` ``rnd``: (top, left, h, w); after 10 failed draws, a centre crop clamped
    to the ratio."""
    import math

    area = height * width
    for _ in range(10):
        target = area * rnd.uniform(0.08, 1.0)
        ar = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
        w = int(round(math.sqrt(target * ar)))
        h = int(round(math.sqrt(target / ar)))
        if 0 < w <= width and 0 < h <= height:
            return rnd.randint(0, height - h), rnd.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif in_ratio > 4 / 3:
        h, w = height, int(round(height * (4 / 3)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _pil_rrc(img, size):
    """torchvision RandomResizedCrop(size) on a PIL image."""
    import random

    from PIL import Image

    w, h = img.size
    top, left, ch, cw = rrc_box(h, w, random)
    return img.crop((left, top, left + cw, top + ch)).resize((size, size), Image.BILINEAR)


class CVFolder(PILFolder):
    """The same with OpenCV (imread, cvtColor, resize, crop, flip) and NumPy normalisation."""

    def __getitem__(self, i: int):
        import random

        import cv2
        import torch

        cv2.setNumThreads(1)
        path, label = self.samples[i]
        img = cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        s = self.resize
        nw, nh = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
        x = random.randint(0, nw - self.crop)
        y = random.randint(0, nh - self.crop)
        img = img[y : y + self.crop, x : x + self.crop]
        if random.random() < 0.5:
            img = img[:, ::-1]
        arr = (img.astype(np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), label


def run_torch(dataset, *, workers: int, batch_size: int) -> dict:
    import torch

    torch.set_num_threads(1)
    r0 = tree_rusage()
    with PeakPSS(memory=MEASURE_MEMORY) as mem:
        t0 = time.perf_counter()
        dl = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers
        )
        n = 0
        first = None
        for images, _labels in dl:
            if first is None:
                first = time.perf_counter() - t0
            n += len(images)
        elapsed = time.perf_counter() - t0
        del dl
    out = _result(n, elapsed, first, mem)
    # the DataLoader's workers are this process's children and are joined at the end of the
    # epoch: their CPU is all in RUSAGE_CHILDREN (a sampler would miss their last moments)
    out["cpu_ms_per_image"] = 1000 * (tree_rusage() - r0) / max(n, 1)
    return out


# ---------------------------------------------------------------------------- stoker


def run_stoker(
    path: str,
    *,
    kind: str,
    normalize: bool,
    workers: int,
    batch_size: int,
    scale_on_decode: bool = True,
    second_epoch: bool = False,
) -> dict:
    """One epoch from a new Loader (start-up included: the figure the targets are about);
    with ``second_epoch``, also the next epoch of the same loader (workers and batch ring
    already up: the rate of every epoch of a training run after its first) as ``epoch2``."""
    from stoker.loader import Loader
    from stoker.pipeline import DecodeOptions

    second: dict | None = None
    with PeakPSS(memory=MEASURE_MEMORY) as mem:
        t0 = time.perf_counter()
        loader = Loader(
            path,
            batch_size=batch_size,
            transforms=stoker_transforms(kind, normalize=normalize),
            layout="NCHW",
            shuffle=True,
            seed=0,
            workers=workers,
            decode=DecodeOptions(scale_on_decode=scale_on_decode),
        )
        n = 0
        first = None
        with loader:
            for b in loader:
                if first is None:
                    first = time.perf_counter() - t0
                n += len(b.images)
            elapsed = time.perf_counter() - t0
            cpu1 = mem.snapshot()
            main1 = mem.main_cpu_seconds
            if second_epoch:
                t1, n2 = time.perf_counter(), 0
                for b in loader:
                    n2 += len(b.images)
                took, cpu2 = time.perf_counter() - t1, mem.snapshot() - cpu1
                second = {"rate": n2 / took, "cpu_ms_per_image": 1000 * cpu2 / max(n2, 1)}
    out = _result(n, elapsed, first, mem)
    out["cpu_ms_per_image"] = 1000 * cpu1 / max(n, 1)  # the first epoch's
    # of which the main process (the rest: worker server and workers), start-up included
    out["main_cpu_ms_per_image"] = 1000 * main1 / max(n, 1)
    if second is not None:
        out["epoch2"] = second
    return out


def _limit_worker(args, conn) -> None:
    """One process of (d): read its share of the records into memory, wait for the others,
    then time decode + augment + placement into a batch array, through the same per-sample
    code as a loader worker (``Pipeline.fill_row``) minus reading, IPC and bookkeeping."""
    path, kind, normalize, start, stop, repeat, batch = args
    import cv2

    from stoker._core.seeding import SampleRngs
    from stoker.codecs import DECODED_SPEC
    from stoker.formats.recordio import RecordFile
    from stoker.pipeline import DecodeOptions, Pipeline

    cv2.setNumThreads(1)
    rec = RecordFile(path)
    payloads = [bytes(rec.read_header(i)[1]) for i in range(start, stop)]
    rec.close()
    pipe = Pipeline(
        DECODED_SPEC,
        transforms=stoker_transforms(kind, normalize=normalize),
        layout="NCHW",
        decode=DecodeOptions(),
    )
    out = np.empty((batch, *pipe.row_shape()), dtype=pipe.dtype)
    rngs = SampleRngs(0, 0)
    _ready(conn)
    t0 = time.time()
    c0 = time.process_time()
    j = 0
    for _ in range(repeat):
        for i, buf in enumerate(payloads):
            img = pipe.decode_image(buf)
            pipe.fill_row(
                img, rngs.at(start + i), out[j % batch], None, what="sample {}", args=(j,)
            )
            j += 1
    conn.send((j, t0, time.time(), time.process_time() - c0))


def _chain_112(img: np.ndarray, rnd) -> np.ndarray:
    """The plain chain's augmentation: resize to 128x128, random crop 112, random flip."""
    import cv2

    img = cv2.resize(img, (128, 128), interpolation=cv2.INTER_LINEAR)
    y, x = rnd.randint(0, 16), rnd.randint(0, 16)
    img = img[y : y + 112, x : x + 112]
    return img[:, ::-1] if rnd.random() < 0.5 else img


def _chain_rrc(img: np.ndarray, rnd) -> np.ndarray:
    """The plain chain's ImageNet augmentation: torchvision's crop box, the box resized to
    224x224, random flip."""
    import cv2

    top, left, h, w = rrc_box(img.shape[0], img.shape[1], rnd)
    img = cv2.resize(
        img[top : top + h, left : left + w], (224, 224), interpolation=cv2.INTER_LINEAR
    )
    return img[:, ::-1] if rnd.random() < 0.5 else img


# The plain chain's last step, as a careful engineer might write it: the formulations (e)
# tries; calibrate_chain() times them per image on one core and (e) runs the fastest.
CHAIN_WRITES = {
    True: ("strided astype", "contiguous, astype, in place", "contiguous, into the row"),
    False: ("transposing copy", "contiguous, then transposing copy"),
}


def chain_write(normalize: bool, variant: str):
    """``f(img, row)``: the plain chain's augmented HWC uint8 ``img`` into CHW batch ``row``,
    by the formulation ``variant`` (``CHAIN_WRITES``): float32 normalised (ImageNet mean and
    std) or uint8.

    - strided astype: ``astype(float32)`` of the transposed view (a gather 3 bytes apart),
      subtract the mean, multiply by 1/std into the row;
    - contiguous, astype, in place: one contiguous copy of the CHW uint8 view, ``astype``,
      subtract and multiply in place, into the row;
    - contiguous, into the row: one contiguous CHW uint8 copy, ``np.subtract`` straight into
      the float row, multiply in place (no float temporary);
    - transposing copy: ``row[...] = img.transpose(2, 0, 1)``;
    - contiguous, then transposing copy: the same from a contiguous copy of ``img``."""
    mean = (np.array(MEAN, np.float32) * 255).reshape(3, 1, 1)
    inv_std = (1 / (np.array(STD, np.float32) * 255)).reshape(3, 1, 1)
    if variant == "strided astype":

        def write(img, row):
            x = img.transpose(2, 0, 1).astype(np.float32)
            x -= mean
            np.multiply(x, inv_std, out=row)

    elif variant == "contiguous, astype, in place":

        def write(img, row):
            x = np.ascontiguousarray(img.transpose(2, 0, 1)).astype(np.float32)
            x -= mean
            np.multiply(x, inv_std, out=row)

    elif variant == "contiguous, into the row":

        def write(img, row):
            np.subtract(np.ascontiguousarray(img.transpose(2, 0, 1)), mean, out=row)
            row *= inv_std

    elif variant == "transposing copy":

        def write(img, row):
            row[...] = img.transpose(2, 0, 1)

    elif variant == "contiguous, then transposing copy":

        def write(img, row):
            row[...] = np.ascontiguousarray(img).transpose(2, 0, 1)

    else:
        raise ValueError(f"unknown chain formulation {variant!r}")
    return write


def _chain_setup(path: str, kind: str, start: int, stop: int):
    """The records ``[start, stop)`` as arrays, and the chain's augmentation and row size."""
    import cv2

    from stoker.formats.recordio import RecordFile

    cv2.setNumThreads(1)
    rec = RecordFile(path)
    payloads = [np.frombuffer(bytes(rec.read_header(i)[1]), np.uint8) for i in range(start, stop)]
    rec.close()
    return payloads, (_chain_112 if kind == "112" else _chain_rrc), (112 if kind == "112" else 224)


def _chain_worker(args, conn) -> None:
    """One process of (e): read its share of the records into memory, wait for the others,
    then time the plain chain over them ``repeat`` times: ``cv2.imdecode`` (RGB), augment,
    then the formulation ``variant`` of the write into a batch array (``chain_write``)."""
    path, kind, normalize, start, stop, repeat, batch = args[:7]
    import random

    import cv2

    payloads, augment, size = _chain_setup(path, kind, start, stop)
    write = chain_write(normalize, args[7])
    out = np.empty((batch, 3, size, size), np.float32 if normalize else np.uint8)
    rnd = random.Random(start)
    _ready(conn)
    t0 = time.time()
    c0 = time.process_time()
    j = 0
    for _ in range(repeat):
        for buf in payloads:
            write(augment(cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB), rnd), out[j % batch])
            j += 1
    conn.send((j, t0, time.time(), time.process_time() - c0))


# (kind, normalize) -> the formulation (e) runs: the fastest by calibrate_chain(); a process of
# the loop gets it in its arguments (set before the rounds start)
CHAIN_VARIANT: dict[tuple[str, bool], str] = {}


def calibrate_chain(path: str, kind: str, normalize: bool, n: int, rounds: int = 3) -> list:
    """Each formulation of the chain's write, per image on one core over the first ``n``
    records (decode and augmentation included, the same for all), ``rounds`` rounds in
    alternating order; sets ``CHAIN_VARIANT`` to the fastest and returns ``[(variant, median
    µs, min, max)]``."""
    import random

    import cv2

    payloads, augment, size = _chain_setup(path, kind, 0, n)
    out = np.empty((256, 3, size, size), np.float32 if normalize else np.uint8)
    variants = list(CHAIN_WRITES[normalize])
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in alternated(variants, r):
            write, rnd = chain_write(normalize, v), random.Random(0)
            t = time.thread_time()
            for j, buf in enumerate(payloads):
                write(augment(cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB), rnd), out[j % 256])
            times[v].append((time.thread_time() - t) / len(payloads) * 1e6)
    got = [(v, *median_range(times[v])) for v in variants]
    CHAIN_VARIANT[(kind, normalize)] = min(got, key=lambda g: g[1])[0]
    return got


def run_loop(
    target, path: str, *, n: int, kind: str, normalize: bool, workers: int, repeat: int = 1
) -> dict:
    """A tight loop ((d) with ``_limit_worker``, (e) with ``_chain_worker``): ``workers``
    processes start together, each on its share of the ``n`` records, ``repeat`` times over;
    the rate is the sum of their rates (images / own seconds each). All images over (last
    end - first start) would be lower by the imbalance of the fixed split: the first process
    to finish leaves a core idle for a few percent of the run, which is a fault of this loop
    and not a limit of the machine. The CPU per image is the processes' own inside their
    timed loops. A run whose process died is run once more, then fails the bench."""
    for attempt in (1, 2):
        got = _loop_once(target, (path, kind, normalize, n, repeat), workers)
        if got is not None:
            break
        print(f"... a {target.__name__} process died (attempt {attempt})", flush=True)
    else:
        raise RuntimeError(f"{target.__name__}: a loop process died twice")
    images = sum(g[0] for g in got[0])
    cpu = sum(g[3] for g in got[0])
    return {
        "images": images,
        "rate": sum(g[0] / (g[2] - g[1]) for g in got[0]),
        "cpu_ms_per_image": 1000 * cpu / max(images, 1),
    } | got[1]


def _ready(conn) -> None:
    """A loop process says it has its records and waits for the word to start: a pipe each,
    no named semaphore (a cleanup of /dev/shm on a shared machine can remove those under a
    running bench)."""
    conn.send("ready")
    conn.recv()


def _loop_once(target, job: tuple, workers: int) -> tuple[list, dict] | None:
    """One run of ``run_loop``: each process's (images, start, end, CPU seconds) and the
    memory figures, or None when a process exited without reporting."""
    import multiprocessing as mp

    path, kind, normalize, n, repeat = job
    extra = (CHAIN_VARIANT[(kind, normalize)],) if target is _chain_worker else ()
    ctx = mp.get_context("forkserver")
    per = -(-n // workers)
    pipes = [ctx.Pipe() for _ in range(workers)]
    procs = [
        ctx.Process(
            target=target,
            args=(
                (path, kind, normalize, w * per, min(n, (w + 1) * per), repeat, 256, *extra),
                child,
            ),
        )
        for w, (_, child) in enumerate(pipes)
    ]
    got: list = []
    with PeakPSS(memory=MEASURE_MEMORY) as mem:
        for p in procs:
            p.start()
        for _, child in pipes:
            child.close()
        try:
            for parent, _ in pipes:
                parent.recv()  # "ready": its records are in memory
            for parent, _ in pipes:
                parent.send("go")
            got = [parent.recv() for parent, _ in pipes]
        except (EOFError, OSError):  # a process died
            pass
        for p in procs:
            if len(got) < len(procs):
                p.terminate()
            p.join()
    return (got, mem.figures()) if len(got) == len(procs) else None


# ---------------------------------------------------------------------------- data
def repeat_rec(src: str, dst: str, times: int) -> str:
    """A .rec ``times`` as long, with its CRC side-car: the same records repeated under new
    keys (made again when an older run left one without the side-car)."""
    from stoker.formats.recordio import RecordFile, RecordWriter

    if os.path.exists(dst) and os.path.exists(crc_path(dst)):
        return dst
    rec = RecordFile(src)
    payloads = [bytes(rec.read(i)) for i in range(len(rec))]
    rec.close()
    with RecordWriter(dst, overwrite=True, checksums=True) as w:
        key = 0
        for _ in range(times):
            for p in payloads:
                w.write(key, p)
                key += 1
    return dst


def crc_path(rec: str) -> str:
    """The CRC32C side-car beside a .rec (``NAME.crc32c``), which the loader checks by default."""
    return os.path.splitext(rec)[0] + ".crc32c"


# ---------------------------------------------------------------------------- the run
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="600 images (224 case: 100), 1 timed round, no memory round: a smoke run",
    )
    ap.add_argument("--images", type=int, default=None, help="images for the 112 px runs")
    ap.add_argument(
        "--images-224",
        type=int,
        default=None,
        help="500x375 images (375 high, 500 wide) for the ImageNet case (6000)",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--work", default=None, help="data folder (default: a temporary one, reused by name)"
    )
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        help="skip parts: baselines, scale, 224 (repeat the flag or separate with commas)",
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="timed rounds, order alternating (5; --quick: 1)"
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--torch-baseline", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    ap.add_argument("--rrc", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.skip = {part.strip() for given in args.skip for part in given.split(",")}
    unknown = args.skip - {"baselines", "scale", "224"}
    if unknown:
        ap.error(f"--skip: unknown part(s) {sorted(unknown)}; choose from baselines, scale, 224")
    return args


def torch_child(args: argparse.Namespace) -> int:
    """A child run of one baseline (see ``Rounds.torch``): its result as JSON on stdout."""
    global MEASURE_MEMORY
    MEASURE_MEMORY = not args.no_memory
    kind, root = args.torch_baseline
    ds = (PILFolder if kind == "pil" else CVFolder)(root, rrc=args.rrc)
    print(json.dumps(run_torch(ds, workers=args.workers, batch_size=args.batch_size)))
    return 0


@dataclass
class Data:
    """The inputs of one run; an empty path for a part that is skipped."""

    n: int
    images: str
    rec: str
    big: str = ""
    n224: int = 0
    images224: str = ""
    rec224: str = ""


def prepare(args: argparse.Namespace, work: Path, n: int) -> Data:
    t = time.perf_counter()
    images, rec = make_data(work, n=n, size=112, name=f"s112_{n}")
    data = Data(n, images, rec)
    if "scale" not in args.skip:
        # 10x the records under new keys: memory must not grow with the dataset, and one epoch
        # of it spreads a loader's start-up over 10x the images, as a real dataset does
        data.big = repeat_rec(rec, str(work / f"s112_{n}_x10.rec"), 10)
    if "224" not in args.skip:
        # enough images that the batch ring (4 slots of 256 float32 224x224 samples: 616 MB,
        # zeroed, mapped and freed once per loader) is not a third of the epoch's cost
        data.n224 = args.images_224 or (100 if args.quick else 6_000)
        data.images224, data.rec224 = make_data(
            work, n=data.n224, size=(375, 500), name=f"rrc_375x500_{data.n224}"
        )
    for r in (data.rec, data.big, data.rec224):
        if r and not os.path.exists(crc_path(r)):
            raise SystemExit(f"{r}: no CRC side-car; the record CRC check would be off")
    print(f"data ready in {time.perf_counter() - t:.0f} s (record CRC check on)", flush=True)
    return data


# candidate names
C, C8 = "c stoker .rec float NCHW", "c' stoker .rec uint8 NCHW"
D, D8 = "d stoker pipeline loop float NCHW", "d' stoker pipeline loop uint8 NCHW"
E, E8 = "e plain chain float NCHW", "e' plain chain uint8 CHW"
CF = "c stoker folder float NCHW"
C10, C10_8 = "c stoker .rec x10 float NCHW", "c' stoker .rec x10 uint8 NCHW"
E10, E10_8 = "e plain chain x10 float NCHW", "e' plain chain x10 uint8 CHW"
C224, C224_8 = "224 c stoker RRC float NCHW", "224 c' stoker RRC uint8 NCHW"
D224 = "224 d stoker pipeline loop RRC float NCHW"
E224, E224_8 = "224 e plain chain RRC float NCHW", "224 e' plain chain RRC uint8 CHW"
SOD, FULL = "112 from 500x375 c, scale-on-decode", "112 from 500x375 c, full decode"
A, B, A224 = "a PIL + DataLoader", "b OpenCV + DataLoader", "224 a PIL + DataLoader RRC"


class Rounds:
    """Runs candidates in groups, each with its input warmed just before, and keeps their
    results by (group, name): the memory round's (``memory_runs``) apart from the timed
    rounds' (``runs``, one result per round)."""

    def __init__(self, d: Data, workers: int, batch_size: int, skip: set[str]) -> None:
        self.W, self.B = workers, batch_size
        self.runs: dict[tuple[int, str], list[dict]] = {}
        self.memory_runs: dict[tuple[int, str], list[dict]] = {}
        self.groups = self._groups(d, skip)
        self.thunks = self._candidates(d)

    @staticmethod
    def _groups(d: Data, skip: set[str]) -> list[list[str]]:
        """Each compared candidate beside the one it is compared with (c in the middle of
        (e, c, d): next to both, before each in one order and after it in the other)."""
        base = "baselines" not in skip
        g = [[E, C, D], [E8, C8, D8], [CF]] + ([[A, C, B]] if base else [])
        if d.big:
            g += [[E10, C10], [E10_8, C10_8]]
        if d.rec224:
            g += [[E224, C224, D224], [E224_8, C224_8], [SOD, FULL]]
            g += [[A224, C224]] if base else []
        return g

    def _candidates(self, d: Data) -> dict:
        """name -> (input to warm, the run)."""
        st, lp = self.stoker, self.loop
        return {
            C: (d.rec, lambda: st(d.rec, "112", True, second_epoch=True)),
            C8: (d.rec, lambda: st(d.rec, "112", False, second_epoch=True)),
            CF: (d.images, lambda: st(d.images, "112", True)),
            C10: (d.big, lambda: st(d.big, "112", True)),
            C10_8: (d.big, lambda: st(d.big, "112", False)),
            C224: (d.rec224, lambda: st(d.rec224, "224", True, second_epoch=True)),
            C224_8: (d.rec224, lambda: st(d.rec224, "224", False)),
            SOD: (d.rec224, lambda: st(d.rec224, "112", True)),
            FULL: (d.rec224, lambda: st(d.rec224, "112", True, scale_on_decode=False)),
            D: (d.rec, lambda: lp(_limit_worker, d.rec, d.n, "112", True)),
            D8: (d.rec, lambda: lp(_limit_worker, d.rec, d.n, "112", False)),
            D224: (d.rec224, lambda: lp(_limit_worker, d.rec224, d.n224, "224", True)),
            E: (d.rec, lambda: lp(_chain_worker, d.rec, d.n, "112", True)),
            E8: (d.rec, lambda: lp(_chain_worker, d.rec, d.n, "112", False)),
            E10: (d.rec, lambda: lp(_chain_worker, d.rec, d.n, "112", True, 10)),
            E10_8: (d.rec, lambda: lp(_chain_worker, d.rec, d.n, "112", False, 10)),
            E224: (d.rec224, lambda: lp(_chain_worker, d.rec224, d.n224, "224", True)),
            E224_8: (d.rec224, lambda: lp(_chain_worker, d.rec224, d.n224, "224", False)),
            A: (d.images, lambda: self.torch(d.images, "pil")),
            B: (d.images, lambda: self.torch(d.images, "cv")),
            A224: (d.images224, lambda: self.torch(d.images224, "pil", rrc=224)),
        }

    def stoker(self, path: str, kind: str, normalize: bool, **kw) -> dict:
        return run_stoker(
            path, kind=kind, normalize=normalize, workers=self.W, batch_size=self.B, **kw
        )

    def loop(self, target, path: str, n: int, kind: str, normalize: bool, repeat=1) -> dict:
        return run_loop(
            target, path, n=n, kind=kind, normalize=normalize, workers=self.W, repeat=repeat
        )

    def torch(self, root: str, cls: str, rrc: int | None = None) -> dict:
        # in a child process: torch stays out of this one (it would add its memory to every
        # stoker run measured after it), and each round starts as cold as the others
        cmd = [sys.executable, os.path.abspath(__file__), "--torch-baseline", cls, root]
        cmd += ["--workers", str(self.W), "--batch-size", str(self.B)]
        if rrc:
            cmd += ["--rrc", str(rrc)]
        if not MEASURE_MEMORY:
            cmd += ["--no-memory"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def run(self, rounds: int, *, memory: bool = True) -> None:
        """Round 0 samples the memory of every candidate (left out when not ``memory``); the
        timed rounds after it run with no sampler (see PeakPSS), each group in its order in even
        rounds and reversed in odd ones, so rates and CPU per image come from those rounds
        only."""
        global MEASURE_MEMORY
        for rnd in range(0 if memory else 1, rounds + 1):
            MEASURE_MEMORY = rnd == 0
            print(
                "# memory round (rates not counted)" if rnd == 0 else f"# round {rnd} of {rounds}",
                flush=True,
            )
            seen: set[str] = set()
            for gi, group in enumerate(self.groups):
                for name in group if rnd == 0 else alternated(group, rnd - 1):
                    if rnd == 0 and name in seen:
                        continue  # one memory sample of a candidate that two groups share
                    seen.add(name)
                    warm, thunk = self.thunks[name]
                    warm_page_cache(warm)
                    r = thunk()
                    keep = self.memory_runs if MEASURE_MEMORY else self.runs
                    keep.setdefault((gi, name), []).append(r)
                    shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
                    print(f"... [{gi}] {name}: {json.dumps(shown)}", flush=True)

    def of(self, name: str, *, memory: bool = False) -> list[dict]:
        """Every run of a candidate, over all the groups it ran in."""
        runs = self.memory_runs if memory else self.runs
        return [r for (_, n), rs in sorted(runs.items()) if n == name for r in rs]

    def paired(self, x: str, y: str) -> tuple[list[dict], list[dict]]:
        """The runs of x and y in the first group that holds both, round by round."""
        for gi, group in enumerate(self.groups):
            if x in group and y in group:
                return self.runs.get((gi, x), []), self.runs.get((gi, y), [])
        return [], []


# ---------------------------------------------------------------------------- the report
def _spread(values: list[float], fmt: str) -> str:
    med, lo, hi = median_range(values)
    return f"{med:{fmt}} ({lo:{fmt}}..{hi:{fmt}})"


def candidate_rows(rounds: Rounds) -> list[tuple[str, list[dict], list[dict]]]:
    """(row name, its timed runs, its memory runs) for every candidate that ran, a second
    epoch as a row of its own."""
    rows = []
    for name in rounds.thunks:
        runs = rounds.of(name)
        if not runs:
            continue
        mem = rounds.of(name, memory=True)
        rows.append((name, runs, mem))
        if "epoch2" in runs[0]:
            rows.append((f"{name}, 2nd epoch", [r["epoch2"] for r in runs], []))
    return rows


def print_table(rounds: Rounds) -> dict:
    print()
    print(f"command: {command_line()}")
    print(
        "| candidate | images/s, median (min..max) | CPU µs/image, median (min..max) "
        "| first batch (s) | peak PSS (MiB) | peak PSS w/o file cache (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    out = {}
    for name, runs, mem in candidate_rows(rounds):
        firsts = [r["first"] for r in runs if r.get("first") is not None]
        first = f"{median_range(firsts)[0]:.2f}" if firsts else "-"
        pss = max((m.get("pss", 0.0) for m in mem), default=0.0)
        anon = max((m.get("pss_anon", 0.0) for m in mem), default=0.0)
        rate = _spread([r["rate"] for r in runs], ",.0f")
        cpu = _spread([1000 * r["cpu_ms_per_image"] for r in runs], ".0f")
        mem_cols = f"{pss:.0f} | {anon:.0f}" if mem else "- | -"
        print(f"| {name} | {rate} | {cpu} | {first} | {mem_cols} |")
        out[name] = {"runs": runs, "memory_runs": mem}
    print()
    return out


# (ratio, x, y, x's second epoch, target); each from the group that holds both
RATIOS = [
    ("c/e, one epoch of {n} images from a new loader", C, E, False, ">= 1"),
    ("c/e, 2nd epoch", C, E, True, ""),
    ("c'/e', one epoch of {n} images", C8, E8, False, ">= 1"),
    ("c'/e', 2nd epoch", C8, E8, True, ""),
    ("c/e, one epoch of {n10} images", C10, E10, False, ">= 1"),
    ("c'/e', one epoch of {n10} images", C10_8, E10_8, False, ">= 1"),
    ("c/a", C, A, False, ">= 4"),
    ("c/b", C, B, False, ""),
    ("c/d, one epoch of {n} images", C, D, False, ""),
    ("c/d, 2nd epoch", C, D, True, ""),
    ("c'/d'", C8, D8, False, ""),
    ("224 RRC: c/e, one epoch of {n224} images", C224, E224, False, ">= 1"),
    ("224 RRC: c/e, 2nd epoch", C224, E224, True, ""),
    ("224 RRC: c'/e'", C224_8, E224_8, False, ">= 1"),
    ("224 RRC: c/d", C224, D224, False, ""),
    ("224 RRC: c/a", C224, A224, False, ""),
    ("112 from 500x375: scale-on-decode / full decode", SOD, FULL, False, ""),
]


def print_ratios(rounds: Rounds, d: Data) -> list[dict]:
    """Each ratio x/y as the median over the rounds of the pair that ran side by side, with
    its spread: by images/s, and by CPU per image (y's over x's: above 1 when x spends less),
    with both sides' CPU µs per image."""
    print(
        "| ratio | by images/s, median (min..max) | by CPU per image, median (min..max) "
        "| CPU µs/image x / y (medians) | pairs | target |"
    )
    print("|---|---:|---:|---:|---:|---|")
    out = []
    for label, x, y, epoch2, target in RATIOS:
        xs, ys = rounds.paired(x, y)
        if epoch2:
            xs = [r["epoch2"] for r in xs if "epoch2" in r]
        if not xs or len(xs) != len(ys):
            continue
        name = label.format(n=f"{d.n:,}", n10=f"{10 * d.n:,}", n224=f"{d.n224:,}")
        by_rate = [a["rate"] / b["rate"] for a, b in zip(xs, ys)]
        by_cpu = [b["cpu_ms_per_image"] / a["cpu_ms_per_image"] for a, b in zip(xs, ys)]
        cx = median_range([1000 * a["cpu_ms_per_image"] for a in xs])[0]
        cy = median_range([1000 * b["cpu_ms_per_image"] for b in ys])[0]
        rate_s, cpu_s = _spread(by_rate, ".2f"), _spread(by_cpu, ".2f")
        print(f"| {name} | {rate_s} | {cpu_s} | {cx:.0f} / {cy:.0f} | {len(xs)} | {target} |")
        out.append({"ratio": name, "by_rate": by_rate, "by_cpu": by_cpu, "cpu_us": [cx, cy]})
    return out


def print_notes(rounds: Rounds, d: Data) -> None:
    cs, mem = rounds.of(C), rounds.of(C, memory=True)
    if cs:
        cold = mem[0]["first"] if mem else float("nan")
        print(
            f"\nfirst batch (c): median {median_range([r['first'] for r in cs])[0]:.2f} s, "
            f"{cold:.2f} s in the memory round (the process's first loader: its first batches "
            "made by the main process while the workers start); a fresh process's, target "
            "< 0.3 s, is below"
        )
    for name in (C, C8):
        runs = rounds.of(name)
        if runs:
            main = median_range([1000 * r["main_cpu_ms_per_image"] for r in runs])[0]
            tree = median_range([1000 * r["cpu_ms_per_image"] for r in runs])[0]
            print(
                f"{name}: CPU per image over one epoch, main process {main:.1f} µs of "
                f"{tree:.0f} µs (the rest: the worker server and the workers, start-up "
                "included)"
            )
    small, big = rounds.of(C, memory=True), rounds.of(C10, memory=True)
    if small and big:
        print(
            f"peak PSS (c) {d.n:,} vs {10 * d.n:,} images: {small[0]['pss']:.0f} vs "
            f"{big[0]['pss']:.0f} MiB; without file-backed pages: {small[0]['pss_anon']:.0f} "
            f"vs {big[0]['pss_anon']:.0f} MiB  (target <= 600 MiB, flat)"
        )


def print_calibration(d: Data, quick: bool) -> dict:
    """(e)'s formulations per image on one core, for each output it is compared on; (e)
    then runs the fastest of each (``CHAIN_VARIANT``)."""
    print("\n# the plain chain (e): each formulation per image on one core, the fastest kept")
    print("| case | formulation | µs/image, median (min..max) | kept |")
    print("|---|---|---:|---|")
    out = {}
    cases = [("112", d.rec, 200 if quick else 1000)]
    if d.rec224:
        cases.append(("224", d.rec224, min(d.n224, 100 if quick else 300)))
    for kind, path, n in cases:
        for normalize in (True, False):
            got = calibrate_chain(path, kind, normalize, n)
            kept = CHAIN_VARIANT[(kind, normalize)]
            case = f"{kind} {'float32' if normalize else 'uint8'}"
            for v, med, lo, hi in got:
                print(
                    f"| {case} | {v} | {med:.0f} ({lo:.0f}..{hi:.0f}) | {'yes' if v == kept else ''} |"
                )
            out[case] = {"kept": kept, "us": {g[0]: g[1] for g in got}}
    print(flush=True)
    return out


def print_first_batch(d: Data, workers: int, runs: int) -> None:
    """The first batch of a loader in a fresh process (112 px, float32), with where its time
    goes (``bench_startup.py``)."""
    from bench_startup import bytecode_cache, one_run, report

    print(f"\n# first batch in a fresh process ({runs} processes; bench_startup.py)")
    cache = bytecode_cache(Path(d.rec).parent, None, False)
    one_run(d.rec, workers, True, None, cache)  # compiles stoker's modules: not counted
    got = [one_run(d.rec, workers, True, None, cache) for _ in range(runs)]
    report(got)


def main() -> int:
    args = parse_args()
    if args.torch_baseline:
        return torch_child(args)
    n = args.images or (600 if args.quick else 20_000)
    args.rounds = args.rounds or (1 if args.quick else 5)
    work = Path(args.work or os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    W, B = args.workers, args.batch_size
    print(
        f"# bench_loader: {n} images 112x112, batch {B}, {W} workers, {cpu_count()} CPUs",
        flush=True,
    )
    data = prepare(args, work, n)
    # stoker's worker server first, as in a training script whose loader is the first thing to
    # start one: the tight loops' processes come from multiprocessing's one fork server too,
    # and a server they started would lack the modules stoker preloads (each new loader's
    # workers would import them, about 0.3 s of its first batch)
    from stoker.loader import warm_up

    warm_up()
    calibration = print_calibration(data, args.quick)
    rounds = Rounds(data, W, B, args.skip)
    rounds.run(args.rounds, memory=not args.quick)
    table = print_table(rounds)
    ratios = print_ratios(rounds, data)
    print_notes(rounds, data)
    print_first_batch(data, W, runs=2 if args.quick else 5)
    if args.json:
        out = {"candidates": table, "ratios": ratios, "chain_calibration": calibration}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
