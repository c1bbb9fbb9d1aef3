"""A loader over several sets (``Loader([A, B], weights=...)``): the epoch rule in numbers on
real packed sets (RecordIO and TFRecord), the same batches for any worker count, ranks
disjoint, exact resume (mid-epoch, at an epoch boundary, after a ``break``, and from 4 to 3
ranks), and a chain per set (``PerSet``)."""

from __future__ import annotations

import numpy as np
import pytest

import stoker
from stoker import Loader
from stoker._core.errors import SpecError
from stoker.transforms import CenterCrop, Compose, HorizontalFlip, PerSet, RandomCrop

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory) -> tuple[str, str]:
    """A: 120 RecordIO records (4 classes, 24 px), B: 60 TFRecord records (3 classes, 28 px)."""
    root = tmp_path_factory.mktemp("mixture")
    a = stoker.make_sample_data(root / "ia", classes=4, per_class=30, size=24, seed=1, workers=1)
    b = stoker.make_sample_data(root / "ib", classes=3, per_class=20, size=28, seed=2, workers=1)
    stoker.pack(a, root / "a" / "train", shard_size=16, workers=1, progress=False)
    stoker.pack(b, root / "b" / "train", format="tfrecord", shard_size=8, workers=1, progress=False)
    return str(root / "a" / "train.stoker.json"), str(root / "b" / "train.stoker.json")


def _loader(sets, **kw) -> Loader:
    opts = {
        "weights": [0.75, 0.25],
        "batch_size": 16,
        "transforms": Compose([RandomCrop(20), HorizontalFlip()]),
        "shuffle": True,
        "seed": 5,
        "workers": 0,
        **kw,
    }
    return Loader(list(sets), **opts)


def _epoch(loader: Loader) -> list[tuple]:
    return [(b.indices.copy(), b.source.copy(), b.keys.copy(), b.images.copy()) for b in loader]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b)
    )


def test_the_rule_in_numbers_and_b_runs_on_across_epochs(two_sets) -> None:
    """An epoch is A whole (120) and B 40 times; B's first 60 draws (epoch 0's 40 and the
    first 20 of epoch 1) are every B sample once; labels stay per set unless offset."""
    with _loader(two_sets, label_offset=True) as loader:
        assert len(loader) == 10
        e0, e1 = _epoch(loader), _epoch(loader)
    src0 = np.concatenate([b[1] for b in e0])
    assert np.bincount(src0).tolist() == [120, 40]
    keys0 = np.concatenate([b[2] for b in e0])
    assert len(np.unique(keys0[src0 == 0])) == 120
    src1, keys1 = (np.concatenate([b[i] for b in e1]) for i in (1, 2))
    b_keys = np.concatenate([keys0[src0 == 1], keys1[src1 == 1][:20]])
    assert sorted(b_keys.tolist()) == sorted(set(b_keys.tolist())) and len(b_keys) == 60
    with _loader(two_sets, label_offset=True) as loader:
        batch = next(iter(loader))
        assert set(batch.labels[batch.source == 1].tolist()) <= {4, 5, 6}
    with _loader(two_sets) as loader:
        batch = next(iter(loader))
        assert set(batch.labels[batch.source == 1].tolist()) <= {0, 1, 2}


def test_the_same_batches_for_0_1_and_3_workers_and_2_ranks_disjoint(two_sets) -> None:
    runs = []
    for workers in (0, 1, 3):
        with _loader(two_sets, workers=workers) as loader:
            runs.append(_epoch(loader))
    assert _same(runs[0], runs[1]) and _same(runs[0], runs[2])
    ranks = []
    for rank in (0, 1):
        with _loader(two_sets, rank=rank, world_size=2) as loader:
            assert len(loader.sampler) == 80
            ranks.append(np.concatenate([b[0] for b in _epoch(loader)]))
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())
    whole = np.concatenate([b[0] for b in runs[0]])
    assert sorted(np.concatenate(ranks).tolist()) == sorted(whole.tolist())


