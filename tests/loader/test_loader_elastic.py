"""Elastic resume with real loaders (2 workers each) over a packed set: an epoch begun by
2 ranks and saved at several points finishes on 3 ranks, or on 1, with every record delivered
once up to the declared padding, equal batch counts on the new ranks, and ``len()``
consistent with what the iteration yields. Ranks are loaders built with ``rank=`` and
``world_size=`` in this one process; rank 0's state stands for every rank."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from loader_helpers import make_folder

import stoker
from stoker import IncompatibleStateError
from stoker.loader import Loader
from stoker.sampling import ClassBalanced, ElasticOrder

BATCH = 3
KW = dict(batch_size=BATCH, seed=7, workers=2)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[str, set[int]]:
    """31 records in 7 shards (5 to a shard, the last one short) and their keys."""
    root = tmp_path_factory.mktemp("elastic")
    make_folder(str(root / "img"), n=31, size=(8, 8))
    report = stoker.pack(root / "img", root / "train", workers=1, progress=False, shard_size=5)
    assert report.written == 31
    with Loader(report.manifest, batch_size=1, workers=0) as ld:
        keys = {int(ld.source.key(i)) for i in range(len(ld.source))}
    assert len(keys) == 31
    return report.manifest, keys


def _json(state: dict) -> dict:
    return json.loads(json.dumps(state))


def begin(path: str, points: list[int], world: int = 2, **kw) -> tuple[list, dict]:
    """Run ``world`` ranks in step; at each point (batches taken) keep rank 0's state and the
    keys all ranks delivered so far."""
    loaders = [Loader(path, rank=r, world_size=world, **KW, **kw) for r in range(world)]
    try:
        its = [iter(ld) for ld in loaders]
        taken: list[int] = []
        saved = {}
        for step in range(max(points) + 1):
            if step in points:
                saved[step] = (_json(loaders[0].state_dict()), list(taken))
            if step == max(points):
                break
            for it in its:
                taken += next(it).keys.tolist()
        return [len(ld) for ld in loaders], saved
    finally:
        for ld in loaders:
            ld.close()


def finish(path: str, state: dict, world: int, **kw) -> tuple[list[list[int]], list[int], int]:
    """Every new rank's keys for the rest of the epoch, its batch count, the declared padding
    (what the resumed rest adds) and check ``len`` against what it yields."""
    keys, counts, padding = [], [], 0
    for r in range(world):
        with Loader(path, rank=r, world_size=world, **KW, **kw) as ld:
            ld.load_state_dict(state)
            at = ld.state_dict()["batch"]
            assert ld.state_dict()["epoch"] == state["epoch"]
            got = [b.keys.tolist() for b in ld]
            assert len(got) == len(ld) - at  # yields the rest of len(), as any resume does
            assert ld.epoch == state["epoch"] + 1
            if isinstance(ld.sampler, ElasticOrder):
                padding = ld.sampler.rest_padding
            keys.append([k for b in got for k in b])
            counts.append(len(got))
    return keys, counts, padding


@pytest.mark.parametrize("shuffle", [True, "shards"])
def test_two_ranks_saved_at_several_points_finish_on_three_and_on_one(packed, shuffle):
    path, everything = packed
    lens, saved = begin(path, [1, 3, 5], shuffle=shuffle)
    for point, (state, before) in saved.items():
        assert (state["world_size"], state["batch"], state["resumed"]) == (2, point, [])
        old_repeats = len(before) - len(set(before))
        for world in (3, 1):
            after, counts, padding = finish(path, state, world, shuffle=shuffle)
            assert len(set(counts)) == 1, counts  # equal batch counts on the new ranks
            seen = Counter(before + [k for rank in after for k in rank])
            assert set(seen) == everything, (point, world)  # nothing lost
            assert sum(seen.values()) - len(everything) == old_repeats + padding
            assert padding <= world - 1


def test_drop_last_loses_only_the_declared_samples(packed):
    path, everything = packed
    _, saved = begin(path, [2], shuffle=True, drop_last=True)
    state, before = saved[2]
    for world in (3, 1):
        with Loader(path, rank=0, world_size=world, drop_last=True, shuffle=True, **KW) as ld:
            ld.load_state_dict(state)
            dropped = ld.sampler.rest_dropped
        after, counts, padding = finish(path, state, world, shuffle=True, drop_last=True)
        seen = Counter(before + [k for rank in after for k in rank])
        assert max(seen.values()) == 1 and padding == 0
        first_run = 31 - 31 % 2 - 2 * ((31 // 2) % BATCH)  # what 2 ranks would have delivered
        assert first_run - len(seen) == dropped
        assert dropped < world * BATCH


def test_a_state_saved_inside_the_rest_resumes_on_the_same_and_on_another_world(packed):
    path, everything = packed
    _, saved = begin(path, [2], shuffle="shards")
    state, before = saved[2]
    # three ranks take two batches of the rest; rank 0 saves
    middle: list[int] = []
    for r in range(3):
        with Loader(path, rank=r, world_size=3, shuffle="shards", **KW) as ld:
            ld.load_state_dict(state)
            it = iter(ld)
            middle += next(it).keys.tolist() + next(it).keys.tolist()
            if r == 0:
                inner = _json(ld.state_dict())
                rest_of_three = [k for b in it for k in b.keys.tolist()]
    assert inner["resumed"] == [{"world_size": 2, "batch": 2}] and inner["world_size"] == 3
    # the same three ranks: rank 0 continues with exactly the batches it had left
    same, _, _ = finish(path, inner, 3, shuffle="shards")
    assert same[0] == rest_of_three
    # on two ranks: the three parts together deliver the epoch once, up to the padding
    after, counts, padding = finish(path, inner, 2, shuffle="shards")
    assert len(set(counts)) == 1
    seen = Counter(before + middle + [k for rank in after for k in rank])
    assert set(seen) == everything
    assert sum(seen.values()) - len(everything) <= 1 + 2 + 1  # old, middle and new padding


def test_rank_zeros_state_resumes_every_rank_of_the_same_world(packed):
    path, _ = packed
    _, saved = begin(path, [3], shuffle=True)
    state, _ = saved[3]
    own, _, _ = finish(path, state, 2, shuffle=True)
    with Loader(path, rank=1, world_size=2, shuffle=True, **KW) as ld:
        expected = ld.sampler.indices(0)[3 * BATCH :]
        assert own[1] == [int(ld.source.key(int(i))) for i in expected]


def test_set_epoch_after_an_elastic_resume_gives_the_plain_order(packed):
    path, _ = packed
    _, saved = begin(path, [2], shuffle=True)
    state, _ = saved[2]
    with Loader(path, rank=1, world_size=3, shuffle=True, **dict(KW, workers=0)) as ld:
        ld.load_state_dict(state)
        assert isinstance(ld.sampler, ElasticOrder)
        ld.set_epoch(0)
        got = [k for b in ld for k in b.keys.tolist()]
        assert not isinstance(ld.sampler, ElasticOrder)
        assert got == [int(ld.source.key(int(i))) for i in ld.sampler.indices(0)]


def test_a_version_1_state_still_resumes(packed):
    path, _ = packed
    _, saved = begin(path, [2], shuffle=True)
    state, _ = saved[2]
    old = {k: v for k, v in state.items() if k not in ("world_size", "drop_last", "resumed")}
    old["version"] = 1
    a, _, _ = finish(path, state, 3, shuffle=True)
    b, _, _ = finish(path, old, 3, shuffle=True)
    assert a == b


def test_refused_resumes_name_what_differs(packed):
    path, _ = packed
    _, saved = begin(path, [2], shuffle=True)
    state, _ = saved[2]
    with Loader(path, rank=0, world_size=3, shuffle=True, drop_last=True, **KW) as ld:
        with pytest.raises(IncompatibleStateError, match="sampler"):
            ld.load_state_dict(state)  # drop_last is part of the order's configuration
    with Loader(path, rank=0, world_size=3, shuffle=True, **KW) as ld:
        with pytest.raises(IncompatibleStateError, match="drop_last"):
            ld.load_state_dict(dict(state, drop_last=True))
        with pytest.raises(IncompatibleStateError, match="world_size: the state says 4"):
            ld.load_state_dict(dict(state, world_size=4))
        with pytest.raises(ValueError, match="batch 99 is outside"):
            ld.load_state_dict(dict(state, batch=99))
        with pytest.raises(ValueError, match=r"resumed\[0\].world_size"):
            ld.load_state_dict(dict(state, resumed=[{"world_size": 0, "batch": 1}]))
    labels = [i % 3 for i in range(31)]
    kw = dict(batch_size=BATCH, seed=7, workers=0)
    with Loader(path, sampler=ClassBalanced(labels, rank=0, world_size=2, seed=7), **kw) as ld:
        next(iter(ld))
        balanced = ld.state_dict()
    with Loader(path, sampler=ClassBalanced(labels, rank=0, world_size=3, seed=7), **kw) as ld:
        with pytest.raises(IncompatibleStateError, match="ClassBalanced resumes only at the rank"):
            ld.load_state_dict(balanced)


def test_loader_states_carry_the_world_size(packed):
    path, _ = packed
    with Loader(path, rank=2, world_size=3, shuffle="shards", **dict(KW, workers=0)) as ld:
        state = ld.state_dict()
    assert (state["world_size"], state["drop_last"], state["resumed"]) == (3, False, [])
