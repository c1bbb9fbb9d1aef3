"""A sampler's own position (``state_dict``/``load_state_dict``): what a DataLoader needs to
resume mid-epoch. Pure: no processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoker import IncompatibleStateError
from stoker.sampling import AspectBuckets, ClassBalanced, EpochOrder, LengthBuckets, ShardOrder

LABELS = np.arange(30) % 3


def _samplers(seed: int = 0, rank: int = 0) -> list:
    sizes = np.stack([20 + np.arange(30) % 5, 30 + np.arange(30) % 7], axis=1)
    return [
        EpochOrder(30, shuffle=True, seed=seed, rank=rank, world_size=2),
        ClassBalanced(LABELS, seed=seed, rank=rank, world_size=2),
        LengthBuckets(
            np.arange(30) % 9, batch_size=4, num_buckets=3, seed=seed, rank=rank, world_size=2
        ),
        AspectBuckets(sizes, batch_size=4, num_buckets=2, seed=seed, rank=rank, world_size=2),
        ShardOrder(np.full(6, 5), seed=seed, rank=rank, world_size=2),
    ]


@pytest.mark.parametrize("i", range(5))
def test_a_loaded_state_continues_the_epoch_where_it_stopped(i):
    s = _samplers()[i]
    s.set_epoch(3)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(s.state_dict()))  # JSON, as a checkpoint holds it
    assert (state["epoch"], state["yielded"]) == (3, 5)
    fresh = _samplers()[i]  # at epoch 0: the state says which epoch
    fresh.load_state_dict(state)
    assert fresh.epoch == 3
    assert head + list(fresh) == full
    assert list(fresh) == full  # the next iteration is the whole epoch again


def test_consumed_counts_what_the_loop_took_and_set_epoch_to_another_epoch_starts_it():
    s = EpochOrder(30, shuffle=True, seed=1)
    s.set_epoch(2)
    full = list(s)
    st = s.state_dict(consumed=7)  # the iteration ran to its end; the loop had taken 7
    fresh = EpochOrder(30, shuffle=True, seed=1)
    fresh.load_state_dict(st)
    fresh.set_epoch(2)  # the same epoch: the position stays
    assert list(fresh) == full[7:]
    fresh.load_state_dict(st)
    fresh.set_epoch(3)  # another epoch: it starts from its beginning
    assert len(list(fresh)) == 30
    with pytest.raises(ValueError, match="consumed"):
        s.state_dict(consumed=31)


def test_a_state_of_another_sampler_is_refused_naming_the_field():
    st = _samplers(seed=1)[1].state_dict()
    with pytest.raises(IncompatibleStateError, match="sampler seed: .*seed=1.*seed=0"):
        _samplers(seed=0)[1].load_state_dict(st)
    with pytest.raises(IncompatibleStateError, match="sampler rank"):
        _samplers(seed=1, rank=1)[1].load_state_dict(st)
    with pytest.raises(IncompatibleStateError, match="sampler type"):
        _samplers(seed=1)[0].load_state_dict(st)


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"yielded": 99}, ValueError, "yielded"),
        ({"yielded": -1}, ValueError, "yielded"),
        ({"epoch": "1"}, TypeError, "epoch"),
        ({"version": 7}, ValueError, "version"),
        ({"extra": 1}, ValueError, "fields"),
    ],
)
def test_a_malformed_state_is_refused_naming_the_field(change, error, match):
    s = EpochOrder(30)
    with pytest.raises(error, match=match):
        s.load_state_dict({**s.state_dict(), **change})
    with pytest.raises(TypeError, match="dict"):
        s.load_state_dict([1, 2])  # type: ignore[arg-type]
