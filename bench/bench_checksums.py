"""The loader's CPU cost of checking CRC32C: one Loader epoch over the same .rec with
``RecordSource(path, checksums=True)`` and ``checksums=False``, alternating, in 9 pairs; CPU
microseconds per delivered image of the whole process tree, and the median on/off ratio.
Then the same for a WebDataset set of the same images: its manifest, which names each tar's
``.crc32c`` side-car (checked on every read), against a copy of that manifest without them.

    python bench/bench_checksums.py [REC]   # a .rec with its .crc32c (e.g. from bench_revisions)
    python bench/bench_checksums.py --quick # 600 images, 2 pairs: a smoke run

Without ``REC`` it packs 2,000 sample JPEGs of 112x112 (``--quick``: 600) into a .rec (and a
WebDataset set) of its own in a temporary folder (reused by name, as ``bench_loader.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import command_line, cpu_between, make_data, tree_cpu


def run(checksums: bool, rec: str) -> float:
    from stoker.loader import RecordSource

    return epoch_cpu(RecordSource(rec, checksums=checksums))


def wds_sets(images: str, work: Path, name: str) -> dict[bool, str]:
    """The WebDataset set of ``images`` (packed once): its manifest, and a copy of it whose
    entries name no ``.crc32c`` (the same tars, read unchecked)."""
    from stoker import pack

    on = work / f"{name}_wds.stoker.json"
    if not on.exists():
        pack(images, work / f"{name}_wds", format="wds", overwrite=True, progress=False)
    m = json.loads(on.read_text())
    for s in m["shards"]:
        s.get("files", {}).pop("crc", None)  # the per-sample side-car's role
        s.pop("crc32c", None)  # the same, in a version-1 manifest packed before
    off = work / f"{name}_wds_unchecked.stoker.json"
    off.write_text(json.dumps(m))
    return {True: str(on), False: str(off)}


def epoch_cpu(source) -> float:
    """CPU microseconds of the process tree per image delivered by one epoch over ``source``."""
    import stoker
    from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

    t = Compose([Resize(128, shorter_side=True), RandomCrop(112), HorizontalFlip()])
    b = tree_cpu()
    n = 0
    with stoker.Loader(
        source,
        batch_size=256,
        transforms=t,
        shuffle=True,
        seed=0,
        workers=2,
    ) as ld:
        for x, _y in ld:
            n += len(x)
        a = tree_cpu()
    return cpu_between(b, a) / n * 1e6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("rec", nargs="?", help="a .rec with its .crc32c (default: one made here)")
    ap.add_argument("--quick", action="store_true", help="600 images, 2 pairs: a smoke run")
    ap.add_argument("--pairs", type=int, default=None, help="on/off pairs (default 9; quick 2)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pairs = args.pairs or (2 if args.quick else 9)
    rec, wds = args.rec, None
    if rec is None:
        n = 600 if args.quick else 2_000
        work = Path(tempfile.gettempdir()) / "stoker-bench-checksums"
        images, rec = make_data(work, n=n, size=112, name=f"s112_{n}")
        wds = wds_sets(images, work, f"s112_{n}")
    if not os.path.exists(os.path.splitext(rec)[0] + ".crc32c"):
        raise SystemExit(f"{rec}: no .crc32c beside it; the checksum check would be off")
    print(f"command: {command_line()}\n.rec: {rec}", flush=True)
    pairs_of("RecordIO", pairs, lambda c: run(c, rec))
    if wds is not None:
        print(f"WebDataset: {wds[True]} against {wds[False]}", flush=True)
        pairs_of("WebDataset", pairs, lambda c: epoch_cpu(wds[c]))
    return 0


def pairs_of(what: str, pairs: int, run_one) -> None:
    """``pairs`` alternating on/off epochs; each pair's and the median on/off CPU ratio."""
    ratios = []
    for i in range(pairs):
        order = (True, False) if i % 2 else (False, True)
        r = {c: run_one(c) for c in order}
        ratios.append(r[True] / r[False])
        print(
            f"{what} pair {i + 1}: crc on {r[True]:.1f} off {r[False]:.1f} us/image  "
            f"on/off {ratios[-1]:.3f}",
            flush=True,
        )
    med = statistics.median(ratios)
    print(f"{what}: median on/off {med:.3f} ({min(ratios):.3f}..{max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
