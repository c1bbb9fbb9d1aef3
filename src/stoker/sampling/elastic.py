"""Elastic resume: the rest of an epoch that ``N`` ranks began, split across ``M`` ranks.

NOTE [ What a saved position promises ]
A loader delivers batch ``j`` of epoch ``e`` on rank ``r`` as ``seq_r[j*b : (j+1)*b]``, where
``seq_r`` is the sampler's ``indices(e)`` for that rank and ``b`` the batch size; with the
loader's ``drop_last`` it delivers ``len(seq_r) // b`` batches, else ``ceil(len(seq_r) / b)``.
The order is a pure function of (seed, epoch, rank, world size), so one number, the batch
``k`` that every rank has reached, says exactly which samples of the epoch all ranks have
delivered: the first ``k`` batches of each rank's order. This holds when every rank saved at
the same batch number, which is the usual checkpoint at step ``k`` (DDP keeps the ranks in
step). So a state saved by rank 0 at step ``k`` stands for every rank at step ``k``; a state
saved by one rank while others were elsewhere describes only that rank.

NOTE [ The rest of an epoch ]
:func:`split_rest` replays the epoch's history, a list of :class:`Segment` (a world size and
the batch all its ranks reached), oldest first:

1. the undelivered samples are those of each rank's batches from ``k`` to the end of its part
   (old rank 0's first, then old rank 1's, ...), without repeats and without any sample that
   some rank already delivered in this epoch (so the old split's padding is not carried on);
2. they are cut into ``M`` contiguous blocks of equal length, one per new rank (contiguous
   keeps a rank on few shards, which a shard-ordered set read through a cache needs); without
   ``drop_last`` the list is padded by wrapping to ``M * ceil(R / M)`` (at most ``M - 1``
   duplicates, ``.padding``); with ``drop_last`` it is cut to whole batches on every rank
   (``.dropped``, at most ``M * b - 1``);
3. the new ranks number their batches so that the rest ends where a full epoch of ``M`` ranks
   ends: the rest starts at batch ``start = len - batches``. ``len(loader)`` stays the
   ``M``-rank epoch's batch count and the loader yields ``len(loader) - start`` batches, as
   after any resume. A rest longer than a full ``M``-rank epoch (only possible with
   ``drop_last`` and unequal shards) is cut to it, and the cut counts in ``.dropped``.

A later segment (a state saved during such a rest) replays the same way: its ranks' orders
are the blocks of step 2. The next epoch uses the plain ``M``-rank order.

Over the epoch every sample the first split would have delivered is delivered once, except the
declared repeats (the old split's padding among the batches already delivered, plus the new
``.padding``) and the declared ``.dropped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from stoker.sampling._checks import check_epoch, check_int, check_rank
from stoker.sampling.base import Sampler
from stoker.sampling.mixture import MixtureOrder
from stoker.sampling.order import EpochOrder, Subset, split_for_rank
from stoker.sampling.shards import ShardOrder

__all__ = [
    "ElasticOrder",
    "Rest",
    "Segment",
    "at_rank",
    "configuration",
    "epoch_batches",
    "is_elastic",
    "split_rest",
]

#: The samplers whose order at another rank and world size can be rebuilt.
_ELASTIC = (EpochOrder, Subset, ShardOrder, MixtureOrder)
_PLACE = ("rank", "world_size")


def is_elastic(sampler: Sampler) -> bool:
    """Whether ``sampler``'s order can be rebuilt at another world size (:func:`at_rank`)."""
    return type(sampler) in _ELASTIC


