"""``Sampler.shard_span`` bounds what a remote set's cache must hold at once: it must never
be smaller than the real number of shards a run of consecutive positions touches, in any
epoch, on any rank (a smaller bound lets a loader start that can stall)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import ClassBalanced, EpochOrder, ShardOrder


def _most_touched(order: np.ndarray, starts: np.ndarray, run: int) -> int:
    shard = np.searchsorted(starts, order, side="right") - 1
    return max(
        (len(set(shard[i : i + run].tolist())) for i in range(max(1, len(shard) - run + 1))),
        default=0,
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=14),
    window=st.integers(1, 5),
    world=st.integers(1, 3),
    drop_last=st.booleans(),
    run=st.integers(1, 30),
    seed=st.integers(0, 3),
)
def test_shard_order_span_is_never_exceeded(sizes, window, world, drop_last, run, seed):
    sizes = np.array(sizes, dtype=np.int64)
    if np.count_nonzero(sizes) < world:
        return
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for rank in range(world):
        s = ShardOrder(sizes, window=window, world_size=world, rank=rank, seed=seed,
                       drop_last=drop_last)  # fmt: skip
        bound = s.shard_span(run, sizes)
        for epoch in range(3):
            assert _most_touched(s.indices(epoch), starts, run) <= bound


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=14),
    world=st.integers(1, 3),
    run=st.integers(1, 30),
)
def test_sequential_order_span_is_never_exceeded(sizes, world, run):
    sizes = np.array(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for rank in range(world):
        s = EpochOrder(int(sizes.sum()), world_size=world, rank=rank)
        assert _most_touched(s.indices(0), starts, run) <= s.shard_span(run, sizes)


def test_orders_that_draw_from_the_whole_set_have_no_span():
    sizes = np.array([4, 4, 4])
    assert EpochOrder(12, shuffle=True).shard_span(4, sizes) is None
    assert ClassBalanced(np.arange(12) % 3).shard_span(4, sizes) is None
    # a run inside one window's records touches at most two windows
    assert ShardOrder([50] * 20, window=4).shard_span(10, np.array([50] * 20)) == 8
    assert EpochOrder(1000).shard_span(10, np.array([50] * 20)) == 2


@settings(max_examples=60, deadline=None)
@given(
    shards=st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=4), min_size=1, max_size=10),
    window=st.integers(1, 4),
    world=st.integers(1, 3),
    drop_last=st.booleans(),
    run=st.integers(1, 30),
)
def test_shard_order_span_with_blocks_is_never_exceeded(shards, window, world, drop_last, run):
    """Windows of blocks: the span still counts the shards a run touches (what a cache holds)."""
    sizes = np.array([sum(b) for b in shards], dtype=np.int64)
    if np.count_nonzero(sizes) < world:
        return
    blocks = [n for b in shards for n in b]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for rank in range(world):
        s = ShardOrder(sizes, window=window, world_size=world, rank=rank, drop_last=drop_last,
                       blocks=blocks)  # fmt: skip
        bound = s.shard_span(run, sizes)
        for epoch in range(2):
            assert _most_touched(s.indices(epoch), starts, run) <= bound
