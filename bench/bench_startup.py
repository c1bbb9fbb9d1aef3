"""Where the time between ``Loader(...)`` and its first batch goes, in a fresh process.

Each run is a new Python process that makes a ``Loader`` over the bench's 112 px ``.rec``
(resize 128 -> crop 112 -> flip -> float32 NCHW normalised, batch 256, ``--workers`` workers)
and takes its first batch as a user's script does: ``import stoker`` and the transforms before
the clock starts, then ``stoker.Loader(...)``, whose first use imports the loader's modules.
``--imagenet``: over 500x375 JPEGs as dense as ImageNet's (``bench_realsize.py``'s),
RandomResizedCrop(224) -> flip -> float32, batch 64. ``_startup_probe.py`` notes when each
step of the main process, the worker server and the workers starts and ends (one monotonic
clock for all processes). Printed: each step's start and length in ms after ``Loader(`` was
called, medians over the runs with the spread of the length, and the first batch's arrival.

    python bench/bench_startup.py            # 20,000 images, 7 runs
    python bench/bench_startup.py --quick    # 600 images, 3 runs
    python bench/bench_startup.py --imagenet --images 2000 [--engine portable]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_parser, command_line, make_data, median_range

HERE = Path(__file__).resolve().parent

CHILD = """
import os, sys, time, json
t_import = time.perf_counter()
sys.path.insert(0, {bench!r})
import _startup_probe
import stoker
from _common import stoker_transforms
transforms = stoker_transforms({kind!r}, normalize={norm})
imported = time.perf_counter()
t0 = time.perf_counter()
# what `stoker.Loader` imports on first use, wrapped by the probe as it is imported
_startup_probe.install_main()
_startup_probe.note("main: import the loader (stoker.Loader)", t0, time.perf_counter())
stoker.loader._pool._PRELOAD.append("_startup_probe")
loader = stoker.Loader({rec!r}, batch_size={batch}, transforms=transforms, layout="NCHW",
                       shuffle=True, seed=0, workers={workers}, engine={engine!r})
