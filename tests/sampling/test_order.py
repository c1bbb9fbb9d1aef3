"""EpochOrder, Subset and split_for_rank: the multi-rank rules (faults.md B6 #57, #58)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import EpochOrder, Subset, split_for_rank

SETTINGS = settings(max_examples=150, deadline=None)


def check_rank_algebra(samplers, epoch, universe):
    """Per-rank lengths equal; interleaving the ranks gives the global order, whose first
    len(universe) - dropped entries hold each sample once, followed by `padding` repeats."""
    parts = [s.indices(epoch) for s in samplers]
    s0 = samplers[0]
    lengths = {len(p) for p in parts}
    assert lengths == {len(s0)}
    glob = np.stack(parts, axis=1).reshape(-1) if parts[0].size else np.zeros(0, np.int64)
    n = len(universe)
    assert len(glob) == n + s0.padding - s0.dropped
    assert s0.padding <= max(len(samplers) - 1, 0) and s0.dropped <= len(samplers) - 1
    head = glob[: n - s0.dropped]
    assert len(set(head.tolist())) == len(head)  # disjoint before padding
    assert set(head.tolist()) <= set(universe)
    counts = Counter(glob.tolist())
    if s0.drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(set(universe) - set(counts)) == s0.dropped
    else:
        assert set(counts) == set(universe)  # union over ranks == dataset
        assert sum(counts.values()) - n == s0.padding
    return glob


@SETTINGS
@given(
    n=st.integers(1, 500),
    world=st.integers(1, 8),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_epoch_order_rank_algebra(n, world, drop_last, shuffle, seed):
    samplers = [
        EpochOrder(n, shuffle=shuffle, seed=seed, rank=r, world_size=world, drop_last=drop_last)
        for r in range(world)
    ]
    orders = [check_rank_algebra(samplers, e, range(n)) for e in range(3)]
    again = EpochOrder(n, shuffle=shuffle, seed=seed, rank=0, world_size=world, drop_last=drop_last)
    assert np.array_equal(again.indices(1), samplers[0].indices(1))  # pure function of seed/epoch
    if not shuffle:
        assert all(np.array_equal(o, orders[0]) for o in orders)


@SETTINGS
@given(n=st.integers(20, 500), world=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_epochs_and_seeds_differ(n, world, seed):
    s = EpochOrder(n, shuffle=True, seed=seed, world_size=world)
    assert not np.array_equal(s.indices(0), s.indices(1))
    other = EpochOrder(n, shuffle=True, seed=seed + 1, world_size=world)
    assert not np.array_equal(s.indices(0), other.indices(0))


def test_padding_and_dropped_are_declared():
    s = EpochOrder(10, world_size=4)
    assert (len(s), s.padding, s.dropped) == (3, 2, 0)
    d = EpochOrder(10, world_size=4, drop_last=True)
    assert (len(d), d.padding, d.dropped) == (2, 0, 2)
    assert [EpochOrder(10, world_size=4, rank=r).indices(0).tolist() for r in range(4)] == [
        [0, 4, 8],
        [1, 5, 9],
        [2, 6, 0],
        [3, 7, 1],
    ]
    tiny = EpochOrder(2, world_size=8)  # fewer samples than ranks: every rank still gets one
    assert len(tiny) == 1 and tiny.padding == 6
    assert EpochOrder(0, world_size=3).indices(0).size == 0


@SETTINGS
@given(
    positions=st.lists(st.integers(0, 10_000), min_size=1, max_size=300, unique=True),
    world=st.integers(1, 8),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_subset_rank_algebra(positions, world, drop_last, shuffle):
    samplers = [
        Subset(positions, shuffle=shuffle, seed=7, rank=r, world_size=world, drop_last=drop_last)
        for r in range(world)
    ]
    for e in range(2):
        check_rank_algebra(samplers, e, positions)


def test_iteration_and_set_epoch_follow_torch_conventions():
    s = EpochOrder(50, shuffle=True, seed=3)
    assert list(s) == s.indices(0).tolist()
    s.set_epoch(2)
    assert list(s) == s.indices(2).tolist()
    assert all(type(i) is int for i in s)
    with pytest.raises(ValueError, match="epoch"):
        s.set_epoch(-1)


def test_fingerprint_is_json_and_tells_configurations_apart():
    a = EpochOrder(100, shuffle=True, seed=1).fingerprint()
    assert json.loads(json.dumps(a)) == a
    assert a != EpochOrder(100, shuffle=True, seed=2).fingerprint()
    b = Subset([1, 2, 3], seed=1).fingerprint()
    assert json.loads(json.dumps(b)) == b
    assert b != Subset([1, 2, 4], seed=1).fingerprint()


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n": -1}, ValueError, "n must be >= 0"),
        ({"n": 3.5}, TypeError, "n must be an int"),
        ({"n": 5, "world_size": 0}, ValueError, "world_size"),
        ({"n": 5, "rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size=2\)"),
        ({"n": 5, "seed": None}, TypeError, "seed must be an int"),
        ({"n": 5, "seed": -3}, ValueError, "seed"),
        ({"n": True}, TypeError, "n must be an int"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    n = kwargs.pop("n")
    with pytest.raises(exc, match=match):
        EpochOrder(n, **kwargs)


def test_bad_epoch_and_subset_arguments():
    with pytest.raises(ValueError, match="epoch"):
        EpochOrder(5).indices(-1)
    with pytest.raises(TypeError, match="integers"):
        Subset([0.5, 1.5])
    with pytest.raises(ValueError, match=">= 0"):
        Subset([3, -1])
    with pytest.raises(ValueError, match="rank"):
        split_for_rank(np.arange(5), 3, 2, drop_last=False)
