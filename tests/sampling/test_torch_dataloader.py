"""Every sampler works as the sampler of a plain torch.utils.data.DataLoader."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from stoker.sampling import (  # noqa: E402
    ClassBalanced,
    EpochOrder,
    LengthBuckets,
    ProportionalWidth,
    Subset,
)


class Lines(Dataset):
    """Text-line stand-ins: sample i is (i, label length)."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return i, self.lengths[i]


LENGTHS = [int(x) for x in np.random.default_rng(0).integers(1, 20, 70)]


def delivered(loader):
    return torch.cat([b[0] for b in loader]).tolist()


@pytest.mark.parametrize(
    "make",
    [
        lambda: EpochOrder(70, shuffle=True, seed=1, rank=1, world_size=3),
        lambda: Subset(range(0, 70, 2), shuffle=True, seed=1),
        lambda: ClassBalanced(np.asarray(LENGTHS) % 3, seed=1, world_size=2, rank=1),
        lambda: LengthBuckets(LENGTHS, batch_size=5, bucket_bounds=[5, 10, 20], seed=1),
    ],
)
def test_dataloader_delivers_the_sampler_order_and_honours_set_epoch(make):
    sampler = make()
    loader = DataLoader(Lines(LENGTHS), sampler=sampler, batch_size=5)
    assert len(loader) == -(-len(sampler) // 5)
    assert delivered(loader) == sampler.indices(0).tolist()
    sampler.set_epoch(1)
    assert delivered(loader) == sampler.indices(1).tolist()
    assert sampler.indices(1).tolist() != sampler.indices(0).tolist()


def test_length_bucket_batches_through_a_dataloader():
    sampler = LengthBuckets(
        LENGTHS, batch_size=5, bucket_bounds=[5, 10, 20], seed=2, small_bucket="drop"
    )
    loader = DataLoader(Lines(LENGTHS), sampler=sampler, batch_size=5)
    widths = sampler.batch_widths(0, 5)
    assert widths is None
    for (idx, lengths), row in zip(loader, sampler.batches(0)):
        assert idx.tolist() == row.tolist()
        bucket = np.searchsorted([5, 10, 20], lengths.numpy())
        assert len(set(bucket.tolist())) == 1  # one bucket per batch
    # the batches also work as a batch_sampler, and a width per batch goes with them
    sized = LengthBuckets(
        LENGTHS, batch_size=5, bucket_bounds=[5, 10, 20], widths=ProportionalWidth(10)
    )
    batch_loader = DataLoader(Lines(LENGTHS), batch_sampler=sized.batches(0).tolist())
    for (_idx, lengths), width in zip(batch_loader, sized.batch_widths(0, 5)):
        assert width == ProportionalWidth(10)(int(lengths.max()))
