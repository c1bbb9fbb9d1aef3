"""AspectBuckets: batches of similar height and width, every sample once per epoch,
deterministic from the seed, whole batches split across ranks."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from stoker.sampling import AspectBuckets


def _sizes(n: int = 200) -> np.ndarray:
    rng = np.random.default_rng(0)
    shapes = np.array([[480, 640], [640, 480], [500, 500], [240, 320], [360, 480]])
    pick = rng.integers(0, len(shapes), n)
    return shapes[pick] + rng.integers(-8, 9, size=(n, 2))


def test_batches_hold_one_aspect_and_every_sample_once():
    sizes = _sizes()
    s = AspectBuckets(sizes, batch_size=8, ratio_bounds=[0.9, 1.1, 10], seed=3)
    seen = Counter()
    mixed = 0
    for batch in s.batches(0):
        ratio = sizes[batch, 1] / sizes[batch, 0]
        kinds = set(np.searchsorted([0.9, 1.1, 10], ratio).tolist())
        mixed += len(kinds) > 1
        seen.update(batch.tolist())
    assert mixed <= 2  # only the merged tails may span two neighbouring buckets
    fill = s.padding
    assert sum(seen.values()) == len(sizes) + fill and set(seen) == set(range(len(sizes)))


def test_size_buckets_keep_areas_close():
    sizes = _sizes()
    one = AspectBuckets(sizes, batch_size=8, num_buckets=3, seed=1)
    two = AspectBuckets(sizes, batch_size=8, num_buckets=3, size_buckets=2, seed=1)

    def waste(s):  # padded pixels over real pixels
        b = s.batches(0)
        frame = s.batch_sizes(0)
        real = (sizes[b, 0] * sizes[b, 1]).sum()
        return (frame[:, 0] * frame[:, 1]).sum() * b.shape[1] / real - 1

    assert waste(two) < 0.5 * waste(one)


def test_deterministic_and_changes_with_the_epoch():
    sizes = _sizes()
    a = AspectBuckets(sizes, batch_size=8, num_buckets=2, seed=5)
    b = AspectBuckets(sizes, batch_size=8, num_buckets=2, seed=5)
    np.testing.assert_array_equal(a.indices(1), b.indices(1))
    assert not np.array_equal(a.indices(0), a.indices(1))
    assert json.loads(json.dumps(a.fingerprint())) == b.fingerprint()
    assert (
        a.fingerprint() != AspectBuckets(sizes, batch_size=8, num_buckets=2, seed=6).fingerprint()
    )


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_whole_batches(drop_last):
    sizes = _sizes(203)
    ranks = [
        AspectBuckets(
            sizes, batch_size=8, num_buckets=3, seed=2, rank=r, world_size=3, drop_last=drop_last
        )
        for r in range(3)
    ]
    assert len({len(s) for s in ranks}) == 1
    batches = [tuple(b) for s in ranks for b in s.batches(4).tolist()]
    if drop_last:
        assert len(set(batches)) == len(batches)  # disjoint
    got = {i for b in batches for i in b}
    assert got == set(range(len(sizes))) if not drop_last else got <= set(range(len(sizes)))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        AspectBuckets(np.zeros(5, int), batch_size=2, num_buckets=1)
    with pytest.raises(ValueError, match="at least 1x1"):
        AspectBuckets([[0, 4]], batch_size=2, num_buckets=1)
    with pytest.raises(ValueError, match="wider than the last ratio bound"):
        AspectBuckets([[10, 40]], batch_size=2, ratio_bounds=[1.0])
    with pytest.raises(ValueError, match="exactly one"):
        AspectBuckets([[10, 40]], batch_size=2)