@pytest.mark.parametrize("stop", [3, 10, "break"])
def test_resume_is_exact(two_sets, stop) -> None:
    """A state saved mid-epoch (after batch 3), exactly at the epoch boundary (after batch
    10 of 10), or after a ``break`` (then the next epoch): the resumed loader delivers what
    the uninterrupted one does."""
    with _loader(two_sets) as loader:
        whole = _epoch(loader) + _epoch(loader)
    with _loader(two_sets) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(3 if stop == "break" else stop)]
        if stop == "break":
            del it
            loader.set_epoch(1)
            skipped = 10
        else:
            skipped = stop
        state = loader.state_dict()
    assert len(got) <= skipped
    with _loader(two_sets, seed=None) as resumed:
        resumed.load_state_dict(state)
        rest = _epoch(resumed) + (_epoch(resumed) if stop != 10 and stop != "break" else [])
        if stop == 10:
            assert resumed.epoch == 2
    assert _same(rest, whole[skipped:])


def test_a_4_rank_epoch_resumes_on_3_ranks(two_sets) -> None:
    """4 ranks deliver 2 batches each, then 3 ranks finish the epoch: every draw of the epoch
    is delivered, repeats only the declared padding."""
    opts = {"batch_size": 8}
    states, done = [], []
    for rank in range(4):
        with _loader(two_sets, rank=rank, world_size=4, **opts) as loader:
            it = iter(loader)
            done += [next(it).indices.copy() for _ in range(2)]
            states.append(loader.state_dict())
            del it
    after = []
    for rank in range(3):
        with _loader(two_sets, rank=rank, world_size=3, **opts) as loader:
            loader.load_state_dict(states[0])
            after += [b.indices.copy() for b in loader]
            assert loader.epoch == 1
    with _loader(two_sets) as whole:
        epoch = set(whole.sampler.indices(0).tolist())
    seen, rest = np.concatenate(done), np.concatenate(after)
    assert set(seen.tolist()) | set(rest.tolist()) == epoch
    assert len(rest) - len(set(rest.tolist())) < 3


def test_mixture_arguments_are_checked(two_sets) -> None:
    with pytest.raises(ValueError, match="needs weights="):
        Loader(list(two_sets), batch_size=4, workers=0)
    with pytest.raises(ValueError, match="pass them as a list"):
        Loader(two_sets[0], batch_size=4, weights=[1.0], workers=0)
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        Loader(list(two_sets), batch_size=4, weights=[1.0, -1], workers=0)
    with pytest.raises(ValueError, match="does not combine with a mixture"):
        Loader(
            list(two_sets),
            batch_size=4,
            weights=[1, 1],
            workers=0,
            sampler=stoker.sampling.EpochOrder(180),
        )
    with _loader(two_sets, epoch_size=50) as loader:
        assert len(loader.sampler) == 50 and loader.sampler.quotas.tolist() == [38, 12]


def test_each_set_gets_its_own_chain(two_sets) -> None:
    """``PerSet([A's, B's])``: B's rows are B's centre crops (as a loader of B alone with that
    chain gives them), A's random crops; the same bytes with 2 workers; chains that end in
    different shapes are refused naming the set."""
    chains = PerSet([Compose([RandomCrop(20), HorizontalFlip()]), CenterCrop(20)])
    with _loader(two_sets, transforms=chains) as loader:
        mixed = _epoch(loader)
    with _loader(two_sets, transforms=chains, workers=2) as loader:
        assert _same(_epoch(loader), mixed)
    with Loader(two_sets[1], batch_size=60, transforms=CenterCrop(20)) as alone:
        b = next(iter(alone))
        centre = dict(zip(b.keys.tolist(), b.images.copy()))
        with Loader(two_sets[0], batch_size=120, transforms=CenterCrop(20)) as a_alone:
            a = next(iter(a_alone))
            a_centre = dict(zip(a.keys.tolist(), a.images.copy()))
    _, source, keys, images = (np.concatenate(x) for x in zip(*mixed))
    assert all(np.array_equal(images[r], centre[keys[r]]) for r in np.flatnonzero(source == 1))
    a_rows = np.flatnonzero(source == 0)
    assert sum(np.array_equal(images[r], a_centre[keys[r]]) for r in a_rows) < len(a_rows) / 2
    with pytest.raises(SpecError, match=r"PerSet: the chain of set 1 \(.*b/train.*\(16, 16, 3\)"):
        _loader(two_sets, transforms=PerSet([RandomCrop(20), RandomCrop(16)]))
    with pytest.raises(ValueError, match="PerSet holds 2 chains for 1 set"):
        Loader(two_sets[0], batch_size=4, transforms=chains)
