"""The samplers drive a real stoker.Loader (2 worker processes): the loader delivers exactly
the sampler's batches, and a LengthBuckets batch comes at its own width."""

from __future__ import annotations

import numpy as np
import pytest

import stoker
from stoker.sampling import ClassBalanced, LengthBuckets, ProportionalWidth

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("worker_server")]


@pytest.fixture(scope="session")
def worker_server():
    """The loader's worker server (and its resource tracker) live as long as the test process:
    start them before the leak check of the first test takes its snapshot."""
    from multiprocessing import resource_tracker

    from stoker.loader import warm_up

    resource_tracker.ensure_running()
    warm_up()


def lines(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n 'text lines' of 16x40 pixels: nonzero everywhere, so padding shows as zeros."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 256, (n, 16, 40, 3), dtype=np.uint8)
    lengths = rng.integers(1, 13, n)
    return x, lengths


def test_length_buckets_through_the_loader():
    x, lengths = lines(90)
    rule = ProportionalWidth(6, multiple=8)  # 1..12 characters -> widths 8..72
    sampler = LengthBuckets(lengths, batch_size=8, bucket_bounds=[4, 8, 12], widths=rule, seed=3)
    with stoker.Loader((x, lengths), batch_size=8, sampler=sampler, workers=2) as loader:
        assert len(loader) == len(sampler) // 8
        for epoch in range(2):
            rows = sampler.batches(epoch)
            widths = sampler.batch_widths(epoch, 8)
            seen = 0
            for batch in loader:
                n = batch.number
                assert batch.epoch == epoch
                assert batch.indices.tolist() == rows[n].tolist()
                assert batch.images.shape == (8, 16, int(widths[n]), 3)
                assert int(widths[n]) == rule(int(lengths[rows[n]].max()))
                w = int(widths[n])
                if w > 40:  # a narrower line is right-padded with zeros
                    assert not batch.images[:, :, 40:].any()
                    assert np.array_equal(batch.images[:, :, :40], x[rows[n]])
                seen += 1
            assert seen == len(rows)


def test_class_balanced_through_the_loader():
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(4), [200, 40, 10, 2])
    x = rng.integers(0, 256, (len(y), 8, 8, 3), dtype=np.uint8)
    sampler = ClassBalanced(y, num_samples=400, seed=5, rank=1, world_size=2)
    with stoker.Loader((x, y), batch_size=25, sampler=sampler, workers=2) as loader:
        delivered = np.concatenate([b.indices.copy() for b in loader])  # views of a slot
        labels = np.concatenate([np.array(b.labels).reshape(-1) for b in loader])
    assert delivered.tolist() == sampler.indices(0).tolist()
    assert labels.tolist() == y[sampler.indices(1)].tolist()  # the epoch advanced by itself
    counts = np.bincount(labels, minlength=4)
    assert counts.min() > 25  # about 50 each, not 160/32/8/0
