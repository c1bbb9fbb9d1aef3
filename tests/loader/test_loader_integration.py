"""Where the loader meets the other rooms: insightface record sets, the stall watchdog's
worker hook, and chains whose branches differ."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from loader_helpers import jpeg_bytes

import stoker
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.transforms import RandomChoice, RandomCrop, Resize


def _insightface_rec(tmp_path, n_ids: int = 3, per_id: int = 4) -> tuple[str, int]:
    """An MS1M-style set: record 0 is a header whose labels give the image-key range [1, n+1)
    and the identity-key range; identity records after the images carry [start, end) ranges."""
    rec = str(tmp_path / "faces.rec")
    n = n_ids * per_id
    rng = np.random.default_rng(0)
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(2, np.array([n + 1, n + 1 + n_ids], np.float32), 0, 0)))
        for k in range(1, n + 1):
            img = jpeg_bytes(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
            w.write(k, pack_header(IRHeader(0, float((k - 1) // per_id), k, 0), img))
        for i in range(n_ids):
            start = 1 + i * per_id
            label = np.array([start, start + per_id], np.float32)
            w.write(n + 1 + i, pack_header(IRHeader(2, label, 0, 0)))
    return rec, n


def test_loader_reads_only_the_images_of_an_insightface_set(tmp_path):
    rec, n = _insightface_rec(tmp_path)
    with stoker.Loader(rec, batch_size=5, transforms=Resize((16, 16)), workers=0) as loader:
        keys, labels = [], []
        for batch in loader:
            keys.extend(batch.keys.tolist())
            labels.extend(batch.labels.tolist())
    assert sorted(keys) == list(range(1, n + 1))
    assert labels == [(k - 1) // 4 for k in keys]


def test_workers_survive_the_watchdogs_stack_request(tmp_path):
    """SIGUSR1 (sent by stoker.watch's stall watchdog) makes a worker print its stack on the
    stderr it inherited; without the handler the signal would kill it."""
    x = np.zeros((64, 8, 8, 3), np.uint8)
    y = np.arange(64)
    with stoker.Loader((x, y), batch_size=8, workers=2) as loader:
        it = iter(loader)
        next(it)
        pids = loader.worker_pids()
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
        assert loader.worker_pids() == pids
        rest = sum(1 for _ in it)
    assert rest == 7  # nothing lost: the workers survived the signal
    assert loader.worker_pids() == []


def test_a_chain_whose_branches_differ_in_size_is_refused_before_any_data_flows(tmp_path):
    x = np.zeros((8, 20, 20, 3), np.uint8)
    chain = RandomChoice([Resize((10, 10)), Resize((12, 12))])
    with pytest.raises(stoker.SpecError):
        stoker.Loader((x, np.arange(8)), batch_size=4, transforms=chain, workers=0)
    # the same branches followed by a fixed crop are fine
    from stoker.transforms import Compose

    ok = Compose([chain, RandomCrop(8)])
    with stoker.Loader((x, np.arange(8)), batch_size=4, transforms=ok, workers=0) as loader:
        assert next(iter(loader)).images.shape == (4, 8, 8, 3)
