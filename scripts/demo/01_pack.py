"""Demo stage 01: make sample data, pack it, inspect and verify the result.

Usage: python scripts/demo/01_pack.py WORKDIR   (writes WORKDIR/images and WORKDIR/train.*)
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    work = sys.argv[1] if len(sys.argv) > 1 else "demo-data"
    os.makedirs(work, exist_ok=True)
    from stoker.cli import main as stoker
    from stoker.pack import make_sample_data

    images = os.path.join(work, "images")
    t0 = time.perf_counter()
    make_sample_data(images, classes=10, per_class=200, size=112, seed=0)
    dt = time.perf_counter() - t0
    print(f"sample data: 2000 JPEGs (10 classes x 200, 112x112) in {images} ({dt:.1f} s)")

    out = os.path.join(work, "train")
    print(f"\n$ stoker pack {images} {out} --overwrite")
    rc = stoker(["pack", images, out, "--overwrite"])
    if rc:
        return rc
    print(f"\n$ stoker inspect {out}.stoker.json")
    rc = stoker(["inspect", out + ".stoker.json"])
    if rc:
        return rc
    print(f"\n$ stoker verify {out}.stoker.json --decode")
    t0 = time.perf_counter()
    rc = stoker(["verify", out + ".stoker.json", "--decode", "--quiet"])
    dt = time.perf_counter() - t0
    print(f"verified and decoded every record in {dt:.1f} s: {'OK' if rc == 0 else 'PROBLEMS'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