it = iter(loader)
batch = next(it)
t1 = time.perf_counter()
pids = loader.worker_pids()
loader.close()
print(json.dumps({{"t0": t0, "first": t1 - t0, "import": imported - t_import, "pids": pids}}))
"""


def one_run(
    rec: str,
    workers: int,
    normalize: bool,
    src: str | None = None,
    pycache: str | None = None,
    *,
    imagenet: bool = False,
    engine: str | None = None,
) -> dict:
    """One fresh process: its first batch and the probe's steps, relative to ``Loader(``;
    stoker imported from ``src`` (a source tree's ``src`` folder) when given; ``imagenet``:
    RandomResizedCrop(224), batch 64 (else the 112 px chain, batch 256). ``pycache``: a
    folder for compiled bytecode (``PYTHONPYCACHEPREFIX``), written there even where the
    environment says not to, so that modules load as from an installed package; ``None``
    leaves the environment as it is."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "steps.txt")
        kind, batch = ("224", 64) if imagenet else ("112", 256)
        code = CHILD.format(
            bench=str(HERE),
            rec=rec,
            norm=normalize,
            workers=workers,
            batch=batch,
            kind=kind,
            engine=engine,
        )
        env = dict(os.environ, STOKER_STARTUP_PROBE=probe)
        if pycache is not None:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pycache
        path = [str(HERE), src, env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        # the measured process must not install the worker-side wrappers on itself
        code = code.replace(
            "import _startup_probe\n",
            "os.environ['STOKER_STARTUP_PROBE_MAIN'] = str(os.getpid())\nimport _startup_probe\n",
            1,
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        steps = []
        with open(probe) as f:
            for line in f:
                name, pid, start, end = line.rsplit(" ", 3)
                steps.append((name, int(pid), float(start) - res["t0"], float(end) - res["t0"]))
    res["steps"] = steps
    return res


def label_steps(run: dict) -> dict[str, tuple[float, float]]:
    """Step name (workers numbered in order of start, a repeated main step numbered) ->
    (start, end) in ms."""
    worker_of = {pid: i for i, pid in enumerate(run["pids"])}
    out: dict[str, tuple[float, float]] = {}
    for name, pid, start, end in sorted(run["steps"], key=lambda s: s[2]):
        if name.startswith("worker:") and pid in worker_of:
            name = f"worker {worker_of[pid]}:{name[len('worker:') :]}"
        key, k = name, 2
        while key in out:
            key, k = f"{name} ({k})", k + 1
        out[key] = (1000 * start, 1000 * end)
    return out


def report(runs: list[dict]) -> None:
    labelled = [label_steps(r) for r in runs]
    names: list[str] = []
    for lab in labelled:
        for n in sorted(lab, key=lambda n: lab[n][0]):
            if n not in names:
                names.append(n)
    order = sorted(
        names, key=lambda n: median_range([lab[n][0] for lab in labelled if n in lab])[0]
    )
    print("| step | starts at (ms) | takes (ms), median (min..max) | runs |")
    print("|---|---:|---:|---:|")
    for n in order:
        got = [lab[n] for lab in labelled if n in lab]
        start = median_range([s for s, _ in got])[0]
        med, lo, hi = median_range([e - s for s, e in got])
        print(f"| {n} | {start:.0f} | {med:.0f} ({lo:.0f}..{hi:.0f}) | {len(got)} |")
    first, lo, hi = median_range([1000 * r["first"] for r in runs])
    print(f"| **first batch** | | **{first:.0f}** ({lo:.0f}..{hi:.0f}) | {len(runs)} |")
    imp = median_range([1000 * r["import"] for r in runs])[0]
    print(f"\n(before Loader(): importing stoker and the transforms, {imp:.0f} ms)")


def bytecode_cache(work: Path, src: str | None, off: bool) -> str | None:
    """A folder of compiled bytecode for the runs of one source tree (``PYTHONPYCACHEPREFIX``),
    so that a fresh process loads stoker as from an installed package (pip compiles what it
    installs) whatever ``PYTHONDONTWRITEBYTECODE`` says; ``None`` (``--no-bytecode``): the
    environment as it is."""
    if off:
        return None
    name = "this" if src is None else hashlib.sha1(os.path.abspath(src).encode()).hexdigest()[:12]
    return str(work / "pycache" / name)


def imagenet_rec(work: Path, n: int) -> str:
    """``bench_realsize.py``'s ``n`` ImageNet-like JPEGs packed into a .rec; reused when there."""
    from bench_realsize import imagenet_like_set

    from stoker import pack

    rec = work / f"imagenet_like_{n}.rec"
    if not rec.exists():
        pack(
            imagenet_like_set(work / f"images_imagenet_{n}", n), rec, overwrite=True, progress=False
        )
    return str(rec)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = bench_parser(__doc__, "600 images, 3 runs")
    ap.add_argument("--images", type=int, default=None, help="images in the .rec (20,000)")
    ap.add_argument("--runs", type=int, default=None, help="fresh processes (7; --quick: 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--uint8", action="store_true", help="uint8 NCHW output instead of float32")
    ap.add_argument(
        "--imagenet",
        action="store_true",
        help="500x375 JPEGs as dense as ImageNet's, RandomResizedCrop(224), batch 64",
    )
    ap.add_argument("--engine", default=None, choices=("linux", "portable"))
    ap.add_argument("--work", default=None, help="data folder (default: a temporary one)")
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="leave bytecode caching to the environment (with PYTHONDONTWRITEBYTECODE set, "
        "every fresh process compiles stoker's modules from source)",
    )
    ap.add_argument(
        "--against",
        metavar="SRC",
        default=None,
        help="also time stoker from this source folder (another revision's src/), runs "
        "alternating with this one's",
    )
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    n = args.images or (600 if args.quick else 20_000)
    runs = args.runs or (3 if args.quick else 7)
    work = Path(args.work or os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    rec = (
        imagenet_rec(work, n)
        if args.imagenet
        else make_data(work, n=n, size=112, name=f"s112_{n}")[1]
    )
    print(f"command: {command_line()}")
    what = "500x375 ImageNet-like, batch 64" if args.imagenet else "112x112, batch 256"
    print(f"# {n} images {what}, {args.workers} workers, {runs} fresh processes")
    sides = [("this tree", None)] + ([(args.against, args.against)] if args.against else [])
    caches = {name: bytecode_cache(work, src, args.no_bytecode) for name, src in sides}
    how, kw = (args.workers, not args.uint8), {"imagenet": args.imagenet, "engine": args.engine}
    for name, src in sides:  # compiles into the cache: not counted
        one_run(rec, *how, src, caches[name], **kw)
    got: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for i in range(runs):
        for name, src in sides if i % 2 == 0 else sides[::-1]:
            t = time.perf_counter()
            got[name].append(one_run(rec, *how, src, caches[name], **kw))
            print(
                f"... run {i + 1} ({name}): first batch {got[name][-1]['first']:.3f} s "
                f"({time.perf_counter() - t:.1f} s in all)",
                flush=True,
            )
    for name, _ in sides:
        print(f"\n## {name}")
        report(got[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
