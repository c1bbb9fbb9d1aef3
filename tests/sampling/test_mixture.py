"""The mixture order: the epoch rule in numbers, draws that run on across epochs, the rank split
and elastic resume (pure, no processes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import MixtureOrder, Segment, split_rest
from stoker.sampling.elastic import at_rank, is_elastic
from stoker.sampling.mixture import mixture_quotas


def test_the_rule_in_numbers() -> None:
    """A (120) and B (60) at 0.75/0.25: A has the larger weight/size, so an epoch is A once
    whole and B 40 times; B's first 60 draws (40 in epoch 0, 20 in epoch 1) are all of B."""
    m = MixtureOrder([120, 60], [0.75, 0.25], seed=3)
    assert len(m) == 160
    e0, e1 = m.indices(0), m.indices(1)
    sets0 = m.set_of(e0)
    assert np.bincount(sets0).tolist() == [120, 40]
    assert sorted((e0[sets0 == 0] % m.total).tolist()) == list(range(120))
    b0 = e0[sets0 == 1] % m.total
    b1 = e1[m.set_of(e1) == 1] % m.total
    first60 = np.concatenate([b0, b1[:20]])
    assert sorted(first60.tolist()) == list(range(120, 180))
    # two ranks: 80 each, disjoint, together the whole epoch
    r0, r1 = (MixtureOrder([120, 60], [0.75, 0.25], seed=3, rank=r, world_size=2) for r in (0, 1))
    a, b = r0.indices(0), r1.indices(0)
    assert len(a) == len(b) == 80
    assert sorted(np.concatenate([a, b]).tolist()) == sorted(e0.tolist())


def test_epoch_size_and_quotas() -> None:
    assert mixture_quotas([10, 1000], [0.5, 0.5]).tolist() == [10, 10]
    assert mixture_quotas([10, 20], [1, 3], epoch_size=7).tolist() == [2, 5]
    m = MixtureOrder([10, 20], [1, 3], epoch_size=100, seed=1)
    ids = m.indices(0)
    assert len(ids) == 100 and np.bincount(m.set_of(ids)).tolist() == [25, 75]
    # set 0 is drawn 25 times from 10 samples: passes 0, 1 and half of 2, ids distinct
    assert len(np.unique(ids)) == 100
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        MixtureOrder([10, 20], [1, 0])
    with pytest.raises(ValueError, match="one number per set"):
        MixtureOrder([10, 20], [1])


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    raw=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    epochs=st.integers(1, 4),
    shuffle=st.sampled_from([True, False, "shards"]),
    seed=st.integers(0, 2**32),
)
def test_each_pass_holds_every_sample_once(
    sizes: list[int], raw: list[int], epochs: int, shuffle: bool | str, seed: int
) -> None:
    """Over any number of epochs, each set's draws in order are its passes one after
    another, each a permutation of the set; quotas hold every epoch."""
    weights = raw[: len(sizes)]
    shards = [[3] * (n // 3) + ([n % 3] if n % 3 else []) for n in sizes]
    m = MixtureOrder(sizes, weights, shuffle=shuffle, seed=seed, shard_sizes=shards)
    orders = [m.indices(e) for e in range(epochs)]
    for o in orders:
        assert np.bincount(m.set_of(o), minlength=len(sizes)).tolist() == m.quotas.tolist()
        assert len(np.unique(o)) == len(o)
    every = np.concatenate(orders)
    for s, n in enumerate(sizes):
        mine = every[m.set_of(every) == s]
        pos = mine % m.total - m.offsets[s]
        assert (mine // m.total).tolist() == (np.arange(len(mine)) // n).tolist()
        for p in range(0, len(mine), n):
            chunk = pos[p : p + n]
            assert len(np.unique(chunk)) == len(chunk)


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 5),
    new_world=st.integers(1, 5),
    batch=st.integers(1, 7),
    at=st.integers(0, 40),
    seed=st.integers(0, 1000),
)
def test_elastic_rest_delivers_the_epoch_once(
    world: int, new_world: int, batch: int, at: int, seed: int
) -> None:
    """A mixture's epoch begun on ``world`` ranks and finished on ``new_world``: every draw of
    the epoch delivered, repeats only the declared padding."""
    base = MixtureOrder([30, 12], [0.6, 0.4], seed=seed, world_size=world)
    assert is_elastic(base)
    frame = -(-len(base) // batch)
    at = min(at, frame)
    done = np.concatenate([at_rank(base, r, world).indices(0)[: at * batch] for r in range(world)])
    rest = split_rest(
        base, 0, batch, drop_last=False, history=[Segment(world, at)], world_size=new_world
    )
    after = np.concatenate(rest.orders)
    whole = set(base.global_order(0).tolist())
    assert set(done.tolist()) | set(after.tolist()) == whole
    assert len(after) - len(set(after.tolist())) <= rest.padding
