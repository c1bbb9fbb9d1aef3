"""The portable loader engine beside the Linux one, on the same work in one run.

Makes sample JPEGs (112 px, 10 classes) and packs them into RecordIO once; then, in rounds
whose candidate order alternates (a busy spell on a shared machine hurts both alike), one
``stoker.Loader`` per engine (``engine="linux"``: fork server and memfd ring;
``engine="portable"``: spawn and a named ``multiprocessing.shared_memory`` ring) runs
``--epochs`` shuffled epochs of Resize(128, shorter side) -> RandomCrop(112) -> HorizontalFlip,
as uint8 and as float32 (the same chain ending in Normalize), ``--workers`` workers. Per
engine, dtype and round:

- first batch: seconds from constructing the loader to its first batch (each engine starts
  its workers: the Linux one from its warm fork server, the portable one from fresh
  interpreters);
- whole epoch: images/s of the first epoch, start-up included (what a short job sees);
- steady: images/s of the later epochs, workers warm (every epoch of a run after its first).

The table gives the medians (min..max over the rounds) and the portable engine's ratio to the
Linux engine's of the same round (its aim: at least 0.85 of the steady rate). Each round also
times what every spawned worker pays before its first sample: a fresh interpreter that imports
the worker's modules (``stoker.loader._worker``, and ``cv2`` for the resize), the floor of the
portable engine's first batch.

Last, what a training script's own imports cost the portable engine's first batch: a script
that imports torch at its top starts a portable loader (uint8, 2 workers) whose workers skip
the script (nothing they need is defined there) and, alternating, one whose transforms include
a step defined in the script (so each spawned worker must import the script, torch with it).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_parser, command_line, cpu_count, make_data, stoker_transforms

ENGINES = ("linux", "portable")
DTYPES = ("uint8", "float32")


def run(rec: str, engine: str, dtype: str, args) -> dict[str, float]:
    """One loader on ``engine``: first batch (s), first epoch and steady images/s."""
    from stoker import Loader

    t0 = time.perf_counter()
    counts: list[int] = []
    first = t1 = float("nan")
    with Loader(
        rec,
        batch_size=args.batch_size,
        transforms=stoker_transforms("112", normalize=dtype == "float32"),
        shuffle=True,
        seed=0,
        workers=args.workers,
        engine=engine,
    ) as loader:
        for _epoch in range(args.epochs):
            n = 0
            for b in loader:
                if not counts and not n:
                    first = time.perf_counter() - t0
                n += len(b.images)
            counts.append(n)
            if len(counts) == 1:
                t1 = time.perf_counter()
        t2 = time.perf_counter()
    later = sum(counts[1:])
    return {
        "first_batch": first,
        "epoch": counts[0] / (t1 - t0),
        "steady": later / (t2 - t1) if later else float("nan"),
    }


WORKER_IMPORTS = "import stoker.loader._worker, cv2"


def worker_start() -> float:
    """Seconds a fresh interpreter takes to import what a spawned worker needs, and exit."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", WORKER_IMPORTS], check=True)
    return time.perf_counter() - t0


SCRIPT = """
import json, sys, time
import torch  # a training script's top-level import
from stoker.transforms import Transform

class Here(Transform):  # defined in the script: a worker must import the script to unpickle it
    def __call__(self, img, rng):
        return img

    def output_spec(self, spec):
        return spec

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[3])
    from _common import stoker_transforms
    from stoker import Loader
    from stoker.transforms import Compose

    base = stoker_transforms("112", normalize=False)
    cases = {"skip": base, "import": Compose([*base.transforms, Here()])}
    out = {"skip": [], "import": []}
    for r in range(int(sys.argv[2])):
        for name in ("skip", "import") if r % 2 == 0 else ("import", "skip"):
            t0 = time.perf_counter()
            with Loader(sys.argv[1], batch_size=64, transforms=cases[name], shuffle=True,
                        seed=0, workers=2, engine="portable") as loader:
                next(iter(loader))
                out[name].append(time.perf_counter() - t0)
    print(json.dumps(out))
"""


