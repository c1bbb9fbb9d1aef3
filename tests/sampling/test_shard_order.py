"""ShardOrder: shard-aware order with equal steps on every rank (pure, no processes)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import ShardOrder
from stoker.sampling.shards import slot_loads

SETTINGS = settings(max_examples=120, deadline=None)

shard_lists = st.lists(st.integers(0, 40), min_size=1, max_size=24)


def shard_of(sizes: list[int]) -> np.ndarray:
    """The shard of every global position."""
    return np.repeat(np.arange(len(sizes)), sizes)


def ranks(sizes, world, **kw):
    return [ShardOrder(sizes, rank=r, world_size=world, **kw) for r in range(world)]


def own_prefix(order: np.ndarray) -> np.ndarray:
    """A rank's order up to its padding (the first repeated sample starts the wrap)."""
    seen: set[int] = set()
    for i, x in enumerate(order.tolist()):
        if x in seen:
            return order[:i]
        seen.add(x)
    return order


def check_epoch(samplers, sizes, epoch):
    """The promises of one epoch over all ranks; returns the ranks' orders."""
    n, where = sum(sizes), shard_of(sizes)
    s0 = samplers[0]
    parts = [s.indices(epoch) for s in samplers]
    assert {len(p) for p in parts} == {len(s0)}  # equal steps on every rank
    owners = s0.owners(epoch)
    for s in samplers:
        assert np.array_equal(s.owners(epoch), owners)  # every rank agrees on the split
    for r, p in enumerate(parts):
        # a rank reads only its own shards, and each of them in full unless cut by drop_last
        assert set(where[p].tolist()) <= set(np.flatnonzero(owners == r).tolist())
        mine = samplers[r].rank_shards(epoch)
        assert sorted(mine.tolist()) == np.flatnonzero(owners == r).tolist()
    counts = Counter(np.concatenate(parts).tolist())
    if s0.drop_last:
        assert max(counts.values(), default=1) == 1  # nothing twice
        assert n - len(counts) == s0.dropped
    else:
        assert set(counts) == set(range(n))  # every sample, and each shard on one rank only
        assert sum(counts.values()) - n == s0.padding
    return parts


