"""The default sampler: a seeded epoch order, split across ranks."""

from __future__ import annotations

import numpy as np

from stoker._core.seeding import stream_rng
from stoker.sampling.base import Sampler

__all__ = ["EpochOrder", "split_for_rank"]

_DOMAIN_ORDER = 1


def split_for_rank(order: np.ndarray, rank: int, world_size: int, *, drop_last: bool) -> np.ndarray:
    """This rank's share of a global ``order``.

    ``drop_last=False`` pads by wrapping to a multiple of ``world_size`` (at most
    ``world_size - 1`` duplicates); ``drop_last=True`` drops at most ``world_size - 1`` tail
    entries. Ranks take interleaved entries (``order[rank::world_size]``), so every rank's
    length is equal and, before padding, the ranks are disjoint.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    n = len(order)
    if drop_last:
        order = order[: (n // world_size) * world_size]
    else:
        total = -(-n // world_size) * world_size
        if total > n and n > 0:
            order = np.concatenate([order, np.resize(order, total - n)])
    return order[rank::world_size]


class EpochOrder(Sampler):
    """``indices(epoch)``: a permutation of ``range(n)`` from (seed, epoch) when ``shuffle``,
    else ``range(n)``; then this rank's share (see :func:`split_for_rank`)."""

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.n = int(n)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.epoch = 0

    @property
    def padding(self) -> int:
        """How many duplicates the rank split adds per epoch over all ranks (0 with drop_last)."""
        if self.drop_last or self.n == 0:
            return 0
        return (-self.n) % self.world_size

    @property
    def dropped(self) -> int:
        """How many samples the rank split leaves out per epoch (0 without drop_last)."""
        return self.n % self.world_size if self.drop_last else 0

    def __len__(self) -> int:
        if self.drop_last:
            return self.n // self.world_size
        return -(-self.n // self.world_size)

    def indices(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            order = stream_rng(self.seed, _DOMAIN_ORDER, epoch).permutation(self.n)
        else:
            order = np.arange(self.n)
        return split_for_rank(
            order.astype(np.int64), self.rank, self.world_size, drop_last=self.drop_last
        )

    def fingerprint(self) -> dict:
        return {
            "type": "EpochOrder",
            "n": self.n,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }
