"""The batch ring is anonymous shared memory (a memfd): nothing in /dev/shm, nothing left after a
SIGKILL of the main process, and a ring larger than a 64 MB /dev/shm works.

The SIGKILL cycles run 10 times by default and 100 times under ``-m slow``."""

from __future__ import annotations

import gc
import glob
import os
import shutil
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from loader_helpers import running, sigkill_driver

from stoker.loader import Loader

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
RING = "/memfd:stoker-ring"

# a folder source (no named segment of its own) and a float32 ring of 4 slots x 64 rows x
# 112 x 112 x 3 (38 MiB)
DRIVER = """
import os, sys, time
from stoker.loader import Loader
from stoker.transforms import Compose, Normalize, Resize

if __name__ == "__main__":
    t = Compose([Resize((112, 112)), Normalize()])
    ld = Loader(sys.argv[1], batch_size=64, workers=2, transforms=t, shuffle=True)
    it = iter(ld)
    next(it)  # in a fresh process, made by the main process while the workers start
    pids = ld.worker_pids()
    next(iter(ld))  # a new iteration, made by the workers: each maps the ring
    print(*pids, flush=True)
    while True:
        for b in ld:
            time.sleep(0.005)
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]))


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ring_inodes(pid: int) -> set[str]:
    """Inodes of the loader rings that process ``pid`` maps."""
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if RING in line:
                    out.add(line.split()[4])
    except OSError:
        pass
    return out


def _ring_fds(pid: int) -> list[int]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(RING):
                out.append(int(fd))
        except OSError:
            pass
    return out


def _holders(inodes: set[str]) -> list[int]:
    """Processes that still map one of ``inodes`` (the memory lives while one does)."""
    return [p.pid for p in psutil.process_iter() if _ring_inodes(p.pid) & inodes]


def _kill_cycle(folder: str) -> dict:
    """Start a loader with 2 workers in a child, SIGKILL the child, and look at what is left."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER), folder],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read()
        pids = [int(p) for p in line]
        inodes = _ring_inodes(proc.pid)
        assert inodes and all(_ring_inodes(p) == inodes for p in pids)
        named = glob.glob(f"/dev/shm/stoker_{proc.pid}_*")
    finally:
        sigkill_driver(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(running, pids)):
        time.sleep(0.05)
    alive = [p for p in pids if running(p)]
    deadline = time.monotonic() + 5  # the orphans' new parent reaps them
    while time.monotonic() < deadline and any(map(_zombie, pids)):
        time.sleep(0.05)
    return {
        "named": sorted(set(named + glob.glob(f"/dev/shm/stoker_{proc.pid}_*"))),
        "running": alive,
        "zombies": [p for p in pids if _zombie(p)],
        "holders": _holders(inodes),
    }


def _kill_cycles(folder: str, n: int, figures) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    left = []
    for i in range(n):
        got = _kill_cycle(folder)
        if any(got.values()):
            left.append((i, got))
    fds_after = len(os.listdir("/proc/self/fd"))
    figures.add(
        "F-05",
        tried=n,
        ok=n - len(left),
        note=f"SIGKILL of main x{n}: cycles leaving a segment, worker or mapping "
        f"{len(left)}; fd growth {fds_after - fds_before}",
    )
    assert left == [], f"after SIGKILL of main: {left}"
    assert fds_after <= fds_before, f"fds {fds_before} -> {fds_after}"


@pytest.mark.timeout(300)
def test_sigkill_of_main_leaves_nothing(folder, figures):
    _kill_cycles(folder, 3, figures)  # a bounded sample; 100 under slow


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sigkill_of_main_leaves_nothing_100_times(folder, figures):
    _kill_cycles(folder, 100, figures)


