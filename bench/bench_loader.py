"""Loader throughput, side by side, in one run on the same sample data.

112x112 JPEGs, batch 256, resize 128 -> random crop 112 -> flip -> float32 NCHW normalised,
``--workers`` worker processes (default 2), one epoch each:

  (a)  PIL ImageFolder-style dataset + torch.utils.data.DataLoader (torchvision's ops written out)
  (b)  the same with OpenCV
  (c)  stoker.Loader from the packed .rec
  (c') stoker.Loader, uint8 NHWC output (normalisation left to the GPU edge)
  (d)  the machine's limit: the same decode + augment in a tight loop over bytes already in
       memory, no IPC, in ``workers`` processes at once, their rates summed

Prints images/s, c/a, c/d, time to first batch and the peak PSS of the whole process tree;
then stoker on a 10x larger .rec (records repeated, read from the page cache): its peak memory,
and c/d over an epoch long enough that a loader's start-up is spread as on a real dataset
(an epoch of 20k images is short enough for start-up to weigh on it); the 224x224 variant
(RandomResizedCrop 224 from 336x400 JPEGs), and the 112 pipeline on those 336x400 JPEGs with
and without scale-on-decode (a 1/2-scale JPEG decode is exact there; RandomResizedCrop's exact
hint is "full size", since its smallest crops need every pixel).

    python bench/bench_loader.py            # 20k images, memory + best of 3 rounds
    python bench/bench_loader.py --quick    # 2k images: a smoke run

A first round samples every candidate's memory (PSS of the process tree, 4 times a second);
its rates are not counted, since the sampler's CPU comes out of the run it measures, and more
for some candidates than for others (see ``PeakPSS``). Then each timed round runs every
candidate once, in the same order (stoker, its limit, the baselines), with no sampler, and each
candidate's best round counts (see ``best_of``): on a shared machine other jobs only ever
slow a run down, and interleaving makes a busy spell hit all candidates alike. Each ratio is
also printed per round (two candidates of one round ran next to each other). The torch
baselines run in a child process each, so torch never enters the process that measures stoker.

Targets: c/a >= 4, c/d >= 0.9, first batch < 1 s, peak memory flat in dataset size.
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

import numpy as np
from _common import (
    MEAN,
    STD,
    PeakPSS,
    best_of,
    command_line,
    cpu_count,
    make_data,
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


def _pil_rrc(img, size):
    """torchvision RandomResizedCrop(size) on a PIL image."""
    import math
    import random

    from PIL import Image

    w, h = img.size
    area = w * h
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        ar = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = int(round(math.sqrt(target * ar)))
        ch = int(round(math.sqrt(target / ar)))
        if 0 < cw <= w and 0 < ch <= h:
            x = random.randint(0, w - cw)
            y = random.randint(0, h - ch)
            return img.crop((x, y, x + cw, y + ch)).resize((size, size), Image.BILINEAR)
    s = min(w, h)
    x, y = (w - s) // 2, (h - s) // 2
    return img.crop((x, y, x + s, y + s)).resize((size, size), Image.BILINEAR)


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
            layout="NCHW" if normalize else "NHWC",
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
            if second_epoch:
                t1, n2 = time.perf_counter(), 0
                for b in loader:
                    n2 += len(b.images)
                took, cpu2 = time.perf_counter() - t1, mem.snapshot() - cpu1
                second = {"rate": n2 / took, "cpu_ms_per_image": 1000 * cpu2 / max(n2, 1)}
    out = _result(n, elapsed, first, mem)
    out["cpu_ms_per_image"] = 1000 * cpu1 / max(n, 1)  # the first epoch's
    if second is not None:
        out["epoch2"] = second
    return out


def _limit_worker(args, barrier, results) -> None:
    """One process of (d): read its share of the records into memory, wait for the others,
    then time decode + augment + placement into a batch array, through the same per-sample
    code as a loader worker (``Pipeline.fill_row``) minus reading, IPC and bookkeeping."""
    path, kind, normalize, start, stop, scale_on_decode, layout = args
    import cv2

    from stoker._core.seeding import SampleRngs
    from stoker.codecs import DECODED_SPEC
    from stoker.formats.recordio import open_records
    from stoker.pipeline import DecodeOptions, Pipeline

    cv2.setNumThreads(1)
    rec = open_records(path)
    payloads = [bytes(rec.read_header(i)[1]) for i in range(start, stop)]
    rec.close()
    pipe = Pipeline(
        DECODED_SPEC,
        transforms=stoker_transforms(kind, normalize=normalize),
        layout=layout,
        decode=DecodeOptions(scale_on_decode=scale_on_decode),
    )
    out = np.empty((256, *pipe.row_shape()), dtype=pipe.dtype)
    barrier.wait()
    t0 = time.time()
    c0 = time.process_time()
    rngs = SampleRngs(0, 0)
    for j, buf in enumerate(payloads):
        img = pipe.decode_image(buf)
        pipe.fill_row(img, rngs.at(start + j), out[j % 256], None, what="sample {}", args=(j,))
    results.put((len(payloads), t0, time.time(), time.process_time() - c0))


def run_limit(
    path: str,
    *,
    n: int,
    kind: str,
    normalize: bool,
    workers: int,
    scale_on_decode: bool = True,
) -> dict:
    """(d): ``workers`` processes start together, each on its share of the images; the rate is
    the sum of their rates (images / own seconds each). All images over (last end - first
    start) would be lower by the imbalance of the fixed split: the first process to finish
    leaves a core idle for a few percent of the run, which is a fault of this loop and not
    a limit of the machine. Under the same memory sampler as every other candidate: on a
    machine with as many cores as workers, its CPU comes out of the run it measures, and (d)
    must not be spared it."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    per = -(-n // workers)
    layout = "NCHW" if normalize else "NHWC"
    procs = [
        ctx.Process(
            target=_limit_worker,
            args=(
                (path, kind, normalize, w * per, min(n, (w + 1) * per), scale_on_decode, layout),
                barrier,
                results,
            ),
        )
        for w in range(workers)
    ]
    with PeakPSS(memory=MEASURE_MEMORY) as mem:
        for p in procs:
            p.start()
        got = [results.get() for _ in procs]
        for p in procs:
            p.join()
    images = sum(g[0] for g in got)
    cpu = sum(g[3] for g in got)
    return {
        "images": images,
        "rate": sum(g[0] / (g[2] - g[1]) for g in got),
        "cpu_ms_per_image": 1000 * cpu / max(images, 1),
    } | mem.figures()


