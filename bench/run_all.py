"""`make bench`: runs every bench/bench_*.py in order; each prints its own table.

Pass arguments through BENCH_ARGS, e.g. `make bench BENCH_ARGS="--only loader --quick"`.
Each benchmark measures its candidates side by side in one run and reports ratios
(bench_formats.py: the loader on each format beside RecordIO, and `stoker convert` beside
`cp`; `--only formats`; bench_engines.py: `stoker pack --engine ray` beside the local pool,
1 and 2 workers each; `--only engines`; bench_pack_path.py: `stoker pack` and `stoker convert`
records per second, local pool and Ray, an older revision (default main, the current release)
beside the working tree, 1,500 images and 8,000 records here; `--only pack_path`).
bench_bigfile.py: shuffled reads of a .rec twice the page cache it may use, without and
with access hints, beside the same file warm (`--only bigfile`).
bench_loader_engines.py: the loader's portable engine beside its Linux engine on the same
work (`--only loader_engines`).
bench_remote_http.py: TFRecord and WebDataset over `http://` from nginx behind a proxy adding
0 and 25 ms per request, `shuffle="shards"`, a cache of 0.45 x the set, beside local disk
(`--only remote_http`; says it is skipped when nginx is not installed).
bench_policies.py: RandAugment, TrivialAugmentWide and AutoAugment per image beside the PIL
reference (bench/_pil_policies.py), each op beside PIL's call, beside the decode, and the loader
with RandAugment beside a PIL DataLoader (`--only policies`).
bench_revisions.py (old revision against new) runs only when asked for, with `--old REV`:
`make bench BENCH_ARGS="--only revisions --old HEAD~3"`; `--costs loader` measures only the
RecordIO loader path's CPU us per image, new/old, against its 1.03 bound:
`make bench BENCH_ARGS="--only revisions --old 7e6a25c --costs loader"`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: what a bench is given beside ``--quick`` in a full run: a size that keeps ``make bench`` short
SIZES = {"bench_pack_path": ["--images", "1500", "--records", "8000"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--only", action="append", default=[], help="run only bench_NAME.py (repeatable)"
    )
    ap.add_argument("--quick", action="store_true", help="smaller data, for a smoke run")
    ap.add_argument(
        "--old", metavar="REV", help="also run bench_revisions.py against this revision"
    )
    ap.add_argument(
        "--costs", help="bench_revisions.py's costs (loader,pack; default both)", default=None
    )
    args = ap.parse_args()
    benches = sorted(HERE.glob("bench_*.py"))
    if not args.old:  # it needs a revision to compare against
        benches = [b for b in benches if b.stem != "bench_revisions"]
    if args.only:
        benches = [b for b in benches if b.stem[len("bench_") :] in args.only]
    failed = []
    for b in benches:
        print(f"\n######## {b.stem} ########", flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(b)] + (["--quick"] if args.quick else SIZES.get(b.stem, []))
        if b.stem == "bench_revisions":
            cmd += ["--old", args.old] + (["--costs", args.costs] if args.costs else [])
        rc = subprocess.call(cmd)
        print(f"######## {b.stem}: exit {rc}, {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(b.stem)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
