"""The augmentation policies on one core, side by side with the PIL reference in one run.

1. Per image, 224x224 sample JPEGs decoded once: stoker's RandAugment(2, 9),
   TrivialAugmentWide and AutoAugment("imagenet") on the arrays against the reference
   (``bench/_pil_policies.py``: torchvision's op table on PIL's ImageOps and ImageEnhance) on
   ready PIL images, the policies' own time only.
2. Each op at RandAugment's bin 9: stoker's ``run`` against PIL's own call.
3. Where the time goes: RandAugment(2, 9) per image next to the JPEG decode of the same images
   (stoker's decoder; PIL's ``Image.open(...).convert("RGB")`` beside the reference).
4. The whole pipeline: ``stoker.Loader`` on a packed .rec of 500x375 JPEGs with
   RandomResizedCrop(224) -> flip -> RandAugment(2, 9), uint8 NCHW, against a PIL
   ImageFolder-style dataset doing the same with the reference policy in a torch
   ``DataLoader``, one worker each, two epochs each (the first with the start), each process
   tree pinned to one core (``sched_setaffinity``); torch runs in a child process of its own.

Thread CPU time per image for 1-3, rounds alternating which side runs first; the figure is
the median of the rounds, the ratio the median of the per-round ratios with their spread.
``cv2.setNumThreads(1)``.

    python bench/bench_policies.py [--quick] [--images N] [--loader-images N] [--rounds R]

Targets: RandAugment(2, 9) and TrivialAugmentWide at <= 0.5x the reference's time per image;
the loader at >= 2x the DataLoader's images per second.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _pil_policies as P
import cv2
import numpy as np
from _common import (
    alternated,
    bench_parser,
    command_line,
    cpu_between,
    make_data,
    make_images,
    median_range,
    tree_cpu,
    warm_page_cache,
)
from bench_loader import PILFolder, _pil_rrc
from PIL import Image

HERE = Path(__file__).resolve().parent
#: the core both loaders' process trees run on (main process and worker alike)
ONE_CORE = max(os.sched_getaffinity(0))


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "40 images, 600 for the loader, 2 rounds: a smoke run")
    ap.add_argument("--images", type=int, default=None, help="224 px images (400)")
    ap.add_argument("--loader-images", type=int, default=None, help="500x375 images (2000)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (5; --quick: 2)")
    ap.add_argument("--work", default=None, help="data folder (default: a temporary one)")
    ap.add_argument("--torch-child", nargs=2, metavar=("ROOT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.images = args.images or (40 if args.quick else 400)
    args.loader_images = args.loader_images or (600 if args.quick else 2000)
    args.rounds = args.rounds or (2 if args.quick else 5)
    return args


# ---------------------------------------------------------------------------- timing
def per_image_us(fn, n: int) -> float:
    t = time.thread_time()
    fn()
    return 1e6 * (time.thread_time() - t) / n


def each(items, fn) -> None:
    """``fn`` on every item, its results dropped at once (kept, a pass over the images would
    grow the heap, and every fresh page would cost its fault inside the timing)."""
    for x in items:
        fn(x)


def paired(ours, ref, n: int, rounds: int) -> tuple[list[float], list[float]]:
    """µs per image of ``ours()`` and ``ref()`` (each a pass over ``n`` images) per round,
    the order alternating."""
    a: list[float] = []
    b: list[float] = []
    ours(0)  # warm both up
    ref(0)
    for r in range(rounds):
        for side in alternated(["ours", "ref"], r):
            if side == "ours":
                a.append(per_image_us(lambda r=r: ours(r), n))
            else:
                b.append(per_image_us(lambda r=r: ref(r), n))
    return a, b


def row(name: str, a: list[float], b: list[float]) -> str:
    ratio, lo, hi = median_range([x / y for x, y in zip(a, b)])
    return (
        f"{name:34s} {median_range(a)[0]:9.1f} {median_range(b)[0]:9.1f}   "
        f"{ratio:.3f}x ({lo:.3f}-{hi:.3f})"
    )


# ---------------------------------------------------------------------------- per image
def load_224(work: Path, n: int) -> tuple[list[bytes], list[np.ndarray], list[Image.Image]]:
    from stoker.codecs import decoder

    root = make_images(work / f"policies_224_{n}", n=n, size=224)
    files = sorted(root.rglob("*.jpg"))[:n]
    blobs = [f.read_bytes() for f in files]
    decode = decoder()
    arrays = [decode(b) for b in blobs]
    return blobs, arrays, [Image.fromarray(a) for a in arrays]


def policies_table(arrays, pils, rounds: int) -> dict:
    from stoker._core.seeding import SampleRngs
    from stoker.transforms import AutoAugment, RandAugment, TrivialAugmentWide

    n = len(arrays)
    print(f"\n1. policies per image, {n} 224x224 images, {rounds} rounds (µs, one core)")
    print(f"{'policy':34s} {'stoker':>9s} {'PIL ref':>9s}   stoker/PIL (spread)")
    out = {}
    for name, ours, ref in (
        ("RandAugment(2, 9)", RandAugment(2, 9), P.RandAugment(2, 9)),
        ("TrivialAugmentWide()", TrivialAugmentWide(), P.TrivialAugmentWide()),
        ('AutoAugment("imagenet")', AutoAugment(), P.AutoAugment()),
    ):

        def run_ours(r: int, op=ours) -> None:
            at = SampleRngs(0, r).at  # another epoch each round
            for i, img in enumerate(arrays):
                op(img, at(i))

        def run_ref(r: int, op=ref) -> None:
            op.rnd = random.Random(r)
            for p in pils:
                op(p)

        a, b = paired(run_ours, run_ref, n, rounds)
        print(row(name, a, b))
        out[name] = {"stoker_us": median_range(a)[0], "pil_us": median_range(b)[0]}
    return out


def ops_table(arrays, pils, rounds: int) -> dict:
    from stoker.transforms import RandAugment
    from stoker.transforms.policies import _torchvision_arg

    op, n = RandAugment(2, 9), len(arrays)
    print(f"\n2. each op at bin 9 of 31, {n} images (µs, one core)")
    print(f"{'op':34s} {'stoker':>9s} {'PIL':>9s}   stoker/PIL (spread)")
    out = {}
    for name in P.TORCHVISION_OPS:
        hw = arrays[0].shape[:2]
        values = P.torchvision_space(31, hw)[name][0]
        m = 0.0 if values is None else values[9]
        arg = _torchvision_arg(name, 9, 31, hw, False, False)
        a, b = paired(
            lambda r, name=name, arg=arg: each(arrays, lambda x: op.run(x, name, arg)),
            lambda r, name=name, m=m: each(pils, lambda p: P.apply_op(p, name, m)),
            n,
            rounds,
        )
        print(row(name, a, b))
        out[name] = {"stoker_us": median_range(a)[0], "pil_us": median_range(b)[0]}
    return out


def decode_table(blobs, arrays, pils, rounds: int, policies: dict) -> dict:
    import io

    from stoker.codecs import decoder

    decode, n = decoder(), len(blobs)
    a, b = paired(
        lambda r: each(blobs, decode),
        lambda r: each(blobs, lambda x: Image.open(io.BytesIO(x)).convert("RGB")),
        n,
        rounds,
    )
    ra = policies["RandAugment(2, 9)"]
    print(f"\n3. where the time goes, per 224x224 image (µs, one core, medians of {rounds})")
    print(f"{'':34s} {'stoker':>9s} {'PIL':>9s}")
    print(f"{'JPEG decode':34s} {median_range(a)[0]:9.1f} {median_range(b)[0]:9.1f}")
    print(f"{'RandAugment(2, 9)':34s} {ra['stoker_us']:9.1f} {ra['pil_us']:9.1f}")
    print(
        f"{'RandAugment / decode':34s} {ra['stoker_us'] / median_range(a)[0]:9.2f} "
        f"{ra['pil_us'] / median_range(b)[0]:9.2f}"
    )
    return {"decode_us": median_range(a)[0], "pil_decode_us": median_range(b)[0]}


# ---------------------------------------------------------------------------- the loader
class PolicyFolder(PILFolder):
    """torchvision's ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + the
    reference RandAugment(2, 9) + a uint8 CHW tensor, written out (torchvision is not needed)."""

    policy = P.RandAugment(2, 9, rnd=random)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        import torch

        path, label = self.samples[i]
        img = _pil_rrc(Image.open(path).convert("RGB"), 224)
        flip = random.random() < 0.5
        img = self.policy(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img)
        chw = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        return chw, label


def torch_child(root: str, n: int) -> int:
    """Two epochs of the DataLoader baseline, one persistent worker: their figures as JSON."""
    import torch

    os.sched_setaffinity(0, {ONE_CORE})  # the worker it starts inherits it
    torch.set_num_threads(1)
    dl = torch.utils.data.DataLoader(
        PolicyFolder(root), batch_size=64, shuffle=True, num_workers=1, persistent_workers=True
    )
    print(json.dumps(_epochs(lambda: (len(images) for images, _ in dl), tree_cpu, cpu_between)))
    return 0


def _epochs(batches, cpu, between) -> dict:
    """images/s and CPU ms per image of two epochs (the first with the start); ``batches()``
    yields each batch's size, ``cpu()`` snapshots the CPU of the process tree."""
    out = {}
    t0, c0 = time.perf_counter(), cpu()
    for epoch in ("first", "second"):
        got = sum(batches())
        t1, c1 = time.perf_counter(), cpu()
        out[epoch] = {
            "images": got,
            "rate": got / (t1 - t0),
            "cpu_ms": 1000 * between(c0, c1) / got,
        }
        t0, c0 = t1, c1
    return out


