"""Several sets as one stream: a weighted mixture's epoch order, split across ranks.

NOTE [ A mixture's epoch ]
Sets ``0..S-1`` hold ``sizes[s]`` samples and are drawn at ``weights`` (normalised to sum 1).
An epoch draws ``quota[s]`` samples of set ``s``:

- by default the set with the largest ``weight / size`` (the first on a tie), ``j``, is drawn
  once whole (``quota[j] = sizes[j]``) and every other set ``weight[s] / weight[j] * sizes[j]``
  times, rounded to the nearest whole (at least 1);
- ``epoch_size=E``: ``E`` draws in all, ``weight[s] * E`` each (largest remainders round).

Set ``s``'s draws run on across epochs: epoch ``e`` makes its draws ``t`` in
``[e * quota[s], (e + 1) * quota[s])``, and draw ``t`` is sample ``perm(s, p)[t % sizes[s]]``
of pass ``p = t // sizes[s]``: each pass is a fresh permutation from ``(seed, s, p)``
(``shuffle=True``), the set's order (``False``), or shard-aware order (``"shards"``: a
:class:`~stoker.sampling.ShardOrder` of one rank over the set's shards, from ``(seed, s)`` and
``p``). So a set drawn less than its size goes on through the rest of its pass next epoch, and
one drawn more repeats with a fresh pass; every pass holds each sample once.

Where the sets' draws sit in the epoch is a permutation from ``(seed, epoch)`` of the slots
(``quota[s]`` slots of set ``s``); the ``k``-th slot of set ``s`` takes its ``k``-th draw of the
epoch. The global order (``sum(quota)`` entries) is then split across ranks by
:func:`~stoker.sampling.split_for_rank`, like :class:`~stoker.sampling.EpochOrder`.

An entry is a draw id: ``p * total + offset[s] + i`` for sample ``i`` of set ``s`` in pass
``p`` (``total = sum(sizes)``, ``offset``: the sets laid end to end). Its position in the sets
laid end to end is ``id % total``. Ids are distinct within an
epoch (a repeat is another pass), so the samples a rank delivered are known exactly (elastic
resume), and a repeat gets an augmentation of its own (the loader's per-sample stream is keyed
by the id).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from stoker._core.checks import check_epoch, check_int, check_rank, check_seed
from stoker._core.seeding import stream_rng
from stoker.sampling._checks import array_digest, as_counts
from stoker.sampling.order import SplitSampler, span_of_run, split_for_rank
from stoker.sampling.shards import DEFAULT_WINDOW, ShardOrder

__all__ = ["MixtureOrder", "mixture_quotas", "set_of"]

_DOMAIN_SLOTS = 10  # where each set's draws sit in an epoch
_DOMAIN_PASS = 11  # one pass of one set (shuffle=True)
_DOMAIN_SET_SEED = 12  # a set's ShardOrder seed (shuffle="shards")


def _weights(weights: object, sets: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (sets,):
        raise ValueError(f"weights must hold one number per set ({sets}), got {w.tolist()}")
    bad = np.flatnonzero(~np.isfinite(w) | (w <= 0))
    if len(bad):
        raise ValueError(f"weights[{int(bad[0])}] = {w[bad[0]]}: every weight must be > 0")
    return w / w.sum()


def mixture_quotas(sizes: object, weights: object, epoch_size: int | None = None) -> np.ndarray:
    """int64: each set's draws per epoch (the NOTE's rule).

    >>> mixture_quotas([120, 60], [0.75, 0.25]).tolist()
    [120, 40]
    """
    n = as_counts(sizes, name="sizes", what="samples per set")
    if len(n) == 0 or n.min() == 0:
        raise ValueError(f"a mixture needs at least one set and no empty set, got sizes {n}")
    w = _weights(weights, len(n))
    if epoch_size is None:
        j = int(np.argmax(w / n))
        q = np.maximum(1, np.rint(w / w[j] * n[j])).astype(np.int64)
        q[j] = n[j]
        return q
    total = check_int("epoch_size", epoch_size, minimum=1)
    exact = w * total
    q = np.floor(exact).astype(np.int64)
    short = total - int(q.sum())
    q[np.argsort(-(exact - q), kind="stable")[:short]] += 1
    return q


def set_of(offsets: np.ndarray, ids: object) -> np.ndarray:
    """int64: the set of each draw id, the sets laid end to end from ``offsets`` (the NOTE)."""
    pos = np.asarray(ids, dtype=np.int64) % int(offsets[-1])
    return (np.searchsorted(offsets, pos, side="right") - 1).astype(np.int64)


class MixtureOrder(SplitSampler):
    """The order of a weighted mixture of sets (see the module docstring); ``indices(epoch)``
    gives draw ids (``id % total``: the position in the sets laid end to end) and
    :meth:`set_of` their sets.

    ``sizes``: samples per set; ``weights``: one positive number per set; ``epoch_size``:
    draws per epoch (default: the largest ``weight / size`` set drawn once whole);
    ``shuffle``: ``True``, ``False`` or ``"shards"`` (then ``shard_sizes``: each set's records
    per shard; ``window``: a :class:`~stoker.sampling.ShardOrder`'s).

    >>> m = MixtureOrder([120, 60], [0.75, 0.25])
    >>> len(m), m.quotas.tolist()
    (160, [120, 40])
    """

    def __init__(
        self,
        sizes: object,
        weights: object,
        *,
        epoch_size: int | None = None,
        shuffle: bool | str = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        shard_sizes: Sequence[object] | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.sizes = as_counts(sizes, name="sizes", what="samples per set")
        self.weights = np.asarray(weights, dtype=np.float64)
        self.epoch_size = epoch_size
        self.quotas = mixture_quotas(self.sizes, self.weights, epoch_size)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.total = int(self.offsets[-1])
        if shuffle not in (True, False, "shards"):
            raise ValueError(f'shuffle must be False, True or "shards", got {shuffle!r}')
        self.shuffle = shuffle
        self.seed = check_seed(seed)
        self.rank, self.world_size = check_rank(rank, world_size)
        self.drop_last = bool(drop_last)
        self.window = check_int("window", window, minimum=1)
        self.epoch = 0
        self._shards: list[ShardOrder] = []
        if shuffle == "shards":
            if shard_sizes is None or len(shard_sizes) != len(self.sizes):
                raise ValueError('shuffle="shards" needs shard_sizes: one array per set')
            for s, per in enumerate(shard_sizes):
                seed_s = int(stream_rng(self.seed, _DOMAIN_SET_SEED, s).integers(1 << 62))
                order = ShardOrder(per, seed=seed_s, window=self.window)
                if order.n != self.sizes[s]:
                    raise ValueError(f"set {s}: its shards hold {order.n}, the set {self.sizes[s]}")
                self._shards.append(order)

    def global_size(self) -> int:
        return int(self.quotas.sum())

    def at_rank(self, rank: int, world_size: int) -> MixtureOrder:
        """This mixture's order at another ``rank`` and ``world_size`` (elastic resume): the
        same sets, quotas and passes, at epoch 0 with no position."""
        other = copy.copy(self)  # the sets' ShardOrders are shared: they know no rank
        other.rank, other.world_size = check_rank(rank, world_size)
        other.epoch, other._resume, other._position = 0, None, None
        return other

    def _pass(self, s: int, p: int) -> np.ndarray:
        """Set ``s``'s order in its pass ``p``."""
        if self.shuffle == "shards":
            return self._shards[s].indices(p)
        if self.shuffle:
            return stream_rng(self.seed, _DOMAIN_PASS, s, p).permutation(int(self.sizes[s]))
        return np.arange(self.sizes[s], dtype=np.int64)

    def draws(self, s: int, first: int, count: int) -> np.ndarray:
        """int64 ids of set ``s``'s draws ``first .. first + count - 1``."""
        n = int(self.sizes[s])
        t = np.arange(first, first + count, dtype=np.int64)
        passes, at = np.divmod(t, n)
        local = np.empty(count, dtype=np.int64)
        for p in np.unique(passes).tolist():
            mine = passes == p
            local[mine] = self._pass(s, p)[at[mine]]
        return passes * self.total + self.offsets[s] + local

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's draw ids, before the rank split."""
        epoch = check_epoch(epoch)
        slots = np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.quotas)
        slots = slots[stream_rng(self.seed, _DOMAIN_SLOTS, epoch).permutation(len(slots))]
        order = np.empty(len(slots), dtype=np.int64)
        for s, q in enumerate(self.quotas.tolist()):
            order[slots == s] = self.draws(s, epoch * q, q)
        return order

    def indices(self, epoch: int) -> np.ndarray:
        order = self.global_order(epoch)
        return split_for_rank(order, self.rank, self.world_size, drop_last=self.drop_last)

    def set_of(self, ids: np.ndarray) -> np.ndarray:
        """The set of each draw id."""
        return set_of(self.offsets, ids)

    def set_span(self, s: int, records: int, shard_sizes: np.ndarray) -> int | None:
        """At most how many of set ``s``'s shards ``records`` consecutive positions of a rank
        touch (``None``: any): those run over at most ``(records - 1) * world_size + 1``
        consecutive draws of the set, in at most two passes."""
        if records <= 0:
            return 0
        run = (records - 1) * self.world_size + 1
        if self.shuffle == "shards":
            one = self._shards[s].shard_span(run, shard_sizes)
        elif self.shuffle:
            return None
        else:
            one = span_of_run(run, shard_sizes)
        return None if one is None else min(int(np.count_nonzero(shard_sizes)), 2 * one)

    def fingerprint(self) -> dict:
        return {
            "type": "MixtureOrder",
            "sizes": self.sizes.tolist(),
            "quotas": self.quotas.tolist(),
            "shuffle": self.shuffle,
            "shards": [array_digest(o.shard_sizes) for o in self._shards],
            "window": self.window,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }
