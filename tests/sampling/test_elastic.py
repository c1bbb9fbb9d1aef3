"""Elastic resume as pure arithmetic: an epoch begun by N ranks and finished by M ranks
delivers every sample once, up to the declared repeats and drops, with equal batch counts on
the new ranks. The loader is simulated the way it slices an order: batch j of a rank is
``order[j*b:(j+1)*b]`` for j from the position to ``len(loader)``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import (
    ClassBalanced,
    ElasticOrder,
    EpochOrder,
    Segment,
    ShardOrder,
    Subset,
    split_rest,
)
from stoker.sampling.elastic import at_rank, configuration, epoch_batches

N = 38
SIZES = [7, 7, 7, 7, 7, 3]  # 38 samples in 6 shards, the last one short
BATCH = 3
EPOCH = 2


def family(shuffle: bool | str, drop_last: bool, seed: int = 11):
    if shuffle == "shards":
        return ShardOrder(SIZES, seed=seed, drop_last=drop_last, window=2)
    return EpochOrder(N, shuffle=bool(shuffle), seed=seed, drop_last=drop_last)


def loader_batches(order, start: int, frame: int, per: int) -> list[np.ndarray]:
    """What a loader positioned at ``start`` yields: batches ``start`` to ``frame - 1``."""
    order = np.asarray(order)
    return [order[j * per : (j + 1) * per] for j in range(start, frame)]


def old_run(base, world: int, per: int, drop_last: bool, upto: int | None):
    """Every rank's batches ``0`` to ``upto`` (None: the whole epoch) at ``world`` ranks."""
    out = []
    for r in range(world):
        s = at_rank(base, r, world)
        frame = epoch_batches(len(s), per, drop_last)
        out.append(loader_batches(s.indices(EPOCH), 0, frame if upto is None else upto, per))
    return out


def new_run(base, rest, per: int, drop_last: bool):
    """Every new rank's batches after an elastic resume at ``rest.start``."""
    out = []
    for r in range(rest.world_size):
        s = ElasticOrder(at_rank(base, r, rest.world_size), rest)
        frame = epoch_batches(len(s), per, drop_last)
        out.append(loader_batches(s.indices(EPOCH), rest.start, frame, per))
    return out


def flat(runs) -> list[int]:
    return [int(i) for rank in runs for b in rank for i in b.tolist()]


def check_epoch(base, before, after, rest, drop_last: bool, old_world: int, per: int):
    """The epoch's guarantees; ``before``/``after``: per-rank batches of the two parts."""
    full = set(flat(old_run(base, old_world, per, drop_last, None)))
    new_world = rest.world_size
    assert len({len(r) for r in after}) == 1  # equal batch counts on the new ranks
    assert all(len(r) == rest.batches for r in after)
    for rank in after:
        assert all(len(b) > 0 for b in rank)
        sizes = [len(b) for b in rank]
        if drop_last:
            assert all(s == per for s in sizes)
        else:
            assert all(s == per for s in sizes[:-1])
    counts = Counter(flat(before) + flat(after))
    assert set(counts) <= full
    delivered = flat(before)
    assert rest.repeated == len(delivered) - len(set(delivered))
    if drop_last:
        assert max(counts.values(), default=1) == 1  # no padding anywhere
        assert len(full) - len(counts) == rest.dropped  # only the declared drop is lost
        frame = epoch_batches(len(at_rank(base, 0, new_world)), per, True)
        assert rest.dropped <= max(new_world * per - 1, rest.remaining - new_world * per * frame)
        assert rest.padding == 0
    else:
        assert set(counts) == full  # nothing lost
        assert sum(counts.values()) - len(full) == rest.repeated + rest.padding
        assert rest.repeated <= at_rank(base, 0, old_world).padding
        assert rest.padding <= new_world - 1
        assert rest.dropped == 0


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True, "shards"])
@pytest.mark.parametrize("new_world", [1, 2, 3, 5])
@pytest.mark.parametrize("old_world", [1, 2, 3, 4])
def test_rest_of_the_epoch_is_delivered_exactly_once(old_world, new_world, shuffle, drop_last):
    base = family(shuffle, drop_last)
    frame = epoch_batches(len(at_rank(base, 0, old_world)), BATCH, drop_last)
    for k in sorted({0, 1, frame // 2, frame - 1, frame}):
        before = old_run(base, old_world, BATCH, drop_last, k)
        rest = split_rest(
            base,
            EPOCH,
            BATCH,
            drop_last=drop_last,
            history=[Segment(old_world, k)],
            world_size=new_world,
        )
        after = new_run(base, rest, BATCH, drop_last)
        check_epoch(base, before, after, rest, drop_last, old_world, BATCH)
        assert rest.delivered == k * BATCH * old_world or (not drop_last and k == frame)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, "shards"])
def test_a_rest_resumed_again_on_a_third_world_size(shuffle, drop_last):
    """2 ranks, then 3 (saved two batches into their rest), then 5: still exactly once."""
    base = family(shuffle, drop_last)
    before = old_run(base, 2, BATCH, drop_last, 2)
    first = split_rest(
        base, EPOCH, BATCH, drop_last=drop_last, history=[Segment(2, 2)], world_size=3
    )
    middle = [r[:2] for r in new_run(base, first, BATCH, drop_last)]
    history = [Segment(2, 2), Segment(3, first.start + 2)]
    second = split_rest(base, EPOCH, BATCH, drop_last=drop_last, history=history, world_size=5)
    after = new_run(base, second, BATCH, drop_last)
    counts = Counter(flat(before) + flat(middle) + flat(after))
    full = set(flat(old_run(base, 2, BATCH, drop_last, None)))
    assert len({len(r) for r in after}) == 1
    assert set(counts) <= full
    extra = sum(counts.values()) - len(counts)
    assert extra == second.repeated + second.padding
    assert len(full) - len(counts) == first.dropped + second.dropped
    # the same history replayed for 3 ranks gives back the middle part's order
    again = split_rest(base, EPOCH, BATCH, drop_last=drop_last, history=history[:1], world_size=3)
    for a, b in zip(again.orders, first.orders):
        np.testing.assert_array_equal(a, b)


def test_other_epochs_are_the_plain_new_order():
    base = family(True, False)
    rest = split_rest(base, EPOCH, BATCH, drop_last=False, history=[Segment(2, 3)], world_size=3)
    for r in range(3):
        plain = at_rank(base, r, 3)
        s = ElasticOrder(plain, rest)
        np.testing.assert_array_equal(s.indices(EPOCH + 1), plain.indices(EPOCH + 1))
        np.testing.assert_array_equal(s.indices(EPOCH - 1), plain.indices(EPOCH - 1))
        assert len(s) == len(plain) and s.fingerprint() == plain.fingerprint()
        assert (s.rank, s.world_size, s.padding) == (r, 3, plain.padding)  # forwarded
        # the rest begins at its start batch, after valid placeholder positions
        idx = s.indices(EPOCH)
        np.testing.assert_array_equal(idx[rest.start * BATCH :], rest.orders[r])
        assert idx.min() >= 0 and idx.max() < N


def test_rank_shards_of_a_rest_name_the_shards_its_block_reads():
    base = family("shards", False)
    rest = split_rest(base, EPOCH, BATCH, drop_last=False, history=[Segment(2, 2)], world_size=3)
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    for r in range(3):
        s = ElasticOrder(at_rank(base, r, 3), rest)
        shards = s.rank_shards(EPOCH).tolist()
        wanted = [int(np.searchsorted(starts, i, side="right") - 1) for i in rest.orders[r]]
        assert shards == list(dict.fromkeys(wanted))
        assert (
            s.rank_shards(EPOCH + 1).tolist() == at_rank(base, r, 3).rank_shards(EPOCH + 1).tolist()
        )


def test_contiguous_blocks_keep_a_rank_on_few_shards():
    """The rest of a shard-ordered epoch stays shard-local: each new rank's block spans far
    fewer shards than an interleaved split of the same rest would."""
    sizes = [20] * 12
    base = ShardOrder(sizes, seed=3, window=2)
    rest = split_rest(base, 0, 4, drop_last=False, history=[Segment(2, 5)], world_size=3)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for order in rest.orders:
        shards = set((np.searchsorted(starts, order, side="right") - 1).tolist())
        assert len(shards) <= 6


