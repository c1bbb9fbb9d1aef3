"""The loader's rate on each format beside RecordIO, and ``stoker convert`` beside a plain copy,
on the same images in one run.

Makes sample JPEGs, packs them into RecordIO, converts that set to TFRecord and WebDataset with
``stoker convert`` and writes the same bytes and labels into an LMDB database of Caffe
``Datum`` records (encoded) with the ``lmdb`` package; each set is opened once, so its index,
key list and label caches exist before the clocks start (as RecordIO's ``.idx`` does). Then,
in rounds whose candidate order alternates (a busy spell on a shared machine then hurts each
format alike), each format's set is read into the page cache and one ``stoker.Loader``
(decode and a centre crop, shuffled, ``--workers``) runs ``--epochs`` epochs. Two figures per
format and round, each divided by RecordIO's of the same round:

- first epoch: from constructing the loader to its last batch (worker start-up and each
  format's first open of its caches included: what a short job sees);
- steady state: the later epochs of the same loader, workers warm (what every epoch of a
  training run after its first sees).

The tables give the median ratio with its spread (min..max over the rounds), and the median
CPU time of the process tree per image (microseconds) for each.

``indexed`` is the same samples as tars of 1,000 written by ``webdataset.TarWriter`` (as a
published collection is) and indexed in place by ``stoker index``.

Convert: ``stoker convert`` of the RecordIO set into each format, and ``stoker index`` of the
tars on the local pool and as Ray tasks (a local Ray runtime of ``--workers`` CPUs, started
before the clocks), against ``cp`` of the source's files (the ``.rec``, ``.idx`` and
``.crc32c``), alternated the same way: median seconds, MB/s of the source, tars indexed per
second and the ratio to ``cp``.
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

FORMATS = ("recordio", "tfrecord", "wds", "indexed", "lmdb")
PER_TAR = 1000
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


def run_loader(path: str, args: argparse.Namespace) -> dict[str, float]:
    """One loader, ``args.epochs`` shuffled epochs (decode and a centre crop to the images'
    own size: the batch needs a fixed shape): images/s and CPU us per image of the process
    tree for the first epoch (start-up included) and for the later ones (``steady``)."""
    from stoker import Loader
    from stoker.transforms import CenterCrop

    before = tree_cpu()
    t0 = time.perf_counter()
    counts: list[int] = []
    t1, mid = t0, before  # set again after the first epoch
    with Loader(
        path,
        batch_size=args.batch_size,
        transforms=CenterCrop(args.size),
        shuffle=True,
        seed=0,
        workers=args.workers,
    ) as loader:
        for _epoch in range(args.epochs):
            n = 0
            for b in loader:
                n += len(b.images)
            counts.append(n)
            if len(counts) == 1:
                t1, mid = time.perf_counter(), tree_cpu()
        t2, after = time.perf_counter(), tree_cpu()
    later = sum(counts[1:])
    return {
        "first": counts[0] / (t1 - t0),
        "first_cpu": 1e6 * cpu_between(before, mid) / max(counts[0], 1),
        "steady": later / (t2 - t1) if later else float("nan"),
        "steady_cpu": 1e6 * cpu_between(mid, after) / max(later, 1),
    }


def _warm(path: str) -> None:
    if path.endswith(".stoker.json") and os.path.isdir(os.path.dirname(path) + "/tars"):
        for name in os.listdir(os.path.dirname(path) + "/tars"):
            warm_page_cache(os.path.join(os.path.dirname(path), "tars", name))
        return
    warm_page_cache(path if os.path.isfile(path) else os.path.join(path, "data.mdb"))


def write_tars(rec_manifest: str, folder: str) -> str:
    """The RecordIO set's image bytes and labels as tars of ``PER_TAR`` samples written by
    ``webdataset.TarWriter``; returns their brace pattern."""
    import webdataset

    import stoker.formats as formats

    os.makedirs(folder, exist_ok=True)
    with formats.open(rec_manifest) as r:
        f = r.reader()
        last = (len(r) - 1) // PER_TAR
        for t in range(last + 1):
            with webdataset.TarWriter(os.path.join(folder, f"part-{t:05d}.tar")) as w:
                for i in range(t * PER_TAR, min((t + 1) * PER_TAR, len(r))):
                    img, label, key, _ = f(i)
                    w.write({"__key__": f"{key:010d}", "jpg": bytes(img), "cls": int(label)})
    return os.path.join(folder, f"part-{{00000..{last:05d}}}.tar")


def index_tars(pattern: str, workers: int, engine: str = "local") -> str:
    """``stoker index`` of the tars ``pattern`` names, from scratch, on ``engine``; the
    manifest's path."""
    from stoker.pack.index import index_collection

    folder = os.path.dirname(pattern)
    for name in os.listdir(folder):
        if not name.endswith(".tar"):
            os.unlink(os.path.join(folder, name))
    out = os.path.join(folder, "set.stoker.json")
    index_collection(pattern, out, workers=workers, engine=engine, progress=False)
    return out


