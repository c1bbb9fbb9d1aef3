"""Workers kept after close() (``keep_workers``): the next loader of the same configuration
takes them, with the same batches and no process started; another configuration gets its
own; a kept pool holds no ring and no open source, and goes after its idle time, at
``release_workers()`` or at exit, leaving no process, segment or descriptor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
from loader_helpers import RandCrop, running
from test_loader_records import write_rec

from stoker.loader import Loader, release_workers
from stoker.loader._keep import kept_count
from stoker.transforms import Compose, HorizontalFlip, RandomCrop

RING = "/memfd:stoker-ring"


@pytest.fixture(autouse=True)
def _released():
    yield
    release_workers()


def _epoch(loader: Loader) -> tuple[np.ndarray, np.ndarray]:
    got = [(b.images.copy(), b.keys.copy()) for b in loader]
    return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _rings(pid: int) -> set[str]:
    """Inodes of the batch rings ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[4] for line in f if RING in line}


def _open_files(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def _eventually(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_100_loaders_reuse_one_pool_and_ring_with_the_same_batches(folder):
    tf = RandCrop(32, 32)
    with Loader(folder, batch_size=8, transforms=tf, shuffle=True, seed=5, workers=2) as plain:
        want = _epoch(plain)  # what a loader that keeps nothing delivers
    pids: list[int] = []
    rings: set[str] = set()
    fds: list[str] = []
    for cycle in range(100):
        before = _children()
        ld = Loader(folder, batch_size=8, transforms=tf, shuffle=True, seed=5, workers=2,
                    keep_workers=30)  # fmt: skip
        with ld:
            it = iter(ld)
            first = next(it)
            # the first batch of a later loader: no process was started for it ...
            assert _children() <= before or cycle == 0
            pids = pids or ld.worker_pids()
            assert ld.worker_pids() == pids
            # ... and no ring made: the kept one, which its workers map already
            rings = rings or _rings(os.getpid())
            assert _rings(os.getpid()) == rings and all(_rings(p) == rings for p in pids)
            got = [(first.images.copy(), first.keys.copy())]
            got += [(b.images.copy(), b.keys.copy()) for b in it]
            del first, it  # no view of the ring is left: the next loader may take it
        np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), want[0])
        np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), want[1])
        assert kept_count() == 1
        if cycle == 0:
            fds = _open_files(os.getpid())
    assert sorted(_open_files(os.getpid())) == sorted(fds)  # no descriptor gained per cycle
    release_workers()
    assert kept_count() == 0
    assert _gone(pids)
    assert _rings(os.getpid()) == set()


def test_another_configuration_gets_its_own_workers(folder):
    a = Compose([RandomCrop(32), HorizontalFlip()])
    b = Compose([RandomCrop(30), HorizontalFlip()])
    with Loader(folder, batch_size=8, transforms=a, seed=1, workers=2, keep_workers=30) as ld:
        next(iter(ld))
        first = ld.worker_pids()
    for kw in (
        dict(transforms=b, seed=1),  # another pipeline
        dict(transforms=a, seed=1, on_error="skip"),
    ):
        with Loader(folder, batch_size=8, workers=2, **kw) as ld:
            next(iter(ld))
            assert set(ld.worker_pids()).isdisjoint(first)
    assert kept_count() == 1  # loaders that keep nothing leave the kept pool alone
    with Loader(folder, batch_size=4, transforms=a, seed=1, workers=2, prefetch=3) as ld:
        # another batch size and ring: the same workers, handed the new ring
        assert next(iter(ld)).images.shape == (4, 32, 32, 3)
        assert ld.worker_pids() == first
    assert kept_count() == 0 and _gone(first)  # closed without keep_workers: stopped


def test_a_loader_of_another_seed_takes_the_pool_with_its_own_batches(folder):
    tf = Compose([RandomCrop(32), HorizontalFlip()])
    kw = dict(batch_size=8, transforms=tf, shuffle=True, workers=2)
    want, state = {}, {}
    for seed in (1, 2):
        with Loader(folder, seed=seed, **kw) as ld:
            state[seed] = ld.state_dict()
            want[seed] = _epoch(ld)
    with Loader(folder, seed=1, keep_workers=30, **kw) as ld:
        np.testing.assert_array_equal(_epoch(ld)[0], want[1][0])
        pids = ld.worker_pids()
    with Loader(folder, keep_workers=30, **kw) as ld:  # a drawn seed
        ld.load_state_dict(state[2])  # resumed at seed 2: the same workers, its batches
        got = _epoch(ld)
        assert ld.worker_pids() == pids
    for a, b in zip(got, want[2]):
        np.testing.assert_array_equal(a, b)


def test_a_kept_pool_goes_after_its_idle_time(folder):
    with Loader(folder, batch_size=8, transforms=RandCrop(32, 32), workers=2, seed=0,
                keep_workers=0.3) as ld:  # fmt: skip
        next(iter(ld))
        pids = ld.worker_pids()
    assert kept_count() == 1 and not _gone(pids, 0.1)
    assert _gone(pids)
    assert kept_count() == 0
    # the timer's thread closes the pipes and the ring after the workers exit
    assert _eventually(
        lambda: not any(t.name == "stoker-kept-workers" for t in threading.enumerate())
    )