def run_stoker(rec: str, seed: int) -> dict:
    from stoker.loader import Loader
    from stoker.transforms import Compose, HorizontalFlip, RandAugment, RandomResizedCrop

    chain = Compose([RandomResizedCrop(224), HorizontalFlip(), RandAugment(2, 9)])
    os.sched_setaffinity(0, {ONE_CORE})  # the loader's worker server and worker inherit it
    with Loader(
        rec, batch_size=64, transforms=chain, layout="NCHW", shuffle=True, seed=seed, workers=1
    ) as ld:
        return _epochs(lambda: (len(b.images) for b in ld), tree_cpu, cpu_between)


def loader_table(work: Path, n: int, rounds: int) -> dict:
    folder, rec = make_data(work, n=n, size=(375, 500), name=f"rrc_375x500_{n}")
    print(
        f"\n4. one epoch of {n} 500x375 JPEGs, RandomResizedCrop(224) -> flip -> RandAugment(2, 9),"
    )
    print("   uint8 NCHW batches of 64, one worker each; two epochs of one loader each; each")
    print(f"   process tree (main process and worker) on core {ONE_CORE} alone")
    runs: dict[str, list[dict]] = {"stoker": [], "torch": []}
    for r in range(rounds):
        for side in alternated(["stoker", "torch"], r):
            warm_page_cache(rec if side == "stoker" else folder)
            if side == "stoker":
                runs[side].append(run_stoker(rec, r))
                continue
            cmd = [sys.executable, str(Path(__file__)), "--torch-child", folder, str(n)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    names = {"stoker": "stoker.Loader (.rec)", "torch": "PIL folder + DataLoader"}
    out = {}
    for epoch, what in (("first", "epoch 1 (start included)"), ("second", "epoch 2")):
        print(f"{what:34s} {'images/s':>9s} {'CPU ms/img':>11s}")
        for side, label in names.items():
            got = [x[epoch] for x in runs[side]]
            rate, cpu = (
                median_range([x["rate"] for x in got])[0],
                median_range([x["cpu_ms"] for x in got])[0],
            )
            print(f"  {label:32s} {rate:9.1f} {cpu:11.2f}")
        pairs = zip(runs["stoker"], runs["torch"])
        ratio, lo, hi = median_range([s[epoch]["rate"] / t[epoch]["rate"] for s, t in pairs])
        print(f"  {'stoker / DataLoader, images/s':32s} {ratio:9.2f}x ({lo:.2f}-{hi:.2f})")
        out[epoch] = ratio
    return out


def main() -> int:
    args = parse_args()
    if args.torch_child:
        return torch_child(args.torch_child[0], int(args.torch_child[1]))
    cv2.setNumThreads(1)
    work = Path(args.work or Path(tempfile.gettempdir()) / "stoker-bench")
    work.mkdir(parents=True, exist_ok=True)
    print(f"$ {command_line()}")
    blobs, arrays, pils = load_224(work, args.images)
    policies = policies_table(arrays, pils, args.rounds)
    ops_table(arrays, pils, args.rounds)
    decode_table(blobs, arrays, pils, args.rounds, policies)
    loader_table(work, args.loader_images, max(1, args.rounds // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
