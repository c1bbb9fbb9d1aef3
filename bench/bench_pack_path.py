"""``stoker pack`` and ``stoker convert`` records per second, local pool and Ray, of an older
revision (``--old``, default ``main``: the current release) beside the working tree, in one run.

    python bench/bench_pack_path.py                 # 3 rounds, 3,000 images, 20,000-record convert
    python bench/bench_pack_path.py --quick         # 1 round, 600 images, 4,000 records
    python bench/bench_pack_path.py --no-ray        # the local pool only
    python bench/bench_pack_path.py --only convert  # the converts alone, no pack run between

The old revision is checked out into a temporary ``git worktree`` (removed at the end). Every
measurement runs in a fresh Python process whose ``PYTHONPATH`` starts with that revision's
``src`` (the child reports ``stoker.__file__``; a run that imported another tree stops the
bench). The data is made once by the old revision: a folder of ``--images`` 64x64 JPEGs
(10 classes), and a RecordIO set of ``--records`` records packed from a folder of that many.
Candidates, each with ``--workers`` processes (Ray: a Ray started in the child with that many
CPUs, its start and its workers' first start outside the clock, one task per shard of
``--shard-size``, default an eighth of the records):

  pack       the folder into RecordIO (one file, and in shards), TFRecord and WebDataset
  convert    the RecordIO set into TFRecord, WebDataset and RecordIO (one call each, no
             shards: what ``bench_formats.py`` times; and RecordIO in shards)

Wall time of the call (the page cache holds the inputs before each run), as records per
second; rounds alternate old-first and new-first. Printed: the median records/s of each
revision and the ratio new/old with its spread over rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import command_line, make_images, warm_page_cache
from bench_revisions import Revision, two_revisions

HERE = Path(__file__).resolve()
#: (run, engine, into, in shards); Ray's runs are always in shards
CANDIDATES = (
    ("pack", "local", "recordio", False),
    ("pack", "local", "recordio", True),
    ("pack", "local", "tfrecord", False),
    ("pack", "local", "wds", False),
    ("pack", "ray", "recordio", True),
    ("convert", "local", "tfrecord", False),
    ("convert", "local", "wds", False),
    ("convert", "local", "recordio", False),
    ("convert", "local", "recordio", True),
    ("convert", "ray", "tfrecord", True),
)


# ---------------------------------------------------------------------------- child runs
def child_data(args: argparse.Namespace) -> dict:
    import stoker

    work = Path(args.work)
    folder = make_images(work / f"images_{args.images}", n=args.images, size=64, seed=3)
    conv_src = make_images(work / f"images_{args.records}", n=args.records, size=32, seed=4)
    rec = work / f"set_{args.records}"
    if not (work / f"set_{args.records}.stoker.json").exists():
        stoker.pack(conv_src, rec, workers=args.workers, overwrite=True, progress=False)
    return {"folder": str(folder), "set": str(rec) + ".stoker.json"}


def child_run(args: argparse.Namespace) -> dict:
    """Records per second of one candidate (``args.what``, ``args.engine``, ``args.format``)."""
    import stoker

    out = tempfile.mkdtemp(prefix="out-", dir=args.work)
    ray = None
    try:
        if args.engine == "ray":
            import ray

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="WARNING")
            warm = ray.remote(num_cpus=1)(_noop)
            ray.get([warm.remote() for _ in range(args.workers)])
        common = {"workers": args.workers, "engine": args.engine, "progress": False}
        if args.sharded:
            n = args.images if args.what == "pack" else args.records
            common["shard_size"] = args.shard_size or max(1, n // 8)
        t0 = time.perf_counter()
        if args.what == "pack":
            r = stoker.pack(args.input, os.path.join(out, "o"), **common)
        else:
            r = stoker.convert(args.input, os.path.join(out, "o"), format=args.format, **common)
        wall = time.perf_counter() - t0
    finally:
        if ray is not None:
            ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)
    return {"records": r.written, "wall_s": wall, "rate": r.written / wall}


def _noop() -> int:
    import stoker.pack  # noqa: F401 - what a shard task imports

    return 0


def child(args: argparse.Namespace) -> int:
    import stoker

    print("STOKER " + stoker.__file__, flush=True)
    run = child_data if args.child == "data" else child_run
    print("RESULT " + json.dumps(run(args)), flush=True)
    return 0


def run_child(rev: Revision, args: argparse.Namespace, kind: str, **extra: str | bool) -> dict:
    cmd = [sys.executable, str(HERE), "--child", kind, "--work", str(args.work)]
    cmd += ["--images", str(args.images), "--records", str(args.records)]
    cmd += ["--workers", str(args.workers), "--shard-size", str(args.shard_size or 0)]
    for k, v in extra.items():
        if v is True:
            cmd.append(f"--{k}")
        elif v is not False:
            cmd += [f"--{k}", v]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(rev.src), env.get("PYTHONPATH")]))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=args.work)
    if out.returncode:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{rev.label} ({rev.name}): the {kind} run failed")
    lines = out.stdout.splitlines()
    used = Path(next(s for s in lines if s.startswith("STOKER "))[7:]).resolve()
    if not used.is_relative_to(rev.src.resolve()):
        raise SystemExit(f"{rev.label}: the child imported {used}, not stoker from {rev.src}")
    return json.loads(next(s for s in reversed(lines) if s.startswith("RESULT "))[7:])


# ---------------------------------------------------------------------------- rounds
def run_rounds(args: argparse.Namespace, old: Revision, new: Revision, data: dict) -> dict:
    cands = [c for c in CANDIDATES if (args.ray or c[1] != "ray") and c[0] in args.only]
    results: dict[tuple, list[dict[str, float]]] = {c: [] for c in cands}
    for i in range(args.rounds):
        order = (old, new) if i % 2 == 0 else (new, old)
        for c in cands:
            what, engine, fmt, sharded = c
            src = data["folder"] if what == "pack" else data["set"]
            got = {}
            for rev in order:
                warm_page_cache(src if what == "pack" else src[: -len(".stoker.json")] + ".rec")
                r = run_child(
                    rev, args, "run", what=what, engine=engine, format=fmt, input=src,
                    sharded=sharded,
                )  # fmt: skip
                got[rev.label] = r["rate"]
            results[c].append(got)
            into = fmt + (" shards" if sharded else "")
            print(
                f"round {i + 1} {what:<7} {engine:<5} {into:<15} old {got['old']:9,.0f}  "
                f"new {got['new']:9,.0f} records/s  new/old {got['new'] / got['old']:.2f}",
                flush=True,
            )
    return results


def report(args: argparse.Namespace, results: dict, old: Revision, new: Revision) -> None:
    med = statistics.median
    print()
    print(f"command: {command_line()}")
    print(f"old: {old.name} = {old.commit}; new: {new.name} = {new.commit}")
    print(
        f"pack: {args.images} 64x64 JPEGs; convert: a RecordIO set of {args.records} records; "
        f"{args.workers} workers; in shards: {args.shard_size or 'an eighth of the records'} "
        f"a shard; {args.rounds} round(s)"
    )
    print("| run | engine | into | old records/s | new records/s | new/old | min..max |")
    print("|---|---|---|---:|---:|---:|---|")
    for (what, engine, fmt, sharded), rows in results.items():
        ratios = [r["new"] / r["old"] for r in rows]
        into = fmt + (" shards" if sharded else "")
        print(
            f"| {what} | {engine} | {into} | {med(r['old'] for r in rows):,.0f} | "
            f"{med(r['new'] for r in rows):,.0f} | {med(ratios):.2f} | "
            f"{min(ratios):.2f}..{max(ratios):.2f} |"
        )
    print("(wall time of the call; medians over rounds; new/old: median of per-round ratios)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--old", default="main", help="the revision to compare (default main)")
    ap.add_argument("--new", default=None, help="a revision (default: the working tree)")
    ap.add_argument("--quick", action="store_true", help="less data, 1 round (a smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="alternations (default 3)")
    ap.add_argument("--images", type=int, default=None, help="images packed (3,000; quick 600)")
    ap.add_argument("--records", type=int, default=None, help="records converted (20,000)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument(
        "--shard-size", type=int, default=0, help="records a shard (default: an eighth)"
    )
    ap.add_argument("--no-ray", dest="ray", action="store_false", help="the local pool only")
    ap.add_argument(
        "--only",
        choices=("pack", "convert"),
        default=None,
        help="time only the packs or only the converts (default both)",
    )
    ap.add_argument("--work", default=None, help="data folder (default: a temporary one)")
    ap.add_argument("--child", choices=("data", "run"), help=argparse.SUPPRESS)
    ap.add_argument("--what", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--format", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.only = ("pack", "convert") if args.only is None else (args.only,)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.images = args.images or (600 if args.quick else 3_000)
    args.records = args.records or (4_000 if args.quick else 20_000)
    return args


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    if args.ray and importlib.util.find_spec("ray") is None:
        print("# Ray is not installed: the local pool only", flush=True)
        args.ray = False
    with two_revisions(args, "pack-path") as (old, new):
        t = time.perf_counter()
        data = run_child(old, args, "data")
        print(f"# data ready in {time.perf_counter() - t:.0f} s: {data}", flush=True)
        results = run_rounds(args, old, new, data)
        report(args, results, old, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