def test_subset_resumes_elastically_on_its_positions():
    base = Subset([5, 9, 11, 40, 41, 42, 77], shuffle=True, seed=2)
    before = old_run(base, 2, 1, False, 1)
    rest = split_rest(base, EPOCH, 1, drop_last=False, history=[Segment(2, 1)], world_size=3)
    after = new_run(base, rest, 1, False)
    assert sorted(set(flat(before) + flat(after))) == [5, 9, 11, 40, 41, 42, 77]


def test_samplers_that_cannot_be_rebuilt_are_refused_by_name():
    labels = np.arange(20) % 4
    with pytest.raises(TypeError, match="ClassBalanced cannot resume with another number"):
        at_rank(ClassBalanced(labels, seed=1), 0, 2)
    rest = split_rest(
        family(True, False), 0, 2, drop_last=False, history=[Segment(1, 1)], world_size=1
    )
    with pytest.raises(TypeError, match="ClassBalanced"):
        ElasticOrder(ClassBalanced(labels, seed=1), rest)


def test_a_batch_outside_its_part_is_a_value_error():
    base = family(True, False)
    frame = epoch_batches(len(at_rank(base, 0, 2)), BATCH, False)
    with pytest.raises(ValueError, match=f"batch {frame + 1} is outside its part"):
        split_rest(base, 0, BATCH, drop_last=False, history=[Segment(2, frame + 1)], world_size=3)
    first = split_rest(base, 0, BATCH, drop_last=False, history=[Segment(2, 2)], world_size=3)
    with pytest.raises(ValueError, match="segment 1"):
        bad = [Segment(2, 2), Segment(3, first.start - 1)]
        split_rest(base, 0, BATCH, drop_last=False, history=bad, world_size=2)
    with pytest.raises(ValueError, match="at least one Segment"):
        split_rest(base, 0, BATCH, drop_last=False, history=[], world_size=2)


def test_configuration_leaves_out_the_place_only():
    fp = EpochOrder(10, shuffle=True, seed=4, rank=1, world_size=2).fingerprint()
    assert configuration(fp) == configuration(EpochOrder(10, shuffle=True, seed=4).fingerprint())
    assert configuration(fp) != configuration(EpochOrder(10, shuffle=True, seed=5).fingerprint())


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=5, max_size=9),
    per=st.integers(1, 4),
    old_world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    at=st.floats(0, 1),
    drop_last=st.booleans(),
    shards=st.booleans(),
)
def test_exactly_once_for_any_sizes(sizes, per, old_world, new_world, at, drop_last, shards):
    base = (
        ShardOrder(sizes, seed=1, drop_last=drop_last)
        if shards
        else EpochOrder(sum(sizes), shuffle=True, seed=1, drop_last=drop_last)
    )
    frame = epoch_batches(len(at_rank(base, 0, old_world)), per, drop_last)
    k = int(at * frame)
    before = old_run(base, old_world, per, drop_last, k)
    hist = [Segment(old_world, k)]
    rest = split_rest(base, EPOCH, per, drop_last=drop_last, history=hist, world_size=new_world)
    after = new_run(base, rest, per, drop_last)
    check_epoch(base, before, after, rest, drop_last, old_world, per)


def test_a_block_windowed_shard_order_keeps_its_blocks_at_another_world_size():
    """A set whose shards read in blocks is windowed by blocks at every world size, so an
    elastic resume replays the order those ranks were given."""
    blocks = [3, 4] * 5 + [3]  # each shard of 7 in two blocks, the last shard in one
    base = ShardOrder(SIZES, seed=3, window=2, blocks=blocks)
    for world in (1, 2, 3):
        for r in range(world):
            want = ShardOrder(SIZES, seed=3, window=2, blocks=blocks, rank=r, world_size=world)
            np.testing.assert_array_equal(
                at_rank(base, r, world).indices(EPOCH), want.indices(EPOCH)
            )
