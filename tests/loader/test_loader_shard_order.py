"""Loader(shuffle="shards") over a real packed set of unequal shards: the same batches for any
worker count, exact mid-epoch resume, equal steps on every rank, and the refused combinations."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
from loader_helpers import RandCrop, make_folder

import stoker
from stoker.loader import Loader
from stoker.sampling import ClassBalanced, LengthBuckets, ShardOrder

KW = dict(batch_size=4, transforms=RandCrop(16, 20), shuffle="shards", seed=5)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    """37 records in 7 shards of unequal sizes: 40 images packed 6 to a shard, three of them
    not images (rejected, so their shards come out short)."""
    root = tmp_path_factory.mktemp("shards")
    make_folder(str(root / "img"), n=40, size=(24, 28))
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root / "img") for f in fs)
    for f in (files[1], files[2], files[20]):
        with open(f, "wb") as fh:
            fh.write(b"not an image")
    report = stoker.pack(root / "img", root / "train", workers=1, progress=False, shard_size=6)
    assert report.written == 37
    return report.manifest


def epoch(loader):
    return [(b.epoch, b.number, b.indices.copy(), b.images.copy()) for b in loader]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[:2] == y[:2]
        np.testing.assert_array_equal(x[2], y[2])
        np.testing.assert_array_equal(x[3], y[3])


def test_the_set_has_unequal_shards(packed):
    with Loader(packed, batch_size=4, workers=0) as ld:
        sizes = ld.source.shard_sizes()
    assert len(sizes) == 7 and sum(sizes) == 37 and len(set(sizes.tolist())) > 1


def test_the_order_is_the_samplers_and_the_same_for_any_worker_count(packed):
    with Loader(packed, workers=0, **KW) as ld:
        ref = epoch(ld) + epoch(ld)
        sizes = ld.source.shard_sizes()
        assert isinstance(ld.sampler, ShardOrder)
    expected = ShardOrder(sizes, seed=5).indices(1)
    np.testing.assert_array_equal(np.concatenate([b[2] for b in ref if b[0] == 1]), expected)
    with Loader(packed, workers=2, **KW) as ld:
        same(epoch(ld) + epoch(ld), ref)


@pytest.mark.parametrize("point", [1, 4, 12])
def test_mid_epoch_resume_gives_exactly_the_remaining_batches(packed, point):
    with Loader(packed, workers=0, **KW) as ld:
        ref = epoch(ld) + epoch(ld)
    with Loader(packed, workers=2, **KW) as ld:
        head = []
        for _ in range(2):
            for b in ld:
                head.append((b.epoch, b.number, b.indices.copy(), b.images.copy()))
                if len(head) == point:
                    break
            if len(head) == point:
                break
        state = json.loads(json.dumps(ld.state_dict()))
    assert state["sampler"]["type"] == "ShardOrder"
    with Loader(packed, workers=1, **dict(KW, seed=None)) as ld2:
        ld2.load_state_dict(state)
        tail = []
        while len(head) + len(tail) < len(ref):
            tail.extend(epoch(ld2))
    same(head + tail, ref)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_same_number_of_batches(packed, world):
    loaders = [Loader(packed, workers=0, rank=r, world_size=world, **KW) for r in range(world)]
    try:
        runs = [[epoch(ld) for _ in range(3)] for ld in loaders]
        samplers = [ld.sampler for ld in loaders]
    finally:
        for ld in loaders:
            ld.close()
    sizes = samplers[0].shard_sizes
    where = np.repeat(np.arange(len(sizes)), sizes)
    for e in range(3):
        steps = {len(run[e]) for run in runs}
        assert steps == {len(loaders[0])}  # equal steps: no rank waits on a collective alone
        owners = samplers[0].owners(e)
        seen = Counter()
        for r, run in enumerate(runs):
            got = np.concatenate([b[2] for b in run[e]])
            assert set(owners[where[got]].tolist()) == {r}  # only its own shards
            seen.update(got.tolist())
        assert set(seen) == set(range(37))  # exactly once, up to the declared padding
        assert sum(seen.values()) - 37 == samplers[0].padding


def test_drop_last_cuts_every_rank_to_the_same_steps(packed):
    runs = []
    for r in range(3):
        with Loader(packed, workers=0, rank=r, world_size=3, drop_last=True, **KW) as ld:
            runs.append(epoch(ld))
            dropped = ld.sampler.dropped
    assert len({len(run) for run in runs}) == 1
    got = np.concatenate([b[2] for run in runs for b in run])
    assert len(got) == len(set(got.tolist()))  # nothing twice
    assert len(got) <= 37 - dropped


def test_a_shard_order_with_another_window_goes_through_sampler(packed):
    with Loader(packed, batch_size=4, workers=0) as ld:
        sizes = ld.source.shard_sizes()
    order = ShardOrder(sizes, seed=2, window=1)
    with Loader(packed, batch_size=4, workers=0, sampler=order) as ld:
        got = np.concatenate([b.indices for b in ld])
    np.testing.assert_array_equal(got, order.indices(0))


@pytest.mark.parametrize("kind", ["balanced", "buckets", "shards"])
def test_sampler_with_shard_shuffle_is_refused(packed, kind):
    with Loader(packed, batch_size=4, workers=0) as ld:
        labels, sizes = ld.source.labels(), ld.source.shard_sizes()
    sampler = {
        "balanced": lambda: ClassBalanced(labels),
        "buckets": lambda: LengthBuckets(np.arange(1, 38), batch_size=4, num_buckets=2),
        "shards": lambda: ShardOrder(sizes),
    }[kind]()
    why = "already is a ShardOrder" if kind == "shards" else "each batch would touch every shard"
    with pytest.raises(ValueError, match=rf'shuffle="shards" and sampler=\w+.*{why}'):
        Loader(packed, batch_size=4, workers=0, sampler=sampler, shuffle="shards")


def test_a_source_without_shards_is_refused(folder, arrays):
    with pytest.raises(ValueError, match=rf"FolderSource {folder} has none.*shuffle=True"):
        Loader(folder, batch_size=4, workers=0, shuffle="shards")
    with pytest.raises(ValueError, match="ArraySource has none"):
        Loader(arrays, batch_size=4, workers=0, shuffle="shards")


def test_fewer_shards_than_ranks_is_refused(packed):
    with pytest.raises(ValueError, match="world_size=8; repack it with smaller shards"):
        Loader(packed, batch_size=4, workers=0, shuffle="shards", rank=0, world_size=8)


def test_an_unknown_shuffle_word_is_refused(packed):
    with pytest.raises(ValueError, match='shuffle must be False, True or "shards"'):
        Loader(packed, batch_size=4, workers=0, shuffle="shard")