# ---------------------------------------------------------------------------- data
def repeat_rec(src: str, dst: str, times: int) -> str:
    """A .rec ``times`` as long: the same records repeated under new keys."""
    from stoker.formats.recordio import RecordWriter, open_records

    if os.path.exists(dst):
        return dst
    rec = open_records(src)
    payloads = [bytes(rec.read(i)) for i in range(len(rec))]
    rec.close()
    with RecordWriter(dst, overwrite=True) as w:
        key = 0
        for _ in range(times):
            for p in payloads:
                w.write(key, p)
                key += 1
    return dst


def fmt_row(name: str, r: dict) -> str:
    first = f"{r['first']:.2f}" if r.get("first") is not None else "-"
    pss = f"{r['pss']:.0f}" if r.get("pss") else "-"
    anon = f"{r['pss_anon']:.0f}" if r.get("pss_anon") else "-"
    return f"| {name} | {r['rate']:,.0f} | {r['cpu_ms_per_image']:.2f} | {first} | {pss} | {anon} |"


# ---------------------------------------------------------------------------- the run
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="2k images instead of 20k")
    ap.add_argument("--images", type=int, default=None, help="images for the 112 px runs")
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
        "--rounds",
        type=int,
        default=None,
        help="runs per candidate, the best counts (3; --quick: 1)",
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--torch-baseline", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    ap.add_argument("--rrc", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
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
    print(f"data ready in {time.perf_counter() - t:.0f} s: {images}, {rec}", flush=True)
    data = Data(n, images, rec)
    if "scale" not in args.skip:
        # 10x the records under new keys: memory must not grow with the dataset, and one epoch
        # of it spreads a loader's start-up over 10x the images, as a real dataset does
        data.big = repeat_rec(rec, str(work / f"s112_{n}_x10.rec"), 10)
    if "224" not in args.skip:
        # enough images that the batch ring (4 slots of 256 float32 224x224 samples: 616 MB,
        # zeroed, mapped and freed once per loader) is not a third of the epoch's cost
        data.n224 = 400 if args.quick else 6_000
        data.images224, data.rec224 = make_data(
            work, n=data.n224, size=(336, 400), name=f"s224_{data.n224}"
        )
    return data


