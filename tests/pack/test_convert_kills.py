"""`stoker convert` killed (SIGKILL of its process group, or SIGTERM) at random moments, in
every format it writes, then run again: the rerun gives the bytes of a clean convert, and no
manifest ever names a short or missing shard. A convert is shard jobs: a shard whose
side-car was written is kept, any other is written again. The records are slowed down in the
driver (one process: ``--workers 1``) so that a kill lands anywhere in the run. One kill by
default; 40 per format and signal under ``slow``."""

from __future__ import annotations

import os
import signal

import pytest
from packhelp import kill_and_rerun, noise_tree, random_moments

from stoker.pack import convert, pack

N = 240
SHARD = 40
FORMATS = ("recordio", "tfrecord", "wds")
DELAY_S = 0.004  # per record in the driver: a run takes about 1 s


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


def _kill_and_rerun(tmp_path, source, fmt: str, sig: int, at: float, n: int) -> str:
    src, clean = source
    out = str(tmp_path / f"{fmt}-{sig}-{n:02d}" / "out")
    os.makedirs(os.path.dirname(out))
    args = ["convert", src, out, "--format", fmt, "--workers", "1", "--shard-size", str(SHARD)]
    return kill_and_rerun(args, out, clean[fmt], sig, at, DELAY_S)


def _points(seed: int, k: int) -> list[float]:
    return random_moments(seed, k, 1.6)


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