def at_rank(sampler: Sampler, rank: int, world_size: int) -> Sampler:
    """``sampler``'s configuration at another ``rank`` and ``world_size``.

    Supports :class:`EpochOrder`, :class:`Subset`, :class:`ShardOrder` and
    :class:`MixtureOrder` (exactly those types); another sampler is a ``TypeError``: its order
    cannot be rebuilt from outside.
    """
    rank, world_size = check_rank(rank, world_size)
    if type(sampler) is MixtureOrder:
        return sampler.at_rank(rank, world_size)
    if type(sampler) is ShardOrder:
        return ShardOrder(
            sampler.shard_sizes,
            seed=sampler.seed,
            rank=rank,
            world_size=world_size,
            drop_last=sampler.drop_last,
            window=sampler.window,
            blocks=None if sampler.cuts is None else np.diff(sampler.cuts),
        )
    if type(sampler) in (EpochOrder, Subset):
        e: Any = sampler
        kind: Any = type(sampler)
        return kind(
            e.positions if kind is Subset else e.n,
            shuffle=e.shuffle,
            seed=e.seed,
            rank=rank,
            world_size=world_size,
            drop_last=e.drop_last,
        )
    raise TypeError(
        f"{type(sampler).__name__} cannot resume with another number of ranks: only "
        'EpochOrder, Subset and ShardOrder (the loader\'s shuffle=False/True/"shards") can; '
        "resume it with the world size it was saved with"
    )


def configuration(fingerprint: dict) -> dict:
    """A sampler fingerprint without its place (``rank``, ``world_size``): what must match
    for an elastic resume."""
    return {k: v for k, v in fingerprint.items() if k not in _PLACE}


def epoch_batches(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches a loader makes of ``samples`` per rank: whole ones only with ``drop_last``."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


@dataclass(frozen=True)
class Segment:
    """One part of an epoch: the ranks' world size and the batch they had all reached."""

    world_size: int
    batch: int

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "batch": self.batch}


@dataclass(frozen=True)
class Rest:
    """The rest of an epoch split across ``world_size`` ranks (see the module docstring).

    ``orders[r]``: rank ``r``'s samples, delivered from batch ``start`` on, ``batches``
    batches of ``batch_size`` on every rank. ``remaining``: distinct undelivered samples before the split;
    ``padding``/``dropped``: duplicates the split adds and samples it leaves out;
    ``delivered``: samples delivered before (repeats counted), ``repeated`` of them repeats.
    """

    epoch: int
    world_size: int
    batch_size: int
    history: tuple[Segment, ...]
    orders: tuple[np.ndarray, ...]
    start: int
    batches: int
    remaining: int
    padding: int
    dropped: int
    delivered: int
    repeated: int


def _rank_orders(sampler: Sampler, world: int, epoch: int) -> list[np.ndarray]:
    """Every rank's ``indices(epoch)`` at ``world`` ranks (one global order for EpochOrder)."""
    if isinstance(sampler, (EpochOrder, MixtureOrder)):
        whole = cast(EpochOrder, at_rank(sampler, 0, world))
        g = whole.global_order(epoch)
        return [split_for_rank(g, r, world, drop_last=whole.drop_last) for r in range(world)]
    return [np.asarray(at_rank(sampler, r, world).indices(epoch)) for r in range(world)]


def _frame(sampler: Sampler, world: int, batch_size: int, drop_last: bool) -> int:
    """Batches per rank in a full epoch at ``world`` ranks."""
    return epoch_batches(len(at_rank(sampler, 0, world)), batch_size, drop_last)


def _first_each(values: np.ndarray) -> np.ndarray:
    """``values`` without repeats, in the order of first appearance."""
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)]