class Rounds:
    """Runs candidates, each with its input warmed just before, and keeps their results: the
    memory round's (``memory_runs``) apart from the timed rounds' (``runs``)."""

    def __init__(self, workers: int, batch_size: int) -> None:
        self.W, self.B = workers, batch_size
        self.runs: dict[str, list[dict]] = {}
        self.memory_runs: dict[str, list[dict]] = {}

    def record(self, name: str, r: dict) -> None:
        (self.memory_runs if MEASURE_MEMORY else self.runs).setdefault(name, []).append(r)
        shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
        print(f"... {name}: {json.dumps(shown)}", flush=True)

    def stoker(self, name: str, path: str, kind: str, normalize: bool, **kw) -> None:
        warm_page_cache(path)
        r = run_stoker(
            path, kind=kind, normalize=normalize, workers=self.W, batch_size=self.B, **kw
        )
        self.record(name, r)

    def limit(self, name: str, path: str, count: int, kind: str, normalize: bool) -> None:
        warm_page_cache(path)
        r = run_limit(path, n=count, kind=kind, normalize=normalize, workers=self.W)
        self.record(name, r)

    def torch(self, name: str, root: str, cls: str, rrc: int | None = None) -> None:
        # in a child process: torch stays out of this one (it would add its memory to every
        # stoker run measured after it), and each round starts as cold as the others
        cmd = [sys.executable, os.path.abspath(__file__), "--torch-baseline", cls, root]
        cmd += ["--workers", str(self.W), "--batch-size", str(self.B)]
        if rrc:
            cmd += ["--rrc", str(rrc)]
        if not MEASURE_MEMORY:
            cmd += ["--no-memory"]
        warm_page_cache(root)
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        self.record(name, json.loads(out.stdout.strip().splitlines()[-1]))

    def one_round(self, d: Data, skip: set[str]) -> None:
        """Every candidate once, in the same order each round, so that a busy spell on the
        shared machine hits all of them alike."""
        self.stoker("c stoker .rec float NCHW", d.rec, "112", True, second_epoch=True)
        self.limit("d limit float NCHW", d.rec, d.n, "112", True)
        self.stoker("c' stoker .rec uint8 NHWC", d.rec, "112", False, second_epoch=True)
        self.limit("d' limit uint8 NHWC", d.rec, d.n, "112", False)
        self.stoker("c stoker folder float NCHW", d.images, "112", True)
        if d.big:
            self.stoker("c stoker .rec x10 float NCHW", d.big, "112", True)
        if d.rec224:
            self.stoker("224 c stoker RRC", d.rec224, "224", True, second_epoch=True)
            self.limit("224 d limit RRC", d.rec224, d.n224, "224", True)
            # the 112 pipeline on the 336x400 photos: Resize(128) allows a 1/2-scale decode
            self.stoker("112 from 336x400 c, scale-on-decode", d.rec224, "112", True)
            self.stoker(
                "112 from 336x400 c, full decode", d.rec224, "112", True, scale_on_decode=False
            )
        if "baselines" not in skip:
            self.torch("a PIL + DataLoader", d.images, "pil")
            self.torch("b OpenCV + DataLoader", d.images, "cv")
            if d.images224:
                self.torch("224 a PIL + DataLoader RRC", d.images224, "pil", rrc=224)

    def run(self, d: Data, rounds: int, skip: set[str]) -> None:
        """Round 0 samples the memory of every candidate; the timed rounds after it run with
        no sampler (see PeakPSS), so rates and CPU per image come from those rounds only."""
        global MEASURE_MEMORY
        for rnd in range(rounds + 1):
            MEASURE_MEMORY = rnd == 0
            if MEASURE_MEMORY:
                print("# memory round (rates not counted)", flush=True)
            else:
                print(f"# round {rnd} of {rounds}", flush=True)
            self.one_round(d, skip)

    def best(self) -> dict[str, dict]:
        """Each candidate's best timed round (best_of), with the peak memory of every round."""
        res: dict[str, dict] = {}
        for name in ORDER:
            if name in self.runs:
                res[name] = best_of(self.runs[name])
                for m in self.memory_runs.get(name, []):
                    for k in ("pss", "pss_anon"):
                        res[name][k] = max(res[name].get(k, 0.0), m[k])
        return res


ORDER = [
    "c stoker .rec float NCHW",
    "c' stoker .rec uint8 NHWC",
    "c stoker folder float NCHW",
    "c stoker .rec x10 float NCHW",
    "224 c stoker RRC",
    "112 from 336x400 c, scale-on-decode",
    "112 from 336x400 c, full decode",
    "d limit float NCHW",
    "d' limit uint8 NHWC",
    "224 d limit RRC",
    "a PIL + DataLoader",
    "b OpenCV + DataLoader",
    "224 a PIL + DataLoader RRC",
]
C, C8, D8 = "c stoker .rec float NCHW", "c' stoker .rec uint8 NHWC", "d' limit uint8 NHWC"
X10 = "c stoker .rec x10 float NCHW"


