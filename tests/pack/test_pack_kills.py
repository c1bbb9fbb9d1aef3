"""F-09: `stoker pack` killed (SIGTERM or SIGKILL to its process group) at many moments of a
sharded run: before the first record, as each shard opens, in the middle of each shard and
while the run commits. After each kill nothing may look complete but be invalid (there is no
manifest, or the whole output passes `verify`), and a rerun must give the bytes of a clean run:
every shard's .rec/.idx/.crc32c, the rejects list and the manifest.

The moments are found by watching the real output files (no test hooks in the packer): the
journal, each shard's partial file and its size, the first renamed shard.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import time
from dataclasses import dataclass

import psutil
import pytest
from packhelp import (
    assert_gone,
    family,
    noise_tree,
    semaphores,
    sha,
    start_driver,
    unlink_orphan_semaphores,
)

from stoker.formats.recordio import verify_records
from stoker.pack import pack

N_IMAGES = 600
SHARD = 100
N_SHARDS = N_IMAGES // SHARD
BAD = (5, 333, 590)


@dataclass
class Figure:
    tried: int = 0
    missed: int = 0  # the run had finished before the moment came
    landed_in_commit: int = 0
    complete_at_kill: int = 0
    invalid_looking: int = 0
    reruns_ok: int = 0


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("kills")
    src = root / "src"
    noise_tree(str(src), N_IMAGES, bad=BAD)
    (root / "clean").mkdir()
    clean = str(root / "clean" / "out")
    pack(src, clean, workers=2, shard_size=SHARD, _check=None)
    return str(src), clean


def _outputs(prefix: str) -> list[str]:
    shards = [f"{prefix}-{s:05d}{ext}" for s in range(N_SHARDS) for ext in (".rec", ".idx")]
    shards += [f"{prefix}-{s:05d}.crc32c" for s in range(N_SHARDS)]
    return [*shards, prefix + ".rejects.tsv", prefix + ".stoker.json"]


def _point(name: str, out: str, clean: str):
    """A predicate that is true once the run has reached moment ``name``."""
    if name == "start":  # the run has its journal: listing done, no record yet
        return lambda: os.path.exists(out + ".pack-journal.partial")
    if name == "commit":  # the first shard is renamed into place, the manifest not yet
        return lambda: os.path.exists(f"{out}-00000.rec")
    kind, s = name.split(":")
    partial = f"{out}-{int(s):05d}.rec.partial"
    if kind == "open":  # shard s has its first records: the one before it is complete
        return lambda: os.path.exists(partial)
    # the middle of shard s: the writer buffers about 1 MB, more than a shard here, so the
    # partial's size stays 0 until the shard ends; half a shard's time after it opened instead
    # (100 images at 8 ms on 2 workers: about 0.4 s)
    opened: list[float] = []

    def mid() -> bool:
        if not opened:
            if os.path.exists(partial):
                opened.append(time.monotonic())
            return False
        return time.monotonic() - opened[0] >= 0.2

    return mid


def _wait(pred, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return pred()
        time.sleep(0.0005)
    return False


def _kill_and_rerun(tmp_path, source, name: str, sig: int, fig: Figure) -> None:
    src, clean = source
    out = str(tmp_path / f"{fig.tried + fig.missed:02d}_{name.replace(':', '_')}_{sig}" / "out")
    os.makedirs(os.path.dirname(out))
    sems = semaphores()
    args = [src, out, "--workers", "2", "--shard-size", str(SHARD)]
    # 8 ms per image: a shard takes about 0.4 s, so each moment lasts long enough to be seen
    proc = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": "0.008"})
    reached = _wait(_point(name, out, clean), proc)
    procs = family(proc)
    if proc.poll() is None:
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"{name}: still running 10 s after signal {sig}") from None
        fig.tried += 1
        assert time.monotonic() - t0 < 10
        if sig == signal.SIGTERM:  # -15: it landed after the run had finished and reset it
            done = os.path.exists(out + ".stoker.json")
            assert proc.returncode == 143 or (done and proc.returncode == -sig), name
    else:  # the run ended before the moment (a commit is short): not a kill point
        fig.missed += 1
        proc.communicate()
    assert_gone(procs)
    if sig == signal.SIGKILL:  # the group's kill took the semaphores' tracker (docs/pack.md)
        unlink_orphan_semaphores(sems)
    assert reached or name == "commit", f"{name}: the run ended before the kill point"
    fig.landed_in_commit += int(name == "commit" and proc.returncode != 0)
    manifest = out + ".stoker.json"
    if os.path.exists(manifest):  # complete-looking: it must be complete and valid
        fig.complete_at_kill += 1
        if not verify_records(manifest).ok:
            fig.invalid_looking += 1
    if not os.path.exists(manifest) or os.path.exists(out + ".pack-journal.partial"):
        env = {**os.environ, "PACK_DRIVER_DELAY_S": "0"}
        rerun = start_driver(args, env=env)
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, err.decode()
    report = verify_records(manifest)
    for got, want in zip(_outputs(out), _outputs(clean)):
        assert sha(got) == sha(want), (name, sig, os.path.basename(got))
    assert not glob.glob(out + "*.partial")
    fig.reruns_ok += int(report.ok)


_MOMENTS = ["start"]
_MOMENTS += [f"open:{s}" for s in range(1, N_SHARDS)]
_MOMENTS += [f"mid:{s}" for s in range(N_SHARDS)]
_MOMENTS += ["commit", "commit"]
ALL_POINTS = [(m, sig) for m in _MOMENTS for sig in (signal.SIGTERM, signal.SIGKILL)]
# a bounded sample: a kill while committing (mid-shard kills of every format, both signals,
# are test_pack_kills_formats.py's default sample)
QUICK_POINTS = [("commit", signal.SIGKILL)]


def _run_points(tmp_path, source, points, figures) -> Figure:
    fig = Figure()
    for name, sig in points:
        _kill_and_rerun(tmp_path, source, name, sig, fig)
    figures.add(
        "F-09",
        tried=len(points),
        ok=min(fig.reruns_ok, len(points) - fig.invalid_looking),
        note=f"{len(points)} kill points (SIGTERM/SIGKILL to the group; {fig.landed_in_commit} "
        f"while committing): invalid-looking outputs {fig.invalid_looking}, reruns that verify "
        f"and equal a clean run {fig.reruns_ok}",
    )
    assert fig.invalid_looking == 0
    assert fig.reruns_ok == len(points)
    return fig


def test_kill_points_sample(tmp_path, source, figures):
    _run_points(tmp_path, source, QUICK_POINTS, figures)


@pytest.mark.slow
def test_kill_points_f09(tmp_path, source, figures):
    fig = _run_points(tmp_path, source, ALL_POINTS, figures)
    assert fig.tried >= 20
    print(
        f"\nF-09: kill points tried {fig.tried} (SIGTERM and SIGKILL to the process group; "
        f"{fig.landed_in_commit} while committing, {fig.complete_at_kill} found complete; "
        f"{fig.missed} more ended before their moment), "
        f"invalid-looking outputs {fig.invalid_looking}, "
        f"reruns that verify and equal a clean run {fig.reruns_ok}/{len(ALL_POINTS)}"
    )


def _sigkill_main_alone(source, out: str, after: float) -> tuple[float, list[str]]:
    """SIGKILL the main process of a TFRecord pack, not its group, ``after`` seconds once its
    two workers exist: (seconds until its last child is gone, the "leaked" lines on the stderr
    it shares with them and the resource tracker)."""
    proc = start_driver([source[0], out, "--format", "tfrecord", "--workers", "2"])
    deadline = time.monotonic() + 60
    while len(family(proc)) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # main, the tracker, the forkserver and two workers
    time.sleep(after)
    children = family(proc)[1:]
    assert proc.poll() is None and len(children) >= 4, "the run ended before its kill"
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    while _running(children) and time.monotonic() - t0 < 10:
        time.sleep(0.002)
    took = time.monotonic() - t0
    _, err = proc.communicate(timeout=60)  # its end: the last holder of the pipe is gone
    return took, [x for x in err.decode().splitlines() if "leaked" in x]


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running: not gone, not a zombie waiting to be reaped."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


@pytest.mark.parametrize("kills", [2, pytest.param(7, marks=pytest.mark.slow)])
def test_a_killed_main_leaves_no_worker_and_no_leaked_semaphore(tmp_path, source, kills):
    """Kills land as the workers start (0 s) and later in the run; the workers watch the main
    process from their start and unlink the pool's semaphores (``stoker._core.orphans``)."""
    for k in range(kills):
        took, leaked = _sigkill_main_alone(source, str(tmp_path / f"k{k}" / "out"), 0.15 * k)
        assert took < 1.0 and leaked == [], (k, took, leaked)
