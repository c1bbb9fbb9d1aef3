"""`stoker pack` SIGKILLed (its whole process group) at random moments, in every shard format
it writes, then run again: the rerun must give the bytes of a clean run, every record counted
once, and no manifest may ever describe a short set. The moments are random times into the
run (seeded), so they fall anywhere: before the first record, mid-shard, between shards, while
committing. A bounded sample runs by default; 40 points per format under ``slow``."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import time

import pytest
from packhelp import (
    assert_gone,
    family,
    kill_group_at,
    noise_tree,
    semaphores,
    sha,
    start_driver,
    unlink_orphan_semaphores,
)

from stoker.formats import registry
from stoker.pack import pack

N_IMAGES = 600
SHARD = 100
BAD = (7, 151)
FORMATS = ("recordio", "tfrecord", "wds")
DELAY_S = 0.008  # per image in the driver: a run takes about 3 s on two workers


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("kills-formats")
    src = str(root / "src")
    noise_tree(src, N_IMAGES, bad=BAD)
    clean = {}
    for fmt in FORMATS:
        out = root / f"clean-{fmt}" / "out"
        out.parent.mkdir()
        pack(src, out, workers=2, shard_size=SHARD, format=fmt, progress=False)
        clean[fmt] = str(out)
    return src, clean


def verify_set(manifest: str):
    return registry.format_of(manifest).load("verify")(manifest, progress=False)


def _files(prefix: str) -> dict[str, str]:
    folder = os.path.dirname(prefix)
    return {n: sha(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def _kill_and_rerun(tmp_path, source, fmt: str, at: float, delay: float, n: int) -> str:
    """Kill a run of ``fmt`` (``delay`` s per image) ``at`` seconds in, rerun it; what the
    kill landed on."""
    src, clean = source
    out = str(tmp_path / f"{fmt}-{n:02d}" / "out")
    os.makedirs(os.path.dirname(out))
    sems = semaphores()
    args = [src, out, "--workers", "2", "--shard-size", str(SHARD), "--format", fmt]
    proc = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": str(delay)})
    landed = kill_group_at(proc, at)
    unlink_orphan_semaphores(sems)  # the group's kill took the semaphores' tracker
    manifest = out + ".stoker.json"
    if os.path.exists(manifest):  # complete-looking: it must be the whole set
        with open(manifest) as f:
            got = json.load(f)
        with open(clean[fmt] + ".stoker.json") as f:
            want = json.load(f)
        assert got.get("records") == want.get("records"), (fmt, at, "a short set committed")
        assert verify_set(manifest).ok, (fmt, at)
    if not os.path.exists(manifest) or glob.glob(out + ".pack-journal*"):  # not finished
        rerun = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": "0"})
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, (fmt, at, err.decode())
    else:
        landed = "after the commit"
    assert verify_set(manifest).ok
    assert _files(out) == _files(clean[fmt]), (fmt, at)
    return landed


def _points(seed: int, k: int) -> list[tuple[float, float]]:
    """``k`` (kill time, delay per image): half the runs at full speed (the packer's buffers
    then fill between its flushes), half slowed down so that the kill lands anywhere in a
    longer run."""
    rng = random.Random(seed)
    out = []
    for i in range(k):
        if i % 2:
            out.append((round(rng.uniform(0.2, 4.0), 3), DELAY_S))
        else:
            out.append((round(rng.uniform(0.3, 1.5), 3), 0.0))
    return out


@pytest.mark.parametrize(
    "fmt", [pytest.param(f, marks=() if f == "tfrecord" else pytest.mark.slow) for f in FORMATS]
)
def test_random_kills_then_rerun_give_a_clean_run(tmp_path, source, fmt):
    for n, (at, delay) in enumerate(_points(FORMATS.index(fmt), 1)):
        _kill_and_rerun(tmp_path, source, fmt, at, delay, n)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fmt", FORMATS)
def test_forty_random_kills_per_format(tmp_path, source, fmt):
    landed = [
        _kill_and_rerun(tmp_path, source, fmt, at, delay, n)
        for n, (at, delay) in enumerate(_points(1000 + FORMATS.index(fmt), 40))
    ]
    print(f"\n{fmt}: 40 SIGKILLs, {landed.count('mid-run')} mid-run, all reruns equal a clean run")


@pytest.mark.parametrize("damage", ["tail", "byte"])
def test_a_kept_shard_that_no_longer_verifies_is_written_again(tmp_path, source, damage):
    """A shard committed before the kill that lost its tail (a disk that dropped a buffered
    tail) or has a flipped byte is not kept: the rerun writes it again and gives a clean
    run's bytes, never a short set."""
    src, clean = source
    out = str(tmp_path / "gap" / "out")
    os.makedirs(os.path.dirname(out))
    args = [src, out, "--workers", "2", "--shard-size", str(SHARD), "--format", "tfrecord"]
    sems = semaphores()
    proc = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": str(DELAY_S)})
    second = f"{out}-00001.tfrecord.partial"
    deadline = time.monotonic() + 60
    while not (os.path.exists(second) and os.path.getsize(second) > 0):
        assert proc.poll() is None and time.monotonic() < deadline, "shard 1 never started"
        time.sleep(0.002)
    procs = family(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert_gone(procs)
    unlink_orphan_semaphores(sems)
    first = f"{out}-00000.tfrecord"  # committed, with its side-car
    assert os.path.exists(f"{out}-00000.pack-shard.json")
    size = os.path.getsize(first)
    with open(first, "r+b") as f:
        if damage == "tail":  # its last records are gone
            f.truncate(size - 30_000)
        else:  # one bit of a record's payload flipped: the size still matches
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 1]))
    rerun = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": "0"})
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err.decode()
    assert verify_set(out + ".stoker.json").ok
    assert _files(out) == _files(clean["tfrecord"])