def test_ring_is_anonymous_and_workers_close_its_descriptor(folder, shm_names):
    from stoker.transforms import Resize

    before = shm_names()
    me = os.getpid()
    gc.collect()  # a ring an earlier test's garbage still maps is not this loader's
    earlier = _ring_inodes(me)
    with Loader(folder, batch_size=8, workers=2, transforms=Resize((16, 16))) as ld:
        it = iter(ld)
        next(it)  # a process's first loader may make it itself while its workers start,
        ld.worker_pids()  # which this waits for
        first = next(it)  # made by the workers, in the ring
        inodes = _ring_inodes(me) - earlier
        assert len(inodes) == 1 and shm_names() == before  # nothing named in /dev/shm
        assert len(_ring_fds(me)) == 1  # main keeps one, for workers started later
        for pid in ld.worker_pids():
            assert _ring_inodes(pid) == inodes  # mapped ...
            assert _ring_fds(pid) == []  # ... and the descriptor closed
        assert sum(1 for _ in ld) == 4
    assert _ring_fds(me) == []
    assert _ring_inodes(me) - earlier == inodes  # the kept batch still maps it: still valid
    assert first.images.shape == (8, 16, 16, 3)
    del first, it
    assert _ring_inodes(me) - earlier == set()  # gone with the last view


def test_a_respawned_worker_maps_the_same_ring(arrays, tmp_path):
    from loader_helpers import KillOnce

    x, y = arrays
    t = KillOnce(marks=str(tmp_path), at=(9,))
    with Loader((x, y), batch_size=4, workers=2, transforms=t, on_worker_death="respawn") as ld:
        n = sum(len(b.images) for b in ld)
        assert n == len(x) and ld._pool.respawns == 1
        inodes = _ring_inodes(os.getpid())
        assert len(inodes) == 1
        for pid in ld.worker_pids():
            assert _ring_inodes(pid) == inodes and _ring_fds(pid) == []


def test_workers_zero_makes_no_shared_memory(folder, shm_names):
    from stoker.transforms import Resize

    before = shm_names()
    with Loader(folder, batch_size=8, workers=0, transforms=Resize((16, 16))) as ld:
        assert sum(len(b.images) for b in ld) == 42
        assert _ring_inodes(os.getpid()) == set() and _ring_fds(os.getpid()) == []
        assert shm_names() == before


BIG_RING = """
import os, sys
from stoker.loader import Loader
from stoker.transforms import Compose, Normalize, Resize

st = os.statvfs("/dev/shm")
assert st.f_blocks * st.f_frsize == 64 << 20, "not the 64 MB /dev/shm"
t = Compose([Resize((112, 112)), Normalize(layout="CHW")])
# 1024 rows x 3 x 112 x 112 float32: 147 MiB a slot, 4 slots
with Loader(sys.argv[1], batch_size=1024, workers=2, transforms=t) as ld:
    n = sum(len(b.images) for b in ld)
    assert ld._layout.total_bytes > 4 * (64 << 20), ld._layout.total_bytes
    assert os.listdir("/dev/shm") == [], os.listdir("/dev/shm")
print("OK", n, flush=True)
"""


def test_a_ring_larger_than_a_64mb_dev_shm_works(folder):
    """Docker's default /dev/shm is 64 MB. The test mounts one in a private mount namespace
    (root and unshare(1) needed: without them it fails, it does not skip)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare(1) is not installed: cannot make a private 64 MB /dev/shm")
    script = f'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "{sys.executable}" -c "$0" "$1"'
    proc = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, BIG_RING, folder],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    if "unshare failed" in proc.stderr or "mount:" in proc.stderr:
        pytest.fail(
            "cannot make a private 64 MB /dev/shm (unshare --mount / mount refused: needs root "
            f"and a kernel that allows mount namespaces): {proc.stderr.strip()}"
        )
    assert proc.returncode == 0 and "OK 42" in proc.stdout, proc.stderr[-3000:]


def test_shared_fd_does_not_pickle_outside_a_process_start():
    import pickle

    from stoker.loader import _shm

    ring, mapping = _shm.SharedFd.create(4096, name="stoker-test")
    try:
        with pytest.raises(TypeError, match="into a process being started"):
            pickle.dumps(ring)
        with _shm.probing():
            assert b"_placeholder" in pickle.dumps(ring)
    finally:
        ring.close()
    assert mapping.array().sum() == 0
