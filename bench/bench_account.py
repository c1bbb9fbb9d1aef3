"""Where the 112 px loader's CPU goes, per image and per process, next to the plain chain (e).

The loader of ``bench_loader.py``'s c and c' (20,000 112x112 JPEGs from the .rec, resize 128
-> random crop 112 -> flip -> float32 NCHW normalised, or uint8 NCHW; batch 256, 2 workers), two
epochs of a new ``Loader`` in a process whose worker server already runs (as in every round of
``bench_loader.py`` after its first), and (e), the plain chain in a tight loop in 2 processes,
run side by side in alternating order. For each epoch, per delivered image:

- the main process: all its threads (``getrusage``), and of these the threads other than the
  main thread (slot reservations, the workers' start);
- the worker server (the fork of each worker);
- the workers: inside ``fill_chunk`` (each chunk's thread CPU, reported with the chunk), mapping
  ring rows before a chunk's first write there, and the rest (the worker's start, its task
  loop, pipes, views); their totals from ``/proc/PID/task/*/schedstat``;
- minor page faults (main, workers inside ``fill_chunk``, workers outside) and context
  switches (voluntary / involuntary, per 1,000 images).

    python bench/bench_account.py                 # 20,000 images, 3 rounds
    python bench/bench_account.py --quick         # 2,000 images, 1 round: a smoke run

CPU figures are medians over the rounds with their spread; the chain's is its processes' CPU
inside their timed loops, as in ``bench_loader.py``.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import bench_loader as bl
from _common import alternated, bench_parser, command_line, make_data, median_range


def _proc(pid: int) -> dict[str, float]:
    """CPU seconds (all threads, from schedstat), minor faults and context switches of ``pid``."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out = {"cpu": 0.0, "minflt": float(stat[7]), "vcs": 0.0, "nvcs": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out["cpu"] += (
                int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
            )
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        out["vcs"] += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        out["nvcs"] += int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return out


def _main() -> dict[str, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu": r.ru_utime + r.ru_stime,
        "thread": time.thread_time(),
        "minflt": float(r.ru_minflt),
        "vcs": float(r.ru_nvcsw),
        "nvcs": float(r.ru_nivcsw),
    }


def _workers(loader) -> dict[int, dict[str, float]]:
    """Each worker's counters, with what its reports summed (``WorkerHandle``)."""
    out = {}
    for w in loader._pool.handles:
        d = _proc(w.proc.pid)
        d.update(fill=w.fill_cpu, fill_faults=float(w.fill_faults), map=w.map_cpu)
        out[w.proc.pid] = d
    return out


def _server_pid() -> int:
    from stoker.loader._process import SERVER

    pid = getattr(SERVER, "_forkserver_pid", None)
    if pid is None:
        raise SystemExit("the loader's worker server is not running")
    return pid


def _epoch_rows(n: int, m0: dict, m1: dict, s0: dict, s1: dict, w0: dict, w1: dict) -> dict:
    """Per-image figures of one epoch from the snapshots before (0) and after (1) it."""

    def d(a: dict, b: dict, k: str) -> float:
        return b[k] - a.get(k, 0.0)

    per = 1e6 / n
    wk = {pid: {k: d(w0.get(pid, {}), w1[pid], k) for k in w1[pid]} for pid in w1}
    fill = sum(v["fill"] for v in wk.values())
    mapped = sum(v["map"] for v in wk.values())
    wcpu = sum(v["cpu"] for v in wk.values())
    main, server = d(m0, m1, "cpu"), d(s0, s1, "cpu")
    wflt = sum(v["minflt"] for v in wk.values())
    wfill_flt = sum(v["fill_faults"] for v in wk.values())
    return {
        "main": main * per,
        "main_other_threads": (main - d(m0, m1, "thread")) * per,
        "server": server * per,
        "fill": fill * per,
        "map": mapped * per,
        "rest": (wcpu - fill - mapped) * per,
        "total": (main + server + wcpu) * per,
        "main_faults": d(m0, m1, "minflt") / n,
        "fill_faults": wfill_flt / n,
        "worker_faults": (wflt - wfill_flt) / n,
        "main_cs": (d(m0, m1, "vcs") * 1000 / n, d(m0, m1, "nvcs") * 1000 / n),
        "worker_cs": (
            sum(v["vcs"] for v in wk.values()) * 1000 / n,
            sum(v["nvcs"] for v in wk.values()) * 1000 / n,
        ),
    }


def account_loader(path: str, *, normalize: bool, workers: int, batch_size: int) -> dict:
    """Two epochs of a new loader; each epoch's per-image figures (``_epoch_rows``)."""
    from stoker.loader import Loader

    spid = _server_pid()
    loader = Loader(
        path,
        batch_size=batch_size,
        transforms=bl.stoker_transforms("112", normalize=normalize),
        layout="NCHW",
        shuffle=True,
        seed=0,
        workers=workers,
    )
    out = {}
    with loader:
        m0, s0, w0 = _main(), _proc(spid), {}
        for epoch in (1, 2):
            t0, n = time.perf_counter(), 0
            for b in loader:
                n += len(b.images)
            took = time.perf_counter() - t0
            m1, s1, w1 = _main(), _proc(spid), _workers(loader)
            out[epoch] = _epoch_rows(n, m0, m1, s0, s1, w0, w1) | {"rate": n / took}
            m0, s0, w0 = m1, s1, w1
    return out