def start_ray(workers: int) -> bool:
    """A local Ray runtime of ``workers`` CPUs, started before any clock (``stoker index
    --engine ray`` uses a running one); False, said in one line, where Ray is not installed."""
    try:
        import ray
    except ImportError:
        print("index on Ray: not timed, Ray is not installed (pip install 'stoker[ray]')")
        return False
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return True


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def time_loaders(paths: dict[str, str], args: argparse.Namespace, rounds: int) -> list[dict]:
    """Each format's :func:`run_loader` figures, by round, over alternating rounds."""
    out: list[dict] = []
    for r in range(rounds):
        order = FORMATS if r % 2 == 0 else FORMATS[::-1]
        got: dict[str, dict[str, float]] = {}
        for fmt in order:
            _warm(paths[fmt])
            got[fmt] = x = run_loader(paths[fmt], args)
            print(
                f"... round {r}, {fmt}: first epoch {x['first']:.0f} images/s, steady "
                f"{x['steady']:.0f} images/s, {x['steady_cpu']:.0f} CPU us/image",
                flush=True,
            )
        out.append(got)
    return out


def time_converts(
    rec_manifest: str, src_files: list[str], work: str, args: argparse.Namespace, rounds: int
) -> dict[str, list[float]]:
    """Seconds of ``cp`` of the RecordIO files and of each convert, over alternating rounds."""
    from stoker.pack import convert

    conv: dict[str, list[float]] = {k: [] for k in ("cp", "tfrecord", "wds", "recordio")}
    conv["index"] = []
    if args.ray:
        conv["index-ray"] = []
    for r in range(rounds):
        order = list(conv) if r % 2 == 0 else list(conv)[::-1]
        for what in order:
            warm_page_cache(src_files[0])
            out = os.path.join(work, f"conv_{what}")
            t0 = time.perf_counter()
            if what == "cp":
                os.makedirs(out, exist_ok=True)
                subprocess.run(["cp", *src_files, out], check=True)
            elif what.startswith("index"):
                index_tars(args.pattern, args.workers, "ray" if what == "index-ray" else "local")
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


def print_loader_table(runs: list[dict], args: argparse.Namespace) -> None:
    med = statistics.median
    print()
    print(
        f"loader, {args.epochs} epochs of one loader; ratio = the format's rate / RecordIO's "
        "in the same round: median (min..max)"
    )
    print(
        f"{'format':<10} {'steady img/s':>12} {'steady ratio':>22} {'CPU us/img':>10}"
        f" {'1st epoch img/s':>15} {'1st epoch ratio':>22} {'CPU us/img':>10}"
    )
    for fmt in FORMATS:
        row = f"{fmt:<10}"
        for what, width in (("steady", 12), ("first", 15)):
            rates = [r[fmt][what] for r in runs]
            ratios = [r[fmt][what] / r["recordio"][what] for r in runs]
            cpu = med(r[fmt][what + "_cpu"] for r in runs)
            row += f" {med(rates):>{width}.0f} {_spread(ratios):>22} {cpu:>10.0f}"
        print(row)