def print_table(res: dict[str, dict]) -> None:
    print()
    print(f"command: {command_line()}")
    print(
        "| candidate | images/s | CPU ms/image | first batch (s) | peak PSS (MiB) | peak PSS w/o file cache (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in res.items():
        print(fmt_row(name, r))
        if "epoch2" in r:
            print(fmt_row(f"{name}, 2nd epoch", r["epoch2"]))
    print()


def ratio(res: dict[str, dict], runs: dict, x: str, y: str, *, epoch2: bool = False) -> str:
    """x over y by images/s and by CPU time per image; per round when both ran every round."""
    if x not in res or y not in res or (epoch2 and "epoch2" not in res[x]):
        return "-"
    rx = res[x]["epoch2"] if epoch2 else res[x]
    by_rate = rx["rate"] / res[y]["rate"]
    by_cpu = res[y]["cpu_ms_per_image"] / rx["cpu_ms_per_image"]
    out = f"{by_rate:.2f} by images/s, {by_cpu:.2f} by CPU time per image"
    if len(runs[x]) > 1 and len(runs[x]) == len(runs[y]):
        # the two candidates of one round ran next to each other: their ratio is the least
        # touched by the machine's slow drift (each candidate's best may come from two
        # different rounds)
        per = [(a["epoch2"] if epoch2 else a)["rate"] / b["rate"] for a, b in zip(runs[x], runs[y])]
        out += "; by round: " + " ".join(f"{v:.2f}" for v in per)
    return out


def print_ratios(res: dict[str, dict], rounds: Rounds, n: int) -> None:
    def q(x: str, y: str, *, epoch2: bool = False) -> str:
        return ratio(res, rounds.runs, x, y, epoch2=epoch2)

    print(f"c/a   = {q(C, 'a PIL + DataLoader')}  (target >= 4)")
    print(f"c'/a  = {q(C8, 'a PIL + DataLoader')}")
    print(f"c/b   = {q(C, 'b OpenCV + DataLoader')}")
    print(f"c/d   = {q(C, 'd limit float NCHW')}  (target >= 0.9)")
    print(f"c'/d' = {q(C8, D8)}")
    print(f"c/d over one epoch of {10 * n} images = {q(X10, 'd limit float NCHW')}")
    print(f"2nd epoch: c/a   = {q(C, 'a PIL + DataLoader', epoch2=True)}")
    print(f"2nd epoch: c/d   = {q(C, 'd limit float NCHW', epoch2=True)}")
    print(f"2nd epoch: c'/d' = {q(C8, D8, epoch2=True)}")
    cold = rounds.memory_runs[C][0]["first"] if C in rounds.memory_runs else float("nan")
    print(
        f"first batch (c) = {res[C]['first']:.2f} s, {cold:.2f} s in the memory round (the first "
        "loader of this process also started the worker server)  (target < 1 s)"
    )
    if X10 in res:
        big = res[X10]
        print(
            f"peak PSS {n} vs {10 * n} images: {res[C]['pss']:.0f} vs {big['pss']:.0f} MiB; "
            f"without file-backed pages: {res[C]['pss_anon']:.0f} vs {big['pss_anon']:.0f} MiB"
        )
    if "224 c stoker RRC" in res:
        print(f"224 RRC: c/a = {q('224 c stoker RRC', '224 a PIL + DataLoader RRC')}")
        print(f"224 RRC: c/d = {q('224 c stoker RRC', '224 d limit RRC')}")
        print(f"224 RRC, 2nd epoch: c/d = {q('224 c stoker RRC', '224 d limit RRC', epoch2=True)}")
        print(
            "112 from 336x400 photos: scale-on-decode vs full decode = "
            f"{q('112 from 336x400 c, scale-on-decode', '112 from 336x400 c, full decode')}"
        )


def main() -> int:
    args = parse_args()
    if args.torch_baseline:
        return torch_child(args)
    n = args.images or (2_000 if args.quick else 20_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    work = Path(args.work or os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    W, B = args.workers, args.batch_size
    print(
        f"# bench_loader: {n} images 112x112, batch {B}, {W} workers, {cpu_count()} CPUs",
        flush=True,
    )
    data = prepare(args, work, n)
    # Each candidate's best round counts (best_of); round 0 only samples memory (Rounds.run).
    rounds = Rounds(W, B)
    rounds.run(data, args.rounds, args.skip)
    res = rounds.best()
    print_table(res)
    print_ratios(res, rounds, n)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