def print_table(got: dict, chain: dict) -> None:
    """Medians (min..max) over the rounds, µs per image, both epochs of both dtypes."""
    cols = [(dt, e) for dt in got for e in (1, 2)]

    def cell(dt: str, e: int, key: str, idx: int | None = None, fmt: str = "{:.1f}") -> str:
        vals = [r[e][key] if idx is None else r[e][key][idx] for r in got[dt]]
        med, lo, hi = median_range(vals)
        if len(vals) == 1:
            return fmt.format(med)
        return f"{fmt.format(med)} ({fmt.format(lo)}..{fmt.format(hi)})"

    head = " | ".join(f"{dt} epoch {e}" for dt, e in cols)
    print(f"\n| process | part | {head} |")
    print("|---|---|" + "---:|" * len(cols))
    rows = [
        ("main", "all threads, µs/image", "main", None, "{:.1f}"),
        ("main", "of which threads besides the main one", "main_other_threads", None, "{:.1f}"),
        ("worker server", "forks", "server", None, "{:.1f}"),
        ("workers", "inside fill_chunk", "fill", None, "{:.1f}"),
        ("workers", "mapping ring rows", "map", None, "{:.1f}"),
        ("workers", "the rest: start, task loop, pipes, views", "rest", None, "{:.1f}"),
        ("**loader**", "**all processes**", "total", None, "{:.1f}"),
        ("main", "minor faults per image", "main_faults", None, "{:.2f}"),
        ("workers", "minor faults per image inside fill_chunk", "fill_faults", None, "{:.2f}"),
        ("workers", "minor faults per image outside", "worker_faults", None, "{:.2f}"),
        ("main", "voluntary context switches per 1,000 images", "main_cs", 0, "{:.0f}"),
        ("main", "involuntary, per 1,000 images", "main_cs", 1, "{:.0f}"),
        ("workers", "voluntary context switches per 1,000 images", "worker_cs", 0, "{:.0f}"),
        ("workers", "involuntary, per 1,000 images", "worker_cs", 1, "{:.0f}"),
        ("", "images/s", "rate", None, "{:,.0f}"),
    ]
    for proc, part, key, idx, fmt in rows:
        cells = " | ".join(cell(dt, e, key, idx, fmt) for dt, e in cols)
        print(f"| {proc} | {part} | {cells} |")
    chain = " | ".join("{:.1f} ({:.1f}..{:.1f})".format(*median_range(chain[dt])) for dt, _ in cols)
    print(f"| **(e)** | **the chain's processes in their loops** | {chain} |")


def parse_args(argv: list[str] | None = None):
    ap = bench_parser(__doc__, "2,000 images, 1 round: a smoke run")
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    return ap.parse_args(argv)


def main() -> int:
    args = parse_args()
    n = args.images or (2_000 if args.quick else 20_000)
    rounds = args.rounds or (1 if args.quick else 3)
    work = Path(os.path.join(tempfile.gettempdir(), "stoker-bench-loader"))
    work.mkdir(parents=True, exist_ok=True)
    _, rec = make_data(work, n=n, size=112, name=f"s112_{n}")
    bl.warm_page_cache(rec)
    bl.MEASURE_MEMORY = False  # no sampler in the chain's rounds
    print(f"# bench_account: {n} images 112x112, batch {args.batch_size}, {args.workers} workers")
    dtypes = {"float32": True, "uint8": False}
    for normalize in dtypes.values():
        bl.calibrate_chain(rec, "112", normalize, min(n, 2_000))
    # a first loader, not counted, after the worker server's start
    from stoker.loader._pool import warm_up

    warm_up()
    account_loader(rec, normalize=True, workers=args.workers, batch_size=args.batch_size)
    got: dict[str, list] = {dt: [] for dt in dtypes}
    chain: dict[str, list] = {dt: [] for dt in dtypes}
    for r in range(rounds):
        for dt, normalize in dtypes.items():
            for who in alternated(["e", "c"], r):
                bl.warm_page_cache(rec)
                if who == "c":
                    got[dt].append(
                        account_loader(
                            rec,
                            normalize=normalize,
                            workers=args.workers,
                            batch_size=args.batch_size,
                        )
                    )
                else:
                    res = bl.run_loop(
                        bl._chain_worker, rec, n=n, kind="112", normalize=normalize,
                        workers=args.workers,
                    )  # fmt: skip
                    chain[dt].append(1000 * res["cpu_ms_per_image"])
            print(f"... round {r} {dt}: loader {got[dt][-1][1]['total']:.1f} / "
                  f"{got[dt][-1][2]['total']:.1f} µs/image, chain {chain[dt][-1]:.1f}", flush=True)  # fmt: skip
    print(f"\ncommand: {command_line()}; load average {os.getloadavg()[0]:.1f}")
    print_table(got, chain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
