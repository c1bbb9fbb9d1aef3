"""A set read from object storage (moto's S3 server on loopback, through s3fs) gives exactly the
batches of the same set on local disk: any worker count, ranks, shard order, a mid-epoch resume,
a cache smaller than the set, and faults on the way."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

import stoker
from stoker._core.errors import size_text
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

pytestmark = pytest.mark.timeout(120)


def _batches(ld) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    with ld:
        return [(b.images.copy(), np.asarray(b.labels).copy(), b.keys.copy()) for b in ld]


def _same(a, b) -> None:
    assert len(a) == len(b) and len(a) > 0
    for (xa, ya, ka), (xb, yb, kb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def _rec_bytes(manifest: str) -> list[int]:
    with open(manifest) as f:
        return [s["bytes"] for s in json.load(f)["shards"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [True, "shards"])
def test_same_batches_as_local_disk(remote_set, cache_dir, workers, shuffle):
    kw = dict(batch_size=8, seed=11, shuffle=shuffle, workers=workers)
    want = _batches(stoker.Loader(remote_set.local, **kw))
    got = _batches(stoker.Loader(remote_set.url, cache_dir=cache_dir, **kw))
    _same(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, "shards"])
def test_the_portable_engines_spawned_workers_read_the_remote_set(remote_set, cache_dir, shuffle):
    """A remote set crosses to spawned workers as its configuration (URL, cache, claims)."""
    kw = dict(batch_size=8, seed=11, shuffle=shuffle, workers=2)
    want = _batches(stoker.Loader(remote_set.local, **kw))
    got = _batches(stoker.Loader(remote_set.url, cache_dir=cache_dir, engine="portable", **kw))
    _same(got, want)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_what_they_read_locally_with_equal_steps(remote_set, cache_dir, world):
    counts = set()
    for rank in range(world):
        kw = dict(batch_size=4, seed=5, shuffle="shards", rank=rank, world_size=world, workers=0)
        want = _batches(stoker.Loader(remote_set.local, **kw))
        got = _batches(stoker.Loader(remote_set.url, cache_dir=cache_dir, **kw))
        _same(got, want)
        counts.add(len(got))
    assert len(counts) == 1  # every rank takes the same number of steps


def test_mid_epoch_resume_continues_with_the_local_batches(remote_set, cache_dir):
    kw = dict(batch_size=6, seed=2, shuffle=True, workers=2)
    want = _batches(stoker.Loader(remote_set.local, **kw))
    with stoker.Loader(remote_set.url, cache_dir=cache_dir, **kw) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    text = json.dumps(state)
    assert FAKE_SECRET_ACCESS_KEY not in text and FAKE_ACCESS_KEY_ID not in text
    again = stoker.Loader(remote_set.url, cache_dir=cache_dir, **kw)
    again.load_state_dict(state)
    _same(_batches(again), want[3:])


def _counts(manifest: str) -> list[int]:
    with open(manifest) as f:
        return [s["records"] for s in json.load(f)["shards"]]


def _cache_bytes(root: str) -> int:
    total = 0
    for folder, _, names in os.walk(root):
        for n in names:
            try:
                total += os.stat(os.path.join(folder, n)).st_size
            except FileNotFoundError:
                pass
    return total


def test_a_cache_smaller_than_the_set_stays_within_its_budget(remote_set, cache_dir):
    sizes = _rec_bytes(remote_set.local)
    limit = int(sum(sizes) * 0.49)  # under half the set: about seven of its 15 shards
    assert 6.5 * max(sizes) < limit < sum(sizes) / 2
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            # the budgeted files: entries and downloads in progress (manifest copies, a few KB
            # each, are kept beside them outside the budget)
            used = sum(_cache_bytes(os.path.join(cache_dir, d)) for d in ("entries", "tmp"))
            peak[0] = max(peak[0], used)
            time.sleep(0.002)

    # the two batches in flight read at most four shards (two windows of two), one downloads
    # ahead: five shards' room is claimed, of the about six that fit
    order = stoker.sampling.ShardOrder(np.array(_counts(remote_set.local)), seed=4, window=2)
    kw = dict(batch_size=4, sampler=order, workers=2, prefetch=1, prefetch_shards=1)
    want = _batches(stoker.Loader(remote_set.local, **kw))
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        for _ in range(2):  # a second run finds some shards evicted and fetches them again
            ld = stoker.Loader(remote_set.url, cache_dir=cache_dir, cache_limit=limit, **kw)
            _same(_batches(ld), want)
    finally:
        stop.set()
        t.join()
    assert 0 < peak[0] <= limit


def test_a_missing_shard_is_named_before_any_batch(remote_set, cache_dir):
    from stoker.storage.remote import Remote

    gone = remote_set.key_url("train-00002.rec")
    Remote(gone).remove(gone)
    with pytest.raises(FileNotFoundError, match="train-00002.rec") as e:
        stoker.Loader(remote_set.url, batch_size=4, cache_dir=cache_dir, workers=0)
    assert FAKE_SECRET_ACCESS_KEY not in str(e.value)


def test_a_corrupt_cached_shard_is_fetched_again(remote_set, cache_dir):
    kw = dict(batch_size=8, seed=1, shuffle=True, workers=0, cache_dir=cache_dir)
    want = _batches(stoker.Loader(remote_set.url, **kw))
    entries = os.path.join(cache_dir, "entries")
    recs = sorted(n for n in os.listdir(entries) if n.endswith(".rec.data"))
    assert recs
    victim = os.path.join(entries, recs[0])
    with open(victim, "r+b") as f:  # same size, one byte changed
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with open(victim, "ab") as f:  # and then longer than the manifest says
        f.write(b"x")
    _same(_batches(stoker.Loader(remote_set.url, **kw)), want)
    assert os.path.getsize(victim) == _size_in_manifest(remote_set.local, recs[0])


def _size_in_manifest(manifest: str, cached_name: str) -> int:
    with open(manifest) as f:
        for s in json.load(f)["shards"]:
            if cached_name.endswith(s["files"]["data"] + ".data"):
                return int(s["bytes"])
    raise AssertionError(cached_name)


def test_record_dataset_reads_a_remote_set_as_the_local_one(remote_set, cache_dir):
    torch = pytest.importorskip("torch")
    from stoker.torch import RecordDataset

    local = RecordDataset(remote_set.local)
    remote = RecordDataset(remote_set.url, cache_dir=cache_dir, storage_options=None)
    assert len(remote) == len(local) == 60
    for i in (0, 17, 59):
        (xa, ya), (xb, yb) = local[i], remote[i]
        assert ya == yb
        torch.testing.assert_close(xa, xb)
    loader = torch.utils.data.DataLoader(remote, batch_size=16, num_workers=2)
    assert sum(len(y) for _, y in loader) == 60


def test_shards_stay_open_only_when_the_cache_holds_the_set(remote_set, cache_dir, monkeypatch):
    from stoker.formats.recordio.shard import RecordIOShard

    opens = []
    real = RecordIOShard._file

    def counted(self):
        if self.file is None:  # the shard's files held and mapped (again)
            opens.append(self.files._j)
        return real(self)

    monkeypatch.setattr(RecordIOShard, "_file", counted)
    sizes = _rec_bytes(remote_set.local)
    small = int(sum(sizes) * 0.49)
    for shuffle, limit, batch in ((True, None, 20), (False, small, 4)):
        opens.clear()
        kw = dict(batch_size=batch, seed=6, shuffle=shuffle, workers=0)
        with stoker.Loader(remote_set.url, cache_dir=cache_dir, cache_limit=limit, **kw) as ld:
            remote = ld.source.remote().shards
            most = 0
            for _ in ld:
                most = max(most, len(remote.held()))
        if limit is None:  # the cache holds the set: each shard opened once and kept open
            # (shard 0 twice more: after the label probe and after reading the schema)
            assert most == 15 and len(opens) <= 17
        else:  # it does not: a batch of 4 touches two shards at most, opened in order
            assert most <= 2
            # once each, after the label, schema and image size probes (shards 0, 0, 0, 1)
            assert opens[-15:] == list(range(15)) and len(opens) <= 19, opens


def test_a_global_shuffle_over_a_cache_smaller_than_the_set_is_refused_at_open(
    remote_set, cache_dir
):
    sizes = _rec_bytes(remote_set.local)
    small = int(sum(sizes) * 0.49)
    for workers in (0, 2):
        with pytest.raises(stoker.CacheFullError) as e:
            stoker.Loader(
                remote_set.url, batch_size=8, shuffle=True, workers=workers,
                cache_dir=cache_dir, cache_limit=small,
            )  # fmt: skip
        text = str(e.value)
        assert f"budget is {size_text(small)}" in text and 'shuffle="shards"' in text
        assert "whole set" in text and "cache_limit" in text
    claims = os.path.join(cache_dir, "claims")  # refused before claiming: nothing left claimed
    assert not os.path.isdir(claims) or not os.listdir(claims)
