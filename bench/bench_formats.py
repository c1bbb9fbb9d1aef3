"""The loader's rate on each format beside RecordIO, and ``stoker convert`` beside a plain copy,
on the same images in one run.

Makes sample JPEGs, packs them into RecordIO, converts that set to TFRecord and WebDataset with
``stoker convert`` and writes the same bytes and labels into an LMDB database of Caffe
``Datum`` records (encoded) with the ``lmdb`` package. Then, in rounds whose candidate order
alternates (a busy spell on a shared machine then hurts each format alike), each format's set
is read into the page cache and one epoch of ``stoker.Loader`` (decode and a centre crop,
shuffled, ``--workers``) is timed; each format's rate is divided by RecordIO's of the same round. The
table gives the median ratio with its spread (min..max over the rounds) and the median CPU
time of the process tree per image.

Convert: ``stoker convert`` of the RecordIO set into each format, against ``cp`` of the
source's files (the ``.rec``, ``.idx`` and ``.crc32c``), alternated the same way: median
seconds, MB/s of the source and the ratio to ``cp``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import command_line, cpu_between, cpu_count, make_images, tree_cpu, warm_page_cache

FORMATS = ("recordio", "tfrecord", "wds", "lmdb")
_MAIN = {"recordio": ".rec", "tfrecord": ".tfrecord", "wds": ".tar"}


def write_lmdb(rec_manifest: str, db: str) -> None:
    """The RecordIO set's image bytes and labels as Caffe ``Datum`` records (encoded=1)."""
    import lmdb

    import stoker.formats as formats
    from stoker.formats.protowire import LEN, VARINT, encode_field

    shutil.rmtree(db, ignore_errors=True)
    with formats.open(rec_manifest) as r:
        f = r.reader()
        env = lmdb.open(db, map_size=1 << 34, subdir=True)
        try:
            with env.begin(write=True) as txn:
                for i in range(len(r)):
                    img, label, key, _ = f(i)
                    value = encode_field(4, LEN, bytes(img)) + encode_field(5, VARINT, int(label))
                    txn.put(f"{key:010d}".encode(), value + encode_field(7, VARINT, 1))
        finally:
            env.close()


def one_epoch(path: str, *, size: int, workers: int, batch_size: int) -> tuple[float, float]:
    """(images/s, CPU ms per image of the process tree) of one shuffled epoch (decode and a
    centre crop to the images' own size: the batch needs a fixed shape), start-up included."""
    from stoker import Loader
    from stoker.transforms import CenterCrop

    before = tree_cpu()
    t0 = time.perf_counter()
    n = 0
    crop = CenterCrop(size)
    with Loader(
        path, batch_size=batch_size, transforms=crop, shuffle=True, seed=0, workers=workers
    ) as loader:
        for b in loader:
            n += len(b.images)
    took = time.perf_counter() - t0
    cpu = cpu_between(before, tree_cpu())
    return n / took, 1000 * cpu / max(n, 1)


def _warm(path: str) -> None:
    warm_page_cache(path if os.path.isfile(path) else os.path.join(path, "data.mdb"))


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def time_loaders(paths: dict[str, str], args: argparse.Namespace, rounds: int) -> tuple:
    """Each format's loader rates and CPU per image, over alternating rounds."""
    rates: dict[str, list[float]] = {f: [] for f in FORMATS}
    cpus: dict[str, list[float]] = {f: [] for f in FORMATS}
    for r in range(rounds):
        order = FORMATS if r % 2 == 0 else FORMATS[::-1]
        for fmt in order:
            _warm(paths[fmt])
            rate, cpu = one_epoch(
                paths[fmt], size=args.size, workers=args.workers, batch_size=args.batch_size
            )
            rates[fmt].append(rate)
            cpus[fmt].append(cpu)
            print(f"... round {r}, {fmt}: {rate:.0f} images/s, {cpu:.3f} CPU ms/image", flush=True)
    return rates, cpus


def time_converts(
    rec_manifest: str, src_files: list[str], work: str, args: argparse.Namespace, rounds: int
) -> dict[str, list[float]]:
    """Seconds of ``cp`` of the RecordIO files and of each convert, over alternating rounds."""
    from stoker.pack import convert

    conv: dict[str, list[float]] = {k: [] for k in ("cp", "tfrecord", "wds", "recordio")}
    for r in range(rounds):
        order = list(conv) if r % 2 == 0 else list(conv)[::-1]
        for what in order:
            warm_page_cache(src_files[0])
            out = os.path.join(work, f"conv_{what}")
            t0 = time.perf_counter()
            if what == "cp":
                os.makedirs(out, exist_ok=True)
                subprocess.run(["cp", *src_files, out], check=True)
            else:
                convert(
                    rec_manifest,
                    out,
                    format=what,
                    workers=args.workers,
                    overwrite=True,
                    progress=False,
                )
            conv[what].append(time.perf_counter() - t0)
            shutil.rmtree(out, ignore_errors=True)
    return conv


def print_tables(rates: dict, cpus: dict, conv: dict, nbytes: int, rounds: int) -> None:
    print()
    print("loader, one epoch; ratio = format's rate / RecordIO's in the same round")
    print(f"{'format':<10} {'images/s':>9} {'ratio: median (min..max)':>26} {'CPU ms/img':>11}")
    for fmt in FORMATS:
        ratios = [a / b for a, b in zip(rates[fmt], rates["recordio"], strict=True)]
        print(
            f"{fmt:<10} {statistics.median(rates[fmt]):>9.0f} {_spread(ratios):>26} "
            f"{statistics.median(cpus[fmt]):>11.3f}"
        )
    print()
    print(f"convert of the RecordIO set ({nbytes / 1e6:.1f} MB), median of {rounds}")
    print(f"{'method':<22} {'seconds':>8} {'MB/s':>8} {'/ cp':>7}")
    cp_s = statistics.median(conv["cp"])
    for what, times in conv.items():
        name = "cp .rec .idx .crc32c" if what == "cp" else f"convert -> {what}"
        dt = statistics.median(times)
        print(f"{name:<22} {dt:>8.3f} {nbytes / 1e6 / dt:>8.1f} {dt / cp_s:>7.1f}")
    print("(/ cp: the method's time divided by cp's; 1.0 = as fast as copying the bytes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="600 images and 2 rounds (a smoke run)")
    ap.add_argument("--images", type=int, default=None, help="number of images (default 4000)")
    ap.add_argument("--size", type=int, default=64, help="image side (default 64)")
    ap.add_argument("--rounds", type=int, default=None, help="alternations (default 5)")
    ap.add_argument("--workers", type=int, default=2, help="loader and convert workers")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()

    from stoker import pack
    from stoker.pack import convert

    n_images = args.images or (600 if args.quick else 4000)
    rounds = args.rounds or (2 if args.quick else 5)
    work = args.dir or tempfile.mkdtemp(prefix="stoker-bench-formats-")
    os.makedirs(work, exist_ok=True)
    print(f"command: {command_line()}")
    try:
        src = os.path.join(work, "images")
        make_images(src, n=n_images, size=args.size, classes=10)
        sets = {"recordio": os.path.join(work, "set")}
        pack(src, sets["recordio"], workers=args.workers, overwrite=True, progress=False)
        rec_manifest = sets["recordio"] + ".stoker.json"
        for fmt in ("tfrecord", "wds"):
            sets[fmt] = os.path.join(work, f"set_{fmt}")
            convert(
                rec_manifest,
                sets[fmt],
                format=fmt,
                workers=args.workers,
                overwrite=True,
                progress=False,
            )
        sets["lmdb"] = os.path.join(work, "set_lmdb")
        write_lmdb(rec_manifest, sets["lmdb"])
        paths = {f: (p + _MAIN[f] if f in _MAIN else p) for f, p in sets.items()}
        src_files = [sets["recordio"] + e for e in (".rec", ".idx", ".crc32c")]
        nbytes = sum(os.path.getsize(p) for p in src_files)
        print(
            f"data: {n_images} JPEGs {args.size}x{args.size}, RecordIO {nbytes / 1e6:.1f} MB; "
            f"{args.workers} workers, batch {args.batch_size}, {rounds} rounds; "
            f"{cpu_count()} cores, python {sys.version.split()[0]}",
            flush=True,
        )
        rates, cpus = time_loaders(paths, args, rounds)
        conv = time_converts(rec_manifest, src_files, work, args, rounds)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print_tables(rates, cpus, conv, nbytes, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
