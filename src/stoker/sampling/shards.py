"""Shard-aware order: each rank reads whole shards, a few at a time.

A remote shard is downloaded whole into a bounded cache, so a global shuffle would fetch every
shard for every batch. :class:`ShardOrder` keeps the reads local to a few shards. Each epoch,
from ``(seed, epoch)``:

1. the shards are permuted;
2. they are dealt by sample count to ``world_size`` slots: largest shard first (shards of equal
   size in permuted order), each to the slot with the fewest samples so far (ties to the lower
   slot), and the slots are handed to the ranks in a permuted order. A rank reads each of its
   shards once per epoch and no other rank reads them;
3. a rank reads its shards in permuted order, ``window`` consecutive shards at a time, the
   samples of one window shuffled together (from ``(seed, epoch, rank, window number)``).
   A set whose shards read in blocks (``blocks``: a Parquet row group, a compressed chunk)
   is windowed by blocks instead: the rank's shards in the same order, each cut into its
   blocks, ``window`` consecutive blocks at a time, so a window decodes few blocks.

Equal steps: every rank yields the same number of samples (unequal step counts deadlock DDP),
and that number is the same every epoch. Dealing largest first makes the slots' sample counts
a function of the shard sizes alone (shards of one size are interchangeable), so they are the
same every epoch (:func:`slot_loads`), and as even as whole shards allow (the largest and
smallest slot differ by at most the largest shard). Without ``drop_last`` every rank is padded
to the fullest slot by wrapping its own order (``.padding`` duplicates per epoch over all
ranks); with ``drop_last`` every rank is cut to the emptiest slot (``.dropped`` per epoch).
Which shards share a slot changes every epoch among shards of equal size (a packed set's
shards are all one size but the last); shards of distinct sizes keep their slot mates and
change rank.
"""

from __future__ import annotations

import heapq

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
from stoker.sampling.order import runs_touched, span_of_run

__all__ = ["DEFAULT_WINDOW", "ShardOrder", "slot_loads"]

_DOMAIN_SHARDS = 6  # the shard permutation of an epoch
_DOMAIN_SLOTS = 7  # which rank takes which slot
_DOMAIN_WINDOW = 8  # the sample shuffle inside one window of shards
#: Shards whose samples a rank shuffles together (``ShardOrder(window=)``).
DEFAULT_WINDOW = 4


def _deal(order: np.ndarray, sizes: np.ndarray, world: int) -> np.ndarray:
    """The slot of each shard: shards in ``order`` to the slot with the fewest samples so far,
    ties to the lower slot."""
    slot = np.empty(len(sizes), dtype=np.int64)
    heap = [(0, r) for r in range(world)]
    for j in order.tolist():
        load, r = heapq.heappop(heap)
        slot[j] = r
        heapq.heappush(heap, (load + int(sizes[j]), r))
    return slot


