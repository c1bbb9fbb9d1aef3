"""Paired cost check of two revisions of stoker: CPU time per image of the loader and of
``stoker pack``, old revision against new, in alternating pairs.

    python bench/bench_revisions.py --old HEAD~3                    # 5 pairs of full-size runs
    python bench/bench_revisions.py --old HEAD~3 --quick --pairs 1  # a smoke run
    python bench/bench_revisions.py --old 7e6a25c --costs loader    # the RecordIO loader only

The old revision (``--old``, required) is checked out into a temporary ``git worktree``; the
new one is the working tree as it is (uncommitted changes included) unless ``--new`` names a
revision, which gets a worktree too. Worktrees are removed at the end.

Each measurement runs in a fresh Python process whose ``PYTHONPATH`` starts with that
revision's ``src`` (ahead of the editable install in the venv); the child reports
``stoker.__file__`` and the run stops if it is not the tree asked for. Two costs:

  loader  one ``stoker.Loader`` over ``--epochs`` epochs of a .rec of ``--images`` 112x112
          JPEGs (20,000; ``--quick``: 2,000): batch 256, Resize(128, shorter side) ->
          RandomCrop(112) -> HorizontalFlip, uint8 NHWC, shuffled, 2 workers. CPU time of the
          whole process tree (the main process, the worker server and the workers) from just
          before the loader is built to the end of its last epoch, before ``close()`` while
          the workers are alive to be read, divided by the images delivered.
  pack    ``stoker pack SRC OUT --workers 2 --overwrite --quiet`` (the CLI's ``main`` called in
          the child) of a folder of ``--pack-images`` 112x112 JPEGs (3,000; ``--quick``: 600)
          into a temporary folder: CPU time of the process tree over the call, per image.

CPU time, not wall time: on a shared machine a busy neighbour stretches wall time but barely
the CPU a run needs. The data is made once, up front, by the old revision, so both read the
same files. Sources are byte-compiled before the first pair, so no run pays for it. Pair ``i``
runs old then new when ``i`` is even and new then old when odd, so a slow drift of the
machine cancels; the page cache holds the inputs before every run (read just before it, in a
separate process); no memory sampler runs. Printed: each pair's old and new CPU us/image and
their ratio new/old; then the medians over pairs, with the spread (min..max) of the per-pair
ratios, and the command; and whether the loader's median new/old is within
``--loader-limit`` (default 1.03: issue 28's bound on the RecordIO loader path).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _common import command_line, cpu_between, make_data, make_images, tree_cpu, warm_page_cache

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
COSTS = ("loader", "pack")


# ---------------------------------------------------------------------------- child runs
def child_data(args: argparse.Namespace) -> dict:
    """Make the .rec the loader reads and the folder pack packs (with this child's stoker)."""
    work = Path(args.work)
    _, rec = make_data(work, n=args.images, size=112, name=f"s112_{args.images}")
    folder = make_images(work / f"pack_{args.pack_images}", n=args.pack_images, size=112, seed=2)
    return {"rec": rec, "folder": str(folder)}


def child_loader(args: argparse.Namespace) -> dict:
    """CPU of the process tree per image delivered over ``args.epochs`` epochs of a loader."""
    from _common import stoker_transforms

    import stoker

    transforms = stoker_transforms("112", normalize=False)
    t0, before = time.perf_counter(), tree_cpu()
    loader = stoker.Loader(
        args.rec,
        batch_size=256,
        transforms=transforms,
        layout="NHWC",
        shuffle=True,
        seed=0,
        workers=args.workers,
    )
    n = 0
    with loader:
        for _ in range(args.epochs):
            for b in loader:
                n += len(b.images)
        cpu, wall = cpu_between(before, tree_cpu()), time.perf_counter() - t0
    return {"images": n, "cpu_us": 1e6 * cpu / max(n, 1), "wall_s": wall}


def child_pack(args: argparse.Namespace) -> dict:
    """CPU of the process tree per image of ``stoker pack`` of ``args.folder``."""
    from stoker.cli import main as stoker_cli

    out = tempfile.mkdtemp(prefix="pack-", dir=args.work)
    try:
        argv = ["pack", args.folder, os.path.join(out, "packed")]
        argv += ["--workers", str(args.workers), "--overwrite", "--quiet"]
        t0, before = time.perf_counter(), tree_cpu()
        rc = stoker_cli(argv)
        cpu, wall = cpu_between(before, tree_cpu()), time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if rc:
        raise SystemExit(f"stoker pack exited {rc}")
    n = args.pack_images
    return {"images": n, "cpu_us": 1e6 * cpu / n, "wall_s": wall}


def child(args: argparse.Namespace) -> int:
    import stoker

    print("STOKER " + stoker.__file__, flush=True)
    run = {"data": child_data, "loader": child_loader, "pack": child_pack}[args.child]
    print("RESULT " + json.dumps(run(args)), flush=True)
    return 0


# ---------------------------------------------------------------------------- revisions
@dataclass
class Revision:
    label: str  # "old" or "new"
    name: str  # as given, or "working tree"
    commit: str  # what it resolves to ("HEAD" + changes for the working tree)
    src: Path

    def run(self, what: str, args: argparse.Namespace, **extra: str) -> dict:
        """One child run of ``what`` with this revision's stoker first on the path."""
        cmd = [sys.executable, str(HERE), "--child", what, "--work", str(args.work)]
        cmd += ["--images", str(args.images), "--pack-images", str(args.pack_images)]
        cmd += ["--epochs", str(args.epochs), "--workers", str(args.workers)]
        for k, v in extra.items():
            cmd += [f"--{k}", v]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.src), env.get("PYTHONPATH")]))
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=args.work)
        if out.returncode:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit(f"{self.label} ({self.name}): the {what} run failed")
        lines = out.stdout.splitlines()
        used = Path(next(s for s in lines if s.startswith("STOKER "))[7:]).resolve()
        if not used.is_relative_to(self.src.resolve()):
            raise SystemExit(f"{self.label}: the child imported {used}, not stoker from {self.src}")
        return json.loads(next(s for s in reversed(lines) if s.startswith("RESULT "))[7:])


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def checkout(label: str, rev: str | None, into: Path, worktrees: list[Path]) -> Revision:
    """``rev`` in a new detached worktree under ``into``; ``None``: the working tree."""
    if rev is None:
        head = _git("rev-parse", "--short=12", "HEAD")
        dirty = " + uncommitted changes" if _git("status", "--porcelain", "--", "src") else ""
        return Revision(label, "working tree", f"{head}{dirty}", REPO / "src")
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = into / label
    _git("worktree", "add", "--detach", str(path), commit)
    worktrees.append(path)
    return Revision(label, rev, commit[:12], path / "src")