def test_a_kept_worker_that_died_is_not_reused(folder):
    kw = dict(batch_size=8, transforms=RandCrop(32, 32), workers=2, seed=0, keep_workers=30)
    with Loader(folder, **kw) as ld:
        want = _epoch(ld)
        pids = ld.worker_pids()
    os.kill(pids[0], 9)
    assert _gone(pids[:1])
    with Loader(folder, **kw) as ld:
        got = _epoch(ld)
        assert set(ld.worker_pids()).isdisjoint(pids)
    assert _gone(pids)  # its living partner was stopped
    np.testing.assert_array_equal(got[0], want[0])


def test_a_batch_kept_from_a_closed_loader_stays_as_it_was(folder):
    kw = dict(batch_size=8, transforms=RandCrop(32, 32), workers=2, seed=0, keep_workers=30)
    with Loader(folder, **kw) as ld:
        kept = next(iter(ld)).images  # a view of the first loader's ring
        copy = kept.copy()
        old, pids = _rings(os.getpid()), ld.worker_pids()
    with Loader(folder, shuffle=True, **kw) as ld:
        _epoch(ld)  # the same workers write every batch of a new ring
        assert ld.worker_pids() == pids
        new = _rings(os.getpid()) - old
        assert len(new) == 1 and all(_rings(p) == new for p in pids)
    np.testing.assert_array_equal(kept, copy)
    del kept
    assert _rings(os.getpid()) == new  # the old ring went with its last view


def test_a_kept_worker_closes_its_source_and_reads_the_file_again(tmp_path):
    path = str(tmp_path / "train.rec")
    write_rec(path, n=24)
    kw = dict(batch_size=6, transforms=RandomCrop(32), workers=2, seed=0, keep_workers=30)
    with Loader(path, **kw) as ld:
        want = _epoch(ld)
        pids = ld.worker_pids()
    for p in pids:  # a parked worker closes its source when it reads the message
        assert _eventually(lambda p=p: not any(f.endswith(".rec") for f in _open_files(p)))
    with Loader(path, **kw) as ld:
        np.testing.assert_array_equal(_epoch(ld)[0], want[0])
        assert ld.worker_pids() == pids
    # the set packed again under the same name, other images: not the old file's pool
    write_rec(str(tmp_path / "new.rec"), n=24, size=(44, 44))
    for ext in (".rec", ".idx"):
        os.replace(tmp_path / f"new{ext}", tmp_path / f"train{ext}")
    with Loader(path, **kw) as ld:
        got = _epoch(ld)[0]
    assert got.shape == want[0].shape and not np.array_equal(got, want[0])


def test_an_own_copy_of_arrays_is_not_kept(arrays):
    with Loader(arrays, batch_size=8, workers=2, seed=0, keep_workers=30) as ld:
        next(iter(ld))
        pids = ld.worker_pids()
    assert kept_count() == 0 and _gone(pids)


def test_keep_workers_is_checked(folder):
    for bad, err in (("5", TypeError), (True, TypeError), (-1, ValueError)):
        with pytest.raises(err, match="keep_workers"):
            Loader(folder, batch_size=8, keep_workers=bad)
    with pytest.raises(ValueError, match="keep_workers"):
        Loader(folder, batch_size=8, keep_workers=float("inf"))


EXITS = """
import sys
from stoker.loader import Loader
from stoker.transforms import RandomCrop

if __name__ == "__main__":
    ld = Loader(sys.argv[1], batch_size=8, transforms=RandomCrop(32), workers=2, seed=0,
                keep_workers=600)
    with ld:
        next(iter(ld))
        print(*ld.worker_pids(), flush=True)
"""


def test_a_kept_pool_does_not_outlive_its_process(folder, tmp_path):
    script = tmp_path / "keeps.py"
    script.write_text(textwrap.dedent(EXITS))
    out = subprocess.run(
        [sys.executable, str(script), folder], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2 and _gone(pids)
    assert "Traceback" not in out.stderr


def test_chunk_reports_account_for_the_workers_cpu_inside_fill_chunk(folder):
    """Each report carries its chunk's thread CPU inside ``fill_chunk`` (the accounting of
    ``bench/bench_account.py``): summed per worker, it is positive, at most the worker's own
    CPU time, and counts every chunk the worker answered."""
    with Loader(folder, batch_size=8, transforms=RandCrop(32, 32), workers=2) as ld:
        _epoch(ld)
        handles = ld._pool.handles
        assert sum(w.answered for w in handles) == 2 * len(ld)  # a chunk per worker and batch
        for w in handles:
            t = psutil.Process(w.proc.pid).cpu_times()
            assert 0 < w.fill_cpu <= t.user + t.system + 0.02  # clock ticks round the latter
            assert w.fill_faults >= 0 and w.map_cpu >= 0