def _largest_first(perm: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``perm`` sorted by shard size, largest first; equal sizes keep their permuted order."""
    return perm[np.argsort(-sizes[perm], kind="stable")]


def slot_loads(shard_sizes: object, world_size: int) -> np.ndarray:
    """int64 ``(world_size,)``: the samples each slot of the split holds. The deal sees the
    shards largest first, so it sees the same sizes in the same order every epoch: the loads
    do not depend on the permutation.

    >>> slot_loads([5, 3, 4, 1, 6], 3).tolist()
    [6, 6, 7]
    """
    sizes = as_counts(shard_sizes, name="shard_sizes", what="records per shard")
    world = check_int("world_size", world_size, minimum=1)
    slot = _deal(_largest_first(np.arange(len(sizes)), sizes), sizes, world)
    return np.bincount(slot, weights=sizes, minlength=world).astype(np.int64)


class ShardOrder(Sampler):
    """Shard-aware order over a set of shards; see the module docstring.

    ``shard_sizes``: records per shard, global positions running through the shards in order
    (what ``source.shard_sizes()`` gives). ``window`` (default :data:`DEFAULT_WINDOW`, 4):
    shards whose samples are shuffled together (``blocks``, records per block in position
    order, each shard cut into whole blocks: blocks). At any point of a rank's order at most
    ``window`` of its shards are begun and not finished, so a cache that holds ``window``
    shards per rank (plus those fetched ahead) never fetches one twice in an epoch; a larger
    window mixes more, a smaller one needs less cache.

    ``len(s)``: samples per rank, every epoch: the fullest slot of :func:`slot_loads`, or
    the emptiest with ``drop_last``; ``.padding`` and ``.dropped``: duplicates added or
    samples left out per epoch over all ranks. The set needs at least ``world_size`` non-empty
    shards (else ``ValueError``: repack with smaller shards, or use the global shuffle).

    Samplers that draw from the whole set (:class:`~stoker.sampling.ClassBalanced`,
    :class:`~stoker.sampling.LengthBuckets`) do not combine with shard order: each batch would
    touch every shard. ``Loader`` refuses ``sampler=`` together with ``shuffle="shards"``.

    >>> s = ShardOrder([5, 3, 4, 1, 6], world_size=3)
    >>> len(s), s.padding, ShardOrder([5, 3, 4, 1, 6], world_size=3, drop_last=True).dropped
    (7, 2, 1)
    """

    def __init__(
        self,
        shard_sizes: object,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        window: int = DEFAULT_WINDOW,
        blocks: object = None,
    ) -> None:
        self.shard_sizes = as_counts(shard_sizes, name="shard_sizes", what="records per shard")
        self.starts = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)
        self.n = int(self.starts[-1])
        self.cuts = None  # block boundaries, shard boundaries among them
        if blocks is not None:
            sizes = as_counts(blocks, name="blocks", what="records per block")
            self.cuts = np.unique(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
            if self.cuts[-1] != self.n or not np.isin(self.starts, self.cuts).all():
                raise ValueError("blocks must cut each shard into whole blocks")
        self.rank, self.world_size = check_rank(rank, world_size)
        self.seed = check_seed(seed)
        self.drop_last = bool(drop_last)
        self.window = check_int("window", window, minimum=1)
        self.epoch = 0
        full = int(np.count_nonzero(self.shard_sizes))
        if full < self.world_size:
            raise ValueError(
                f"shard order needs at least one non-empty shard per rank: the set has {full} "
                f"non-empty shards for world_size={self.world_size}; repack it with smaller "
                "shards (stoker pack --shard-size) or use shuffle=True"
            )
        loads = slot_loads(self.shard_sizes, self.world_size)
        self._len = int(loads.min() if self.drop_last else loads.max())

    @property
    def padding(self) -> int:
        """Duplicates added per epoch over all ranks (0 with ``drop_last``)."""
        return 0 if self.drop_last else self._len * self.world_size - self.n

    @property
    def dropped(self) -> int:
        """Samples left out per epoch over all ranks (0 without ``drop_last``)."""
        return self.n - self._len * self.world_size if self.drop_last else 0

    def __len__(self) -> int:
        return self._len

    def _split(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(perm, owner)``: the epoch's shard permutation and the rank of each shard."""
        epoch = check_epoch(epoch)
        perm = stream_rng(self.seed, _DOMAIN_SHARDS, epoch).permutation(len(self.shard_sizes))
        slot = _deal(_largest_first(perm, self.shard_sizes), self.shard_sizes, self.world_size)
        to_rank = stream_rng(self.seed, _DOMAIN_SLOTS, epoch).permutation(self.world_size)
        return perm.astype(np.int64), to_rank[slot].astype(np.int64)

    def owners(self, epoch: int) -> np.ndarray:
        """int64 ``(shards,)``: the rank that reads each shard in ``epoch``."""
        return self._split(epoch)[1]

    def rank_shards(self, epoch: int) -> np.ndarray:
        """This rank's shards in ``epoch``, in the order it reads them (``window`` at a time):
        what a downloader fetches ahead."""
        perm, owner = self._split(epoch)
        return perm[owner[perm] == self.rank]

    def _runs(self, shards: np.ndarray) -> list[tuple[int, int]]:
        """What a window groups, as ``(first, end)`` positions: ``shards``, or their blocks."""
        s, c = self.starts, self.cuts
        if c is None:
            return [(s[j], s[j + 1]) for j in shards.tolist()]
        at = np.searchsorted(c, s)
        return [(c[k], c[k + 1]) for j in shards.tolist() for k in range(at[j], at[j + 1])]

    def indices(self, epoch: int) -> np.ndarray:
        mine = self._runs(self.rank_shards(epoch))
        parts = []
        for w, first in enumerate(range(0, len(mine), self.window)):
            group = mine[first : first + self.window]
            pos = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in group])
            rng = stream_rng(self.seed, _DOMAIN_WINDOW, epoch, self.rank, w)
            parts.append(pos[rng.permutation(len(pos))])
        order = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if len(order) >= self._len:
            return order[: self._len]
        return np.resize(order, self._len)  # pads by wrapping its own order

    def shard_span(self, records: int, shard_sizes: np.ndarray) -> int | None:
        """A rank reads windows of ``window`` shards one after another (its last window may
        hold fewer; the padding that wraps to its order's start is one window more). A run
        of ``records`` positions touches the windows it begins and ends in and those wholly
        inside it, at most one of which is short: ``2 * window`` shards while the run is
        shorter than the smallest shard."""
        sizes = self.shard_sizes
        full = int(np.count_nonzero(sizes))
        if full == 0 or records <= 0:
            return 0
        if self.cuts is not None:  # the two windows it ends in, and whole shards between
            return int(min(full, 2 * self.window + span_of_run(records, sizes)))
        # windows of `window` shards; a rank's last window may be short, and lies inside a
        # run only when the padding that wraps to the order's start follows it
        windows = runs_touched(records, np.sort(sizes), self.window, short=bool(self.padding))
        return int(min(full, windows * self.window))

    def fingerprint(self) -> dict:
        return {
            "type": "ShardOrder",
            "n": self.n,
            "shards": len(self.shard_sizes),
            "shard_sizes": array_digest(self.shard_sizes),
            "window": self.window,
            **({} if self.cuts is None else {"blocks": array_digest(np.diff(self.cuts))}),
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }
