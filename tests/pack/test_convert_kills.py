"""`stoker convert` killed (SIGKILL of its process group, or SIGTERM) at random moments, in
every format it writes, then run again: the rerun gives the bytes of a clean convert, and no
manifest ever names a short or missing shard. A convert is shard jobs: a shard whose
side-car was written is kept, any other is written again. The records are slowed down in the
driver (one process: ``--workers 1``) so that a kill lands anywhere in the run. One kill by
default; 40 per format and signal under ``slow``."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys

import pytest
from packhelp import kill_group_at, noise_tree, sha

from stoker.formats import registry
from stoker.pack import convert, pack

N = 240
SHARD = 40
FORMATS = ("recordio", "tfrecord", "wds")
DELAY_S = 0.004  # per record in the driver: a run takes about 1 s

#: ``stoker convert`` with each record's write slowed down by ``CONVERT_DELAY_S``
DRIVER = """
import os, sys, time
import stoker.pack.outputs as outputs
delay = float(os.environ.get("CONVERT_DELAY_S", "0"))
if delay:
    write = outputs.ShardWriters.write
    def slow(self, *a, **k):
        time.sleep(delay)
        return write(self, *a, **k)
    outputs.ShardWriters.write = slow
from stoker.cli import main
sys.exit(main(["convert", *sys.argv[1:], "--quiet"]))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert-kills")
    noise_tree(str(root / "img"), N, bad=(5,), size=32)
    src = str(root / "src" / "set")
    pack(str(root / "img"), src, workers=2, format="tfrecord", shard_size=100, progress=False)
    clean = {}
    for fmt in FORMATS:
        out = str(root / f"clean-{fmt}" / "out")
        convert(src + ".stoker.json", out, format=fmt, workers=1, shard_size=SHARD, progress=False)
        clean[fmt] = out
    return src + ".stoker.json", clean


def _files(prefix: str) -> dict[str, str]:
    folder = os.path.dirname(prefix)
    return {n: sha(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def _start(args: list[str], delay: float) -> subprocess.Popen:
    env = {**os.environ, "CONVERT_DELAY_S": str(delay)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )


def _kill_and_rerun(tmp_path, source, fmt: str, sig: int, at: float, n: int) -> str:
    src, clean = source
    out = str(tmp_path / f"{fmt}-{sig}-{n:02d}" / "out")
    os.makedirs(os.path.dirname(out))
    args = [src, out, "--format", fmt, "--workers", "1", "--shard-size", str(SHARD)]
    landed = kill_group_at(_start(args, DELAY_S), at, sig)
    manifest = out + ".stoker.json"
    if os.path.exists(manifest):  # a manifest names the whole set, every shard whole
        with open(manifest) as f:
            got = json.load(f)
        with open(clean[fmt] + ".stoker.json") as f:
            assert got == json.load(f), (fmt, sig, at, "a short set committed")
    if not os.path.exists(manifest) or glob.glob(out + ".pack-journal*"):  # not finished
        rerun = _start(args, 0.0)
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, (fmt, sig, at, err.decode())
    else:
        landed = "after the commit"
    assert registry.format_of(manifest).load("verify")(manifest, progress=False).ok
    assert _files(out) == _files(clean[fmt]), (fmt, sig, at)
    return landed


def _points(seed: int, k: int) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.uniform(0.05, 1.6), 3) for _ in range(k)]


def test_a_convert_killed_then_rerun_gives_a_clean_convert(tmp_path, source):
    _kill_and_rerun(tmp_path, source, "tfrecord", signal.SIGKILL, _points(0, 1)[0], 0)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_forty_random_kills_per_format(tmp_path, source, fmt, sig):
    landed = [
        _kill_and_rerun(tmp_path, source, fmt, sig, at, n)
        for n, at in enumerate(_points(2000 + FORMATS.index(fmt) + 10 * sig, 40))
    ]
    print(
        f"\n{fmt}: 40 x {signal.Signals(sig).name}, {landed.count('mid-run')} mid-run, "
        f"{landed.count('after the commit')} after the commit"
    )
