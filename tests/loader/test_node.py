"""Many loaders on one node: eight ranks of three workers each run at once; the preflight of a
new ring counts what the node's other rings have yet to reserve; the doctor reports the node's
total. The registry is real (files and flocks in the node's temporary folder), the loaders are
real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import stoker
from stoker._core.errors import SharedMemoryError
from stoker.doctor import system as S
from stoker.loader import _node, _shm, node_loaders
from stoker.transforms import Compose, Normalize, Resize

pytestmark = pytest.mark.timeout(180)

RANKS, WORKERS = 8, 3

RANK = (
    textwrap.dedent(
        """
    import json, os, sys, time
    import stoker
    manifest, rank, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    kw = dict(batch_size=8, workers=WORKERS, shuffle=True, seed=1, rank=rank, world_size=RANKS)
    with stoker.Loader(manifest, **kw) as ld:
        it = iter(ld)
        n = len(next(it).labels)
        ld.worker_pids()  # waits for the workers: a fresh process's first batch may come first
        open(os.path.join(folder, f"ready-{rank}"), "w").close()
        def wait(name):
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(folder, name)):
                assert time.monotonic() < deadline, "no " + name
                time.sleep(0.02)

        wait("look")  # every rank holds its ring: each lists the node's loaders
        seen = [d["pid"] for d in stoker.loader.node_loaders()]
        open(os.path.join(folder, f"seen-{rank}"), "w").close()
        wait("go")  # every rank has looked: each finishes its epoch
        n += sum(len(b.labels) for b in it)
    print(json.dumps({"rank": rank, "samples": n, "seen": seen, "pid": os.getpid()}))
    """
    )
    .replace("WORKERS", str(WORKERS))
    .replace("RANKS", str(RANKS))
)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("node")
    stoker.make_sample_data(root / "img", classes=4, per_class=20, size=24, seed=2, workers=1)
    stoker.pack(root / "img", root / "set" / "train", workers=1, progress=False)
    return str(root / "set" / "train.stoker.json")


def test_eight_loaders_of_three_workers_at_once(small_set, tmp_path):
    import json

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, small_set, str(r), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(RANKS)
    ]
    try:
        deadline = time.monotonic() + 150
        while sum(os.path.exists(tmp_path / f"ready-{r}") for r in range(RANKS)) < RANKS:
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, dead[0].communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the ranks did not all start"
            time.sleep(0.05)
        # all eight hold their rings: the doctor sees the node's total
        check = S.check_node()
        pids = {p.pid for p in procs}
        assert check.data is not None
        assert check.data["loaders"] >= RANKS and check.data["workers"] >= RANKS * WORKERS
        assert check.data["processes"] >= RANKS * (WORKERS + 1)
        assert check.data["ring_bytes"] > 0 and check.data["fds"] > 0
        assert check.data["rss_bytes"] > 0 and check.data["pss_bytes"] > 0
        listed = node_loaders()
        assert pids <= {d["pid"] for d in listed}, (
            sorted(pids),
            listed,
            os.listdir(_node.registry_dir()),
        )
        assert f"{check.data['loaders']} loader(s) running on this node" in check.message
        (tmp_path / "look").touch()
        while sum(os.path.exists(tmp_path / f"seen-{r}") for r in range(RANKS)) < RANKS:
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, dead[0].communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the ranks did not all look"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    got = [json.loads(out) for out, _ in outs]
    assert sum(g["samples"] for g in got) == 80  # exactly once over the ranks (80 = 8 x 10)
    for g in got:  # each rank saw every rank's ring registered
        assert pids <= set(g["seen"])
    assert not pids & {d["pid"] for d in node_loaders()}  # gone with their processes


HOLDER = textwrap.dedent(
    """
    import sys, time
    from stoker.loader import _node
    entry = _node.preflight_and_register(
        int(sys.argv[1]), slots=4, workers=2, what="a held ring", check=False
    )
    print("registered", flush=True)
    time.sleep(300)
    """
)


def test_the_preflight_counts_what_other_rings_have_yet_to_reserve(tmp_path):
    avail = _shm.memory_available_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(int(0.7 * avail))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "registered"
        # a ring of about half the memory available: it fits alone, not beside the held one
        row = 3 * 1024 * 1024 * 4  # float32 CHW 1024 x 1024
        batch = max(1, int(0.5 * avail / 4 / row))
        x = np.zeros((4, 32, 32, 3), np.uint8)
        chain = Compose([Resize((1024, 1024)), Normalize(layout="CHW")])
        with stoker.Loader((x, np.zeros(4)), batch_size=batch, workers=1, transforms=chain) as ld:
            with pytest.raises(SharedMemoryError) as e:
                next(iter(ld))
            assert ld._ring is None
        text = str(e.value)
        assert "1 other loader(s) on this node" in text and str(holder.pid) in text
        assert "have yet to reserve" in text
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    # a killed holder's entry is gone at the next look
    assert holder.pid not in {r.pid for r in _node.live_rings()}
