"""`stoker pack` of a folder and of a listing, killed (SIGKILL or SIGTERM to its whole
process group) at random moments, in every shard format it writes, then run again: the rerun
must give the bytes of a clean run, every record counted once, and no manifest may ever name a
short or missing shard. The moments are random times into the run (seeded; each record's
write slowed down), so they fall anywhere: before the first record, mid-shard, between shards,
while committing. Two kills by default; 40 per source kind, format and signal under ``slow``.
The harness is the convert kill test's (``packhelp.kill_and_rerun``)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from packhelp import (
    assert_gone,
    family,
    folder_files,
    kill_and_rerun,
    noise_tree,
    random_moments,
    semaphores,
    start_driver,
    unlink_orphan_semaphores,
)

from stoker.formats import registry
from stoker.pack import pack

FORMATS = ("recordio", "tfrecord", "wds")
DELAY_S = 0.008  # per image checked in the damage test's driver
MATRIX_N = 240
MATRIX_SHARD = 40
MATRIX_DELAY_S = 0.005  # per record written: a run takes about 1.2 s


#: (source kind, format, signal) of the default run's sample; every combination under slow
SAMPLE = [("folder", "tfrecord", signal.SIGKILL), ("listing", "wds", signal.SIGTERM)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A folder and a listing of the same small noise JPEGs (one empty file each), and a
    clean pack of each in every format."""
    root = tmp_path_factory.mktemp("kill-matrix")
    img = str(root / "img")
    noise_tree(img, MATRIX_N, bad=(9,), size=32)
    rows = [
        {"image": f"img/c{i % 3}/{i:04d}.jpg", "label": i % 3, "text": "t" * (i % 7)}
        for i in range(MATRIX_N)
    ]
    listing = str(root / "rows.jsonl")
    with open(listing, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    srcs = {"folder": img, "listing": listing}
    clean = {}
    for kind, src in srcs.items():
        for fmt in FORMATS:
            out = str(root / f"clean-{kind}-{fmt}" / "out")
            pack(src, out, workers=2, shard_size=MATRIX_SHARD, format=fmt, progress=False)
            clean[kind, fmt] = out
    return srcs, clean


def _kill_pack(tmp_path, sources, kind: str, fmt: str, sig: int, at: float, n: int) -> str:
    srcs, clean = sources
    out = str(tmp_path / f"{kind}-{fmt}-{sig}-{n:02d}" / "out")
    os.makedirs(os.path.dirname(out))
    args = ["pack", srcs[kind], out, "--workers", "2", "--shard-size", str(MATRIX_SHARD)]
    args += ["--format", fmt]
    return kill_and_rerun(args, out, clean[kind, fmt], sig, at, MATRIX_DELAY_S)


@pytest.mark.parametrize(("kind", "fmt", "sig"), SAMPLE)
def test_a_pack_killed_then_rerun_gives_a_clean_pack(tmp_path, sources, kind, fmt, sig):
    at = random_moments(7 + SAMPLE.index((kind, fmt, sig)), 1, 2.0)[0]
    _kill_pack(tmp_path, sources, kind, fmt, sig, at, 0)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["folder", "listing"])
def test_forty_random_kills_per_format(tmp_path, sources, kind, fmt, sig):
    seed = 1000 + 100 * ["folder", "listing"].index(kind) + 10 * FORMATS.index(fmt) + sig
    landed = [
        _kill_pack(tmp_path, sources, kind, fmt, sig, at, n)
        for n, at in enumerate(random_moments(seed, 40, 2.0))
    ]
    print(
        f"\n{kind} {fmt}: 40 x {signal.Signals(sig).name}, {landed.count('mid-run')} mid-run, "
        f"{landed.count('after the commit')} after the commit; every rerun equals a clean run"
    )


@pytest.mark.parametrize("damage", [pytest.param("tail", marks=pytest.mark.slow), "byte"])
def test_a_kept_shard_that_no_longer_verifies_is_written_again(tmp_path, sources, damage):
    """A shard committed before the kill that lost its tail (a disk that dropped a buffered
    tail) or has a flipped byte is not kept: the rerun writes it again and gives a clean
    run's bytes, never a short set."""
    srcs, clean = sources
    out = str(tmp_path / "gap" / "out")
    os.makedirs(os.path.dirname(out))
    args = [srcs["folder"], out, "--workers", "2", "--shard-size", str(MATRIX_SHARD)]
    args += ["--format", "tfrecord", "--quiet"]
    sems = semaphores()
    proc = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": str(DELAY_S)})
    committed = f"{out}-00000.pack-shard.json"  # shard 0's commit point: kill just after it
    deadline = time.monotonic() + 60
    while not os.path.exists(committed):
        assert proc.poll() is None and time.monotonic() < deadline, "shard 0 never committed"
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
            f.truncate(size // 2)
        else:  # one bit of a record's payload flipped: the size still matches
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 1]))
    rerun = start_driver(args, env={**os.environ, "PACK_DRIVER_DELAY_S": "0"})
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err.decode()
    manifest = out + ".stoker.json"
    assert registry.format_of(manifest).load("verify")(manifest, progress=False).ok
    assert folder_files(out) == folder_files(clean["folder", "tfrecord"])
