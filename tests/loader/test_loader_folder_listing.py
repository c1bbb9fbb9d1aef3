"""A folder source's listing lives once in shared memory: workers map it instead of each
holding a copy, so per-worker memory stays flat as the folder grows."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import psutil
import pytest

from stoker._core.files import scan_folder
from stoker.loader import FolderSource, Loader
from stoker.loader.sources.base import sha

LISTING = "/memfd:stoker-listing"


def _maps(pid: int, what: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any(what in line for line in f)


def _fds(pid: int, what: str) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(what)
        except OSError:
            pass
    return n


def test_files_is_a_sequence_and_the_fingerprint_is_unchanged(folder):
    src = FolderSource(folder)
    rel = [it.rel for it in scan_folder(folder).items]
    assert src.listing == rel and list(src.listing) == rel and len(src.listing) == len(rel)
    assert src.listing[-1] == rel[-1] and src.listing[1:4] == rel[1:4]
    assert src.listing.index(rel[7]) == 7 and rel[3] in src.listing
    old = {"type": "folder", "len": len(rel), "sha": sha("\n".join(rel).encode())}
    assert src.fingerprint() == old
    assert src.file_path(5) == os.path.join(folder, rel[5])
    with pytest.raises(IndexError):
        src.listing[len(rel)]


def test_odd_names_round_trip():
    names = ["a/x.jpg", "b/\udcff-bad-utf8.jpg", "b/line\nbreak.png", "c/ü.jpg", ""]
    src = FolderSource._from_listing("/r", names, [0, 1, 1, 2, 2], ["a", "b", "c"])
    assert list(src.listing) != [] and [src.listing[i] for i in range(5)] == names
    src.share()
    try:
        assert [src.listing[i] for i in range(5)] == names
        copy = pickle.loads(pickle.dumps(src))  # not to a starting process: a full copy
        assert [copy.listing[i] for i in range(5)] == names and not copy.shared
        assert copy.fingerprint() == src.fingerprint()
        assert np.array_equal(copy.labels(), [0, 1, 1, 2, 2])
    finally:
        src.close()


def test_workers_map_the_listing_and_close_its_descriptor(folder):
    from stoker.transforms import Resize

    with Loader(folder, batch_size=8, workers=2, transforms=Resize((16, 16))) as ld:
        assert sum(len(b.images) for b in ld) == 42
        assert ld.source.shared and _fds(os.getpid(), LISTING) == 1
        for pid in ld.worker_pids():
            assert _maps(pid, LISTING) and _fds(pid, LISTING) == 0
    assert _fds(os.getpid(), LISTING) == 0


def _worker_uss(src: FolderSource) -> list[int]:
    """USS of each of 2 workers started over ``src``, once they hold their config."""
    from stoker.transforms import Resize

    ld = Loader(src, batch_size=4, workers=2, transforms=Resize((8, 8)))
    try:
        ld._ensure_running(None)
        pids = ld.worker_pids()
        deadline = time.monotonic() + 30
        while not all(_maps(p, "/memfd:stoker-ring") for p in pids):
            assert time.monotonic() < deadline, "workers did not map the ring"
            time.sleep(0.02)
        return [psutil.Process(p).memory_full_info().uss for p in pids]
    finally:
        ld.close()


@pytest.mark.timeout(120)
def test_per_worker_memory_does_not_grow_with_the_listing(tmp_path):
    n = 400_000  # about 16 MiB of paths, offsets and labels if copied into each worker
    names = [f"class_{i % 10}/some/deeper/folder/image_{i:08d}.jpg" for i in range(n)]
    big = FolderSource._from_listing(str(tmp_path), names, np.arange(n) % 10, ["c"] * 10)
    small = FolderSource._from_listing(str(tmp_path), names[:10], np.arange(10) % 10, ["c"] * 10)
    del names
    base = max(_worker_uss(small))
    grown = max(_worker_uss(big)) - base
    big.close()
    assert grown < 4 << 20, f"a worker grew by {grown / 2**20:.1f} MiB for {n} paths"