def _split(
    rest: np.ndarray, world: int, batch_size: int, drop_last: bool, frame: int
) -> tuple[list[np.ndarray], int, int, int]:
    """``(orders, batches, padding, dropped)``: ``rest`` in ``world`` equal contiguous blocks."""
    n = len(rest)
    if drop_last:
        batches = n // (world * batch_size)
        length = batches * batch_size
    else:
        length = -(-n // world)
        batches = -(-length // batch_size)
    if batches > frame:  # never longer than a full epoch of these ranks
        batches = frame
        length = min(length, frame * batch_size)
    need = world * length
    if need > n:
        body = np.resize(rest, need)  # pads by wrapping
    else:
        body = rest[:need]
    orders = [body[r * length : (r + 1) * length] for r in range(world)]
    return orders, batches, max(0, need - n), max(0, n - need)


def split_rest(
    sampler: Sampler,
    epoch: int,
    batch_size: int,
    *,
    drop_last: bool,
    history: Sequence[Segment],
    world_size: int,
) -> Rest:
    """The rest of ``epoch`` after ``history`` (oldest first, at least one segment), split
    across ``world_size`` ranks; ``sampler``: the order's configuration at any rank and world.

    ``batch_size``: samples per batch; ``drop_last``: the loader's (whole batches only). A
    segment whose batch lies outside its part of the epoch is a ``ValueError``.
    """
    epoch = check_epoch(epoch)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    world_size = check_int("world_size", world_size, minimum=1)
    if not history:
        raise ValueError("split_rest needs the epoch's history: at least one Segment")
    worlds = [s.world_size for s in history]
    orders = _rank_orders(sampler, worlds[0], epoch)
    start, batches = 0, _frame(sampler, worlds[0], batch_size, drop_last)
    done: list[np.ndarray] = []
    padding = dropped = 0
    for i, seg in enumerate(history):
        taken = seg.batch - start
        if not 0 <= taken <= batches:
            raise ValueError(
                f"segment {i} ({seg.world_size} ranks): batch {seg.batch} is outside its part "
                f"of epoch {epoch}, batches {start} to {start + batches}"
            )
        cut = taken * batch_size
        done += [o[:cut] for o in orders]
        tails = [o[cut : batches * batch_size] for o in orders]
        seen = np.concatenate(done)
        rest = _first_each(np.concatenate(tails).astype(np.int64))
        rest = rest[~np.isin(rest, seen)]
        world = worlds[i + 1] if i + 1 < len(history) else world_size
        frame = _frame(sampler, world, batch_size, drop_last)
        orders, batches, padding, dropped = _split(rest, world, batch_size, drop_last, frame)
        start = frame - batches
    return Rest(
        epoch=epoch,
        world_size=world_size,
        batch_size=batch_size,
        history=tuple(history),
        orders=tuple(orders),
        start=start,
        batches=batches,
        remaining=len(rest),
        padding=padding,
        dropped=dropped,
        delivered=len(seen),
        repeated=len(seen) - len(np.unique(seen)),
    )


class ElasticOrder(Sampler):
    """``base`` (a sampler at the new rank and world size), except in ``rest.epoch``, whose
    batches from ``rest.start`` on are this rank's block of ``rest`` (see the module docstring).

    ``len()`` and ``fingerprint()`` are the base's; other attributes (``padding``, ``rank``,
    ...) are forwarded to it. ``rank_shards(epoch)`` of a shard-ordered base gives, in the
    resumed epoch, the shards of this rank's block in the order it first reads them.
    """

    def __init__(self, base: Sampler, rest: Rest) -> None:
        at_rank(base, 0, 1)  # a sampler whose order cannot be rebuilt is a TypeError here
        b: Any = base
        if b.world_size != rest.world_size:
            raise ValueError(
                f"the rest is split for {rest.world_size} ranks, the sampler has {b.world_size}"
            )
        self.base = base
        self.rest_epoch = rest.epoch
        self.start = rest.start
        self.batch_size = rest.batch_size
        self.batches = rest.batches
        self.history = rest.history
        self.rest_padding = rest.padding
        self.rest_dropped = rest.dropped
        self.order = np.asarray(rest.orders[b.rank], dtype=np.int64)
        self.epoch = base.epoch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def __len__(self) -> int:
        return len(self.base)

    def fingerprint(self) -> dict:
        return self.base.fingerprint()

    def indices(self, epoch: int) -> np.ndarray:
        full = np.asarray(self.base.indices(epoch), dtype=np.int64)
        if epoch != self.rest_epoch:
            return full
        # batches before ``start`` are never read after a resume; they hold valid positions
        head = np.resize(full, self.start * self.batch_size) if len(full) else full[:0]
        return np.concatenate([head, self.order])

    def rank_shards(self, epoch: int) -> np.ndarray:
        base: Any = self.base
        if epoch != self.rest_epoch:
            return np.asarray(base.rank_shards(epoch))
        shard = np.searchsorted(base.starts, self.order, side="right") - 1
        return _first_each(shard.astype(np.int64))