def script_first_batch(rec: str, work: Path, rounds: int) -> dict[str, list[float]] | None:
    """First-batch seconds of portable loaders started by a script that imports torch:
    ``skip`` (workers never import the script) and ``import`` (they must); None without
    torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    script = work / "train_script.py"
    script.write_text(SCRIPT)
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, str(script), rec, str(rounds), here],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def _med(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}..{max(values):{fmt}})"


def table(runs: list[dict], starts: list[float]) -> None:
    print(
        f"\n{'dtype':<8} {'engine':<9} {'first batch s':>22} {'whole epoch img/s':>24} "
        f"{'steady img/s':>24} {'steady / linux':>22} {'epoch / linux':>22}"
    )
    for dtype in DTYPES:
        for engine in ENGINES:
            got = [r[(engine, dtype)] for r in runs]
            ratios = [r[(engine, dtype)]["steady"] / r[("linux", dtype)]["steady"] for r in runs]
            whole = [r[(engine, dtype)]["epoch"] / r[("linux", dtype)]["epoch"] for r in runs]
            print(
                f"{dtype:<8} {engine:<9} {_med([g['first_batch'] for g in got], '.2f'):>22} "
                f"{_med([g['epoch'] for g in got], '.0f'):>24} "
                f"{_med([g['steady'] for g in got], '.0f'):>24} "
                f"{_med(ratios, '.3f'):>22} {_med(whole, '.3f'):>22}"
            )
    print("(median (min..max) over the rounds; ratios: portable / linux in the same round)")
    print(
        f"a fresh interpreter that runs `{WORKER_IMPORTS}`: {_med(starts, '.2f')} s "
        "(each spawned worker pays it before its first sample)"
    )


def parse_args(argv: list[str] | None = None):
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = bench_parser(__doc__, "600 images, 2 epochs, 1 round (a smoke run)")
    ap.add_argument("--images", type=int, default=None, help="number of images (default 20000)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per loader (default 3)")
    ap.add_argument("--rounds", type=int, default=None, help="alternations (default 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.images or (600 if args.quick else 20000)
    rounds = args.rounds or (1 if args.quick else 3)
    args.epochs = max(2, args.epochs or (2 if args.quick else 3))
    work = Path(args.dir or tempfile.mkdtemp(prefix="stoker-bench-loader-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"command: {command_line()}")
    try:
        _images, rec = make_data(work, n=n, size=112, name=f"engines{n}")
        print(
            f"data: {n} JPEGs 112x112 in RecordIO; {args.workers} workers, batch "
            f"{args.batch_size}, {args.epochs} epochs, {rounds} rounds; {cpu_count()} cores, "
            f"python {sys.version.split()[0]}",
            flush=True,
        )
        runs: list[dict] = []
        starts: list[float] = []
        for r in range(rounds):
            starts.append(worker_start())
            got = {}
            for dtype in DTYPES:
                for engine in ENGINES if r % 2 == 0 else ENGINES[::-1]:
                    got[(engine, dtype)] = x = run(rec, engine, dtype, args)
                    print(
                        f"... round {r}, {dtype}, {engine}: first batch {x['first_batch']:.2f} s, "
                        f"epoch {x['epoch']:.0f} images/s, steady {x['steady']:.0f} images/s",
                        flush=True,
                    )
            runs.append(got)
        table(runs, starts)
        scripted = script_first_batch(rec, work, rounds)
        if scripted is None:
            print("(torch is not installed: the script's first batch is not measured)")
        else:
            print(
                "a script that imports torch at its top, portable engine, first batch s: "
                f"workers that skip the script {_med(scripted['skip'], '.2f')}, workers "
                f"that import it {_med(scripted['import'], '.2f')}"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
