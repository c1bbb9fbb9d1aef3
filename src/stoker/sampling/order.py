"""The default sampler: a seeded epoch order, split across ranks.

The split (:func:`split_for_rank`) is shared by every sampler here, so the multi-GPU rules are
the same everywhere: ranks take interleaved entries of one global order; without ``drop_last``
the order is padded by wrapping (at most ``world_size - 1`` duplicates per epoch, reported by
``.padding``); with ``drop_last`` at most ``world_size - 1`` entries are left out (``.dropped``).
"""

from __future__ import annotations

import abc

import numpy as np

from stoker._core.seeding import stream_rng
from stoker.sampling._checks import (
    array_digest,
    as_counts,
    check_epoch,
    check_int,
    check_rank,
    check_seed,
)
from stoker.sampling.base import Sampler

__all__ = ["EpochOrder", "SplitSampler", "Subset", "split_for_rank"]

_DOMAIN_ORDER = 1
_DOMAIN_SUBSET = 4


def split_for_rank(order: np.ndarray, rank: int, world_size: int, *, drop_last: bool) -> np.ndarray:
    """This rank's share of a global ``order``.

    ``drop_last=False`` pads by wrapping to a multiple of ``world_size`` (at most
    ``world_size - 1`` duplicates); ``drop_last=True`` drops at most ``world_size - 1`` tail
    entries. Ranks take interleaved entries (``order[rank::world_size]``), so every rank's
    length is equal and, before padding, the ranks are disjoint.
    """
    rank, world_size = check_rank(rank, world_size)
    order = np.asarray(order)
    n = len(order)
    if drop_last:
        order = order[: (n // world_size) * world_size]
    else:
        total = -(-n // world_size) * world_size
        if total > n and n > 0:
            order = np.concatenate([order, np.resize(order, total - n)])
    return order[rank::world_size]


def span_of_run(run: int, shard_sizes: np.ndarray) -> int:
    """At most how many shards ``run`` consecutive positions of a set touch: the two it
    begins and ends in, and those wholly inside it, which hold at least as many positions as
    the same number of the set's smallest shards.

    >>> span_of_run(10, np.array([4, 4, 4, 4, 4, 4]))
    4
    """
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    full = np.sort(sizes[sizes > 0])
    return min(len(full), runs_touched(run, full, 1))


def runs_touched(run: int, smallest: np.ndarray, per_group: int, *, short: bool = False) -> int:
    """At most how many consecutive groups ``run`` consecutive positions touch, when each
    group is ``per_group`` shards (all but one group, if ``short``: it may hold a single shard)
    and the groups wholly inside the run are disjoint: ``k`` of them hold at least as many
    positions as the ``k * per_group`` smallest shards (``smallest``: every shard's positions,
    in ascending order), and the first and last it touches hold one position each."""
    if run <= 0:
        return 0
    if run == 1:
        return 1
    room = run - 2
    least = np.concatenate([[0], np.cumsum(smallest)])  # least[m]: the m smallest, summed
    inside = 0
    while True:
        k = inside + 1
        shards = (k - 1) * per_group + 1 if short else k * per_group
        if shards > len(smallest) or least[shards] > room:
            break
        inside = k
    return inside + 2


class SplitSampler(Sampler):
    """A sampler whose epoch is one global order of :meth:`global_size` positions, split
    across ranks by :func:`split_for_rank`: its length, padding and dropped counts."""

    world_size: int
    drop_last: bool

    @abc.abstractmethod
    def global_size(self) -> int:
        """Positions in one epoch's global order, before the rank split."""

    @property
    def padding(self) -> int:
        """Duplicates the rank split adds per epoch, over all ranks (0 with ``drop_last``)."""
        n = self.global_size()
        return 0 if self.drop_last or n == 0 else (-n) % self.world_size

    @property
    def dropped(self) -> int:
        """Positions the rank split leaves out per epoch, over all ranks (0 without
        ``drop_last``)."""
        return self.global_size() % self.world_size if self.drop_last else 0

    def __len__(self) -> int:
        n = self.global_size()
        return n // self.world_size if self.drop_last else -(-n // self.world_size)


class EpochOrder(SplitSampler):
    """``indices(epoch)``: a permutation of ``range(n)`` from (seed, epoch) when ``shuffle``,
    else ``range(n)``; then this rank's share (see :func:`split_for_rank`).

    >>> EpochOrder(5, world_size=2, rank=1).indices(0).tolist()
    [1, 3, 0]
    """

    _domain = _DOMAIN_ORDER  # the stream the shuffle draws from

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
        self.n = check_int("n", n, minimum=0)
        self.rank, self.world_size = check_rank(rank, world_size)
        self.shuffle = bool(shuffle)
        self.seed = check_seed(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0

    def global_size(self) -> int:
        return self.n

    def global_order(self, epoch: int) -> np.ndarray:
        """The order of all ``n`` samples for ``epoch``, before the rank split."""
        epoch = check_epoch(epoch)
        if self.shuffle:
            return stream_rng(self.seed, self._domain, epoch).permutation(self.n).astype(np.int64)
        return np.arange(self.n, dtype=np.int64)

    def indices(self, epoch: int) -> np.ndarray:
        order = self.global_order(epoch)
        return split_for_rank(order, self.rank, self.world_size, drop_last=self.drop_last)

    def shard_span(self, records: int, shard_sizes: np.ndarray) -> int | None:
        """Without shuffle, ``records`` consecutive positions of a rank cover at most
        ``records * world_size`` consecutive positions of the set (ranks interleave);
        shuffled, they may touch every shard (``None``)."""
        if self.shuffle:
            return None
        if records <= 0:
            return 0
        return span_of_run((records - 1) * self.world_size + 1, shard_sizes)

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


class Subset(EpochOrder):
    """An :class:`EpochOrder` over chosen dataset positions (e.g. the ``kept`` indices of
    :func:`~stoker.sampling.filter_by_label_frequency`); yields dataset positions.

    >>> Subset([10, 20, 30]).indices(0).tolist()
    [10, 20, 30]
    """

    _domain = _DOMAIN_SUBSET

    def __init__(
        self,
        indices: object,
        *,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        self.positions = as_counts(indices, name="indices", what="global positions")
        super().__init__(
            len(self.positions),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    def global_order(self, epoch: int) -> np.ndarray:
        """The chosen positions in this epoch's order, before the rank split."""
        return self.positions[super().global_order(epoch)]

    def fingerprint(self) -> dict:
        return {
            **super().fingerprint(),
            "type": "Subset",
            "positions": array_digest(self.positions),
        }