def print_convert_table(conv: dict, nbytes: int, rounds: int, tars: int) -> None:
    print()
    print(
        f"convert of the RecordIO set ({nbytes / 1e6:.1f} MB), and index of the same samples "
        f"as {tars} tars, median of {rounds}"
    )
    print(f"{'method':<22} {'seconds':>8} {'MB/s':>8} {'shards/s':>9} {'/ cp':>7}")
    cp_s = statistics.median(conv["cp"])
    names = {
        "cp": "cp .rec .idx .crc32c",
        "index": "index, local pool",
        "index-ray": "index, Ray tasks",
    }
    for what, times in conv.items():
        dt = statistics.median(times)
        per_s = f"{tars / dt:>9.1f}" if what.startswith("index") else f"{'':>9}"
        name = names.get(what, f"convert -> {what}")
        print(f"{name:<22} {dt:>8.3f} {nbytes / 1e6 / dt:>8.1f} {per_s} {dt / cp_s:>7.1f}")
    print("(/ cp: the method's time divided by cp's; 1.0 = as fast as copying the bytes)")


def prepare(work: str, n_images: int, args: argparse.Namespace) -> tuple[dict, str]:
    """The four sets of the same images: ``({format: path the loader opens}, RecordIO
    manifest)``; each opened once, so its caches are built before any clock starts."""
    import stoker.formats
    from stoker import pack
    from stoker.pack import convert

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
    args.pattern = write_tars(rec_manifest, os.path.join(work, "tars"))
    sets["indexed"] = index_tars(args.pattern, args.workers)
    sets["lmdb"] = os.path.join(work, "set_lmdb")
    write_lmdb(rec_manifest, sets["lmdb"])
    paths = {f: (p + _MAIN[f] if f in _MAIN else p) for f, p in sets.items()}
    for p in paths.values():
        with stoker.formats.open(p) as r:
            r.labels()
    return paths, rec_manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--quick", action="store_true", help="600 images, 2 epochs, 1 round (a smoke run)"
    )
    ap.add_argument("--images", type=int, default=None, help="number of images (default 20000)")
    ap.add_argument("--size", type=int, default=64, help="image side (default 64)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per loader (default 4)")
    ap.add_argument("--rounds", type=int, default=None, help="alternations (default 5)")
    ap.add_argument("--workers", type=int, default=2, help="loader and convert workers")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n_images = args.images or (600 if args.quick else 20000)
    rounds = args.rounds or (1 if args.quick else 5)
    args.epochs = max(2, args.epochs or (2 if args.quick else 4))
    work = args.dir or tempfile.mkdtemp(prefix="stoker-bench-formats-")
    os.makedirs(work, exist_ok=True)
    print(f"command: {command_line()}")
    try:
        paths, rec_manifest = prepare(work, n_images, args)
        src_files = [
            rec_manifest.removesuffix(".stoker.json") + e for e in (".rec", ".idx", ".crc32c")
        ]
        nbytes = sum(os.path.getsize(p) for p in src_files)
        print(
            f"data: {n_images} JPEGs {args.size}x{args.size}, RecordIO {nbytes / 1e6:.1f} MB; "
            f"{args.workers} workers, batch {args.batch_size}, {args.epochs} epochs, "
            f"{rounds} rounds; {cpu_count()} cores, python {sys.version.split()[0]}",
            flush=True,
        )
        runs = time_loaders(paths, args, rounds)
        args.ray = start_ray(args.workers)
        conv = time_converts(rec_manifest, src_files, work, args, rounds)
        if args.ray:
            import ray

            ray.shutdown()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print_loader_table(runs, args)
    print_convert_table(conv, nbytes, rounds, -(-n_images // PER_TAR))
    return 0


if __name__ == "__main__":
    sys.exit(main())