def byte_compile(rev: Revision) -> None:
    """Write every module's .pyc now, so that no measured run compiles sources."""
    cmd = [sys.executable, "-m", "compileall", "-q", str(rev.src)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------------- pairs
def run_pairs(args: argparse.Namespace, old: Revision, new: Revision, data: dict) -> dict:
    """``args.pairs`` pairs of runs of each cost; pair i runs old first when i is even."""
    inputs = {"loader": data["rec"], "pack": data["folder"]}
    extra = {"loader": {"rec": data["rec"]}, "pack": {"folder": data["folder"]}}
    results: dict[str, list[dict[str, dict]]] = {c: [] for c in args.costs}
    for i in range(args.pairs):
        order = (old, new) if i % 2 == 0 else (new, old)
        for cost in args.costs:
            pair: dict[str, dict] = {}
            for rev in order:
                warm_page_cache(inputs[cost])
                pair[rev.label] = rev.run(cost, args, **extra[cost])
            results[cost].append(pair)
            print(f"pair {i + 1} ({order[0].label} first) {cost:<6} {_pair_line(pair)}", flush=True)
    return results


def _pair_line(pair: dict[str, dict]) -> str:
    o, n = pair["old"], pair["new"]
    return (
        f"old {o['cpu_us']:8.1f}  new {n['cpu_us']:8.1f} CPU us/image  "
        f"new/old {n['cpu_us'] / o['cpu_us']:.3f}  (wall {o['wall_s']:.2f} s, {n['wall_s']:.2f} s)"
    )


def report(args: argparse.Namespace, results: dict, old: Revision, new: Revision) -> None:
    print()
    print(f"command: {command_line()}")
    print(f"old: {old.name} = {old.commit}; new: {new.name} = {new.commit}")
    what = {
        "loader": f"loader: {args.epochs} epoch(s) of {args.images} 112x112 JPEGs, batch 256, "
        f"{args.workers} workers",
        "pack": f"pack: {args.pack_images} JPEGs, {args.workers} workers",
    }
    print("; ".join([*(what[c] for c in args.costs), f"{args.pairs} pair(s)"]))
    print("| cost | old CPU us/image | new CPU us/image | new/old | per-pair new/old min..max |")
    print("|---|---:|---:|---:|---|")
    for cost in args.costs:
        pairs = results[cost]
        olds = [p["old"]["cpu_us"] for p in pairs]
        news = [p["new"]["cpu_us"] for p in pairs]
        ratios = [n / o for o, n in zip(olds, news)]
        print(
            f"| {cost} | {statistics.median(olds):.1f} | {statistics.median(news):.1f} | "
            f"{statistics.median(ratios):.3f} | {min(ratios):.3f}..{max(ratios):.3f} |"
        )
    print("(medians over pairs; new/old is the median of the per-pair ratios)")
    if "loader" in results:
        pairs = results["loader"]
        r = statistics.median(p["new"]["cpu_us"] / p["old"]["cpu_us"] for p in pairs)
        verdict = "met" if r <= args.loader_limit else "not met"
        print(f"target: loader CPU us/image new/old <= {args.loader_limit}: {r:.3f}, {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--old", help="the revision to compare against (required)")
    ap.add_argument("--new", default=None, help="a revision (default: the working tree)")
    ap.add_argument("--pairs", type=int, default=5, help="old/new pairs per cost (default 5)")
    ap.add_argument("--quick", action="store_true", help="fewer images, for a smoke run")
    ap.add_argument("--images", type=int, default=None, help="loader .rec (20,000; quick 2,000)")
    ap.add_argument(
        "--pack-images", type=int, default=None, help="images packed (3,000; quick 600)"
    )
    ap.add_argument("--epochs", type=int, default=1, help="loader epochs per run (default 1)")
    ap.add_argument("--workers", type=int, default=2, help="loader and pack workers (default 2)")
    ap.add_argument(
        "--work", default=None, help="data folder (default: a temporary one, reused by name)"
    )
    ap.add_argument(
        "--costs", default=",".join(COSTS), help="which costs, comma-separated (loader,pack)"
    )
    ap.add_argument(
        "--loader-limit", type=float, default=1.03, help="the loader's new/old bound (1.03)"
    )
    ap.add_argument("--child", choices=("data", *COSTS), help=argparse.SUPPRESS)
    ap.add_argument("--rec", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.images = args.images or (2_000 if args.quick else 20_000)
    args.pack_images = args.pack_images or (600 if args.quick else 3_000)
    if not args.child and not args.old:
        ap.error("--old REV is required (e.g. --old HEAD~3)")
    args.costs = [c for c in args.costs.split(",") if c.strip()]
    if not args.costs or set(args.costs) - set(COSTS):
        ap.error(f"--costs takes a comma-separated subset of {', '.join(COSTS)}")
    return args


@contextlib.contextmanager
def two_revisions(args: argparse.Namespace, name: str) -> Iterator[tuple[Revision, Revision]]:
    """Worktrees of ``--old`` and ``--new``, byte-compiled, removed at the end; ``args.work``
    becomes the data folder of the old commit (made by it, reused by the next run against it)."""
    base = Path(args.work or os.path.join(tempfile.gettempdir(), f"stoker-bench-{name}"))
    trees = Path(tempfile.mkdtemp(prefix=f"stoker-{name}-"))
    worktrees: list[Path] = []
    try:
        old = checkout("old", args.old, trees, worktrees)
        new = checkout("new", args.new, trees, worktrees)
        args.work = base / old.commit.split()[0]
        args.work.mkdir(parents=True, exist_ok=True)
        print(f"# old {old.name} = {old.commit}: {old.src}", flush=True)
        print(f"# new {new.name} = {new.commit}: {new.src}", flush=True)
        for rev in (old, new):
            byte_compile(rev)
        yield old, new
    finally:
        for path in worktrees:
            _git("worktree", "remove", "--force", str(path))
        shutil.rmtree(trees, ignore_errors=True)


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    with two_revisions(args, "revisions") as (old, new):
        t = time.perf_counter()
        data = old.run("data", args)
        print(f"# data ready in {time.perf_counter() - t:.0f} s: {data}", flush=True)
        results = run_pairs(args, old, new, data)
        report(args, results, old, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