@SETTINGS
@given(
    sizes=shard_lists,
    world=st.integers(1, 5),
    drop_last=st.booleans(),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
def test_equal_steps_and_exactly_once(sizes, world, drop_last, window, seed):
    if np.count_nonzero(sizes) < world:
        with pytest.raises(ValueError, match="repack it with smaller shards"):
            ShardOrder(sizes, world_size=world)
        return
    samplers = ranks(sizes, world, drop_last=drop_last, window=window, seed=seed)
    first = [check_epoch(samplers, sizes, e) for e in range(3)]
    loads = slot_loads(sizes, world)
    assert len(samplers[0]) == (loads.min() if drop_last else loads.max())
    assert loads.max() - loads.min() <= max(sizes)  # as even as whole shards allow
    again = ShardOrder(sizes, seed=seed, world_size=world, drop_last=drop_last, window=window)
    assert np.array_equal(again.indices(2), first[2][0])  # a pure function of (seed, epoch)


@SETTINGS
@given(sizes=shard_lists, world=st.integers(1, 5), window=st.integers(1, 6))
def test_at_most_window_shards_open(sizes, world, window):
    """At any point of a rank's order at most ``window`` of its shards are begun and not
    finished: what bounds the cache a rank needs."""
    if np.count_nonzero(sizes) < world:
        return
    where = shard_of(sizes)
    for s in ranks(sizes, world, window=window, seed=7):
        seq = where[own_prefix(s.indices(1))]
        if seq.size == 0:
            continue
        last = {j: i for i, j in enumerate(seq.tolist())}
        open_now: set[int] = set()
        for i, j in enumerate(seq.tolist()):
            open_now.add(j)
            assert len(open_now) <= window
            if last[j] == i:
                open_now.discard(j)


def test_one_rank_with_a_wide_window_is_a_permutation():
    sizes = [7, 3, 0, 9, 5]
    s = ShardOrder(sizes, window=len(sizes), seed=3)
    for e in range(3):
        assert sorted(s.indices(e).tolist()) == list(range(sum(sizes)))
    assert (s.padding, s.dropped) == (0, 0)


def test_window_mixes_shards_and_one_shard_window_keeps_them_apart():
    sizes = [50] * 8
    where = shard_of(sizes)
    narrow = where[ShardOrder(sizes, window=1, seed=1).indices(0)]
    assert (np.diff(narrow) != 0).sum() == 7  # one shard after another
    wide = where[ShardOrder(sizes, window=4, seed=1).indices(0)]
    assert len(set(wide[:50].tolist())) == 4  # the first window draws from four shards


def test_epochs_and_seeds_differ():
    sizes = [30, 30, 30, 30, 30, 17]
    s = ShardOrder(sizes, world_size=2, seed=5)
    assert not np.array_equal(s.indices(0), s.indices(1))
    assert not np.array_equal(s.owners(0), s.owners(1)) or not np.array_equal(
        s.rank_shards(0), s.rank_shards(1)
    )
    other = ShardOrder(sizes, world_size=2, seed=6)
    assert not np.array_equal(s.indices(0), other.indices(0))
    # over epochs every shard is read by each rank some time (the split changes)
    seen = {(int(j), int(r)) for e in range(20) for j, r in enumerate(s.owners(e))}
    assert seen == {(j, r) for j in range(len(sizes)) for r in range(2)}


def test_padding_figures_on_a_packed_set():
    """A packed set: equal shards but the last. The padding is what whole shards force."""
    sizes = [1000] * 9 + [400]  # 9,400 samples in 10 shards
    two = ShardOrder(sizes, world_size=2)
    assert (len(two), two.padding) == (5000, 600)
    assert ShardOrder(sizes, world_size=2, drop_last=True).dropped == 600
    three = ShardOrder(sizes, world_size=3)
    assert (len(three), three.padding) == (3400, 800)
    four = ShardOrder(sizes, world_size=4, drop_last=True)
    assert (len(four), four.dropped) == (2000, 1400)


def test_length_is_the_same_every_epoch_for_uneven_shards():
    sizes = [13, 2, 8, 8, 1, 21, 5, 5, 9]
    for world in (2, 3, 4):
        for drop_last in (False, True):
            rs = ranks(sizes, world, drop_last=drop_last, seed=11)
            for e in range(10):
                assert {len(s.indices(e)) for s in rs} == {len(rs[0])}


def test_fewer_shards_than_ranks_is_refused():
    with pytest.raises(ValueError, match=r"2 non-empty shards for world_size=3.*shuffle=True"):
        ShardOrder([10, 0, 10], world_size=3)


@pytest.mark.parametrize(
    "bad, err",
    [([[1, 2]], ValueError), ([1.5, 2.0], TypeError), ([3, -1], ValueError)],
)
def test_bad_shard_sizes(bad, err):
    with pytest.raises(err):
        ShardOrder(bad)


def test_bad_window():
    with pytest.raises(ValueError, match="window"):
        ShardOrder([3, 3], window=0)


def test_fingerprint_names_everything_that_changes_the_order():
    base = ShardOrder([4, 5, 6], seed=1, world_size=2, rank=1)
    fp = base.fingerprint()
    json.dumps(fp)
    assert fp["type"] == "ShardOrder"
    variants = [
        ShardOrder([4, 5, 7], seed=1, world_size=2, rank=1),
        ShardOrder([4, 5, 6], seed=2, world_size=2, rank=1),
        ShardOrder([4, 5, 6], seed=1, world_size=2, rank=0),
        ShardOrder([4, 5, 6], seed=1, world_size=3, rank=1),
        ShardOrder([4, 5, 6], seed=1, world_size=2, rank=1, drop_last=True),
        ShardOrder([4, 5, 6], seed=1, world_size=2, rank=1, window=2),
    ]
    assert all(v.fingerprint() != fp for v in variants)


def test_iterates_like_a_torch_sampler():
    s = ShardOrder([3, 4], seed=2)
    s.set_epoch(1)
    assert list(s) == s.indices(1).tolist()


def most_open(seq: np.ndarray) -> int:
    """The most units (shards, blocks) of ``seq`` begun and not finished at any point."""
    last = {j: i for i, j in enumerate(seq.tolist())}
    open_now: set[int] = set()
    most = 0
    for i, j in enumerate(seq.tolist()):
        open_now.add(j)
        most = max(most, len(open_now))
        if last[j] == i:
            open_now.discard(j)
    return most


@SETTINGS
@given(
    shards=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=5), min_size=1, max_size=12),
    world=st.integers(1, 3),
    window=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_blocks_window_by_block_inside_the_same_split(shards, world, window, drop_last, seed):
    """Shards read in blocks: a rank reads the shards the plain order deals it, every
    promise of an epoch kept, and at any point at most ``window`` blocks (so at most
    ``window`` shards) are begun and not finished."""
    sizes = [sum(b) for b in shards]
    if np.count_nonzero(sizes) < world:
        return
    blocks = [n for b in shards for n in b]
    block_of = np.repeat(np.arange(len(blocks)), blocks)
    kw = {"window": window, "seed": seed, "drop_last": drop_last}
    samplers = ranks(sizes, world, blocks=blocks, **kw)
    for epoch in range(2):
        check_epoch(samplers, sizes, epoch)
        for s, plain in zip(samplers, ranks(sizes, world, **kw), strict=True):
            assert np.array_equal(s.rank_shards(epoch), plain.rank_shards(epoch))
            mine = own_prefix(s.indices(epoch))
            assert most_open(block_of[mine]) <= window
            assert most_open(shard_of(sizes)[mine]) <= window


def test_blocks_keep_a_window_inside_few_blocks():
    """Four shards of two blocks of 4 and a window of 2: every 8 positions of the order read
    2 blocks (windows of whole shards would mix 4 blocks)."""
    s = ShardOrder([8, 8, 8, 8], blocks=[4] * 8, window=2, seed=5)
    for epoch in range(3):
        order = s.indices(epoch)
        assert sorted(order.tolist()) == list(range(32))
        for w in range(0, 32, 8):
            assert len(set((order[w : w + 8] // 4).tolist())) == 2
    assert ShardOrder([8, 8, 8, 8], window=2, seed=5).fingerprint() != s.fingerprint()


def test_blocks_that_cross_a_shard_are_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        ShardOrder([6, 6], blocks=[4, 4, 4])
