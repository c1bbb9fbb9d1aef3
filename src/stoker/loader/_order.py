"""The sampler a ``Loader`` builds when it is given none: the order ``shuffle=`` names.

- ``shuffle=False``: the set's order; ``True``: one seeded permutation of the whole set per
  epoch (:class:`~stoker.sampling.EpochOrder`); both split across ranks by interleaving;
- ``shuffle="shards"``: shard-aware order (:class:`~stoker.sampling.ShardOrder` with its
  default window): each rank reads whole shards of its own, a few at a time, which is what a
  set read from object storage through a bounded cache needs. The source must be made of
  shards (``source.shard_sizes()``), windowed by blocks where its shards read in blocks
  (``source.block_sizes()``); for another window pass
  ``sampler=stoker.sampling.ShardOrder(source.shard_sizes(), window=k, ...)``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from stoker._core.system import dist_rank
from stoker.formats.remote import ReadPlan
from stoker.loader._mixture import claim_mixture, mixture_order
from stoker.loader.sources import Source
from stoker.loader.sources.mixture import MixtureSource
from stoker.sampling import EpochOrder, MixtureOrder, Sampler, ShardOrder

__all__ = ["check_shuffle", "claim_cache", "default_sampler", "read_plan", "sampler_args"]

SHARDS = "shards"


def check_shuffle(shuffle: object, sampler: Sampler | None) -> bool | str:
    """``shuffle`` as ``False``, ``True`` or ``"shards"``; ``"shards"`` with a ``sampler`` is
    refused (the sampler decides the order alone)."""
    if not isinstance(shuffle, str):
        return bool(shuffle)
    if shuffle != SHARDS:
        raise ValueError(f'shuffle must be False, True or "shards", got {shuffle!r}')
    if sampler is not None:
        name = type(sampler).__name__
        why = (
            "the sampler already is a ShardOrder: drop shuffle="
            if isinstance(sampler, ShardOrder)
            else f"{name} draws from the whole set, so each batch would touch every shard; "
            'use one of them (shuffle="shards" alone, or this sampler with shuffle left out)'
        )
        raise ValueError(f'shuffle="shards" and sampler={name}(...) do not combine: {why}')
    return SHARDS


def sampler_args(
    shuffle: bool | str, rank: int | None, world_size: int | None, drop_last: bool
) -> dict[str, Any]:
    """The default sampler's options, rank and world size looked up when not given."""
    if rank is None or world_size is None:
        r, w = dist_rank()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    return {"shuffle": shuffle, "rank": rank, "world_size": world_size, "drop_last": drop_last}


def _describe(src: Source) -> str:
    for attr in ("path", "root"):  # a format source's path, an image folder's root
        where = getattr(src, attr, None)
        if isinstance(where, (str, os.PathLike)) and where:
            return f"{type(src).__name__} {os.fspath(where)}"
    return type(src).__name__


def default_sampler(
    src: Source,
    *,
    seed: int,
    shuffle: bool | str,
    rank: int,
    world_size: int,
    drop_last: bool,
) -> Sampler:
    """``EpochOrder`` over ``src``, or ``ShardOrder`` over its shards for ``"shards"``; a
    mixture's ``MixtureOrder``."""
    if isinstance(src, MixtureSource):
        where = {"rank": rank, "world_size": world_size}
        return mixture_order(src, seed=seed, shuffle=shuffle, drop_last=drop_last, **where)
    if shuffle != SHARDS:
        return EpochOrder(
            len(src),
            shuffle=bool(shuffle),
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
    sizes = src.shard_sizes()
    if sizes is None:
        raise ValueError(
            f'shuffle="shards" needs a set made of shards; the source {_describe(src)} has '
            "none (an image folder or arrays are read in place): use shuffle=True"
        )
    if int(sizes.sum()) != len(src):
        raise ValueError(
            f"{_describe(src)}: its shards hold {int(sizes.sum())} samples, the source {len(src)}"
        )
    blocks = src.block_sizes()
    return ShardOrder(
        sizes, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last, blocks=blocks
    )


def read_plan(
    sampler: Sampler,
    shard_sizes: np.ndarray,
    *,
    shuffle: bool | str | None,
    per_batch: int,
    prefetch: int,
    workers: int,
) -> ReadPlan:
    """What a loader pins of a set read through a shard cache (``docs/remote.md``).

    With workers, at most ``prefetch`` batches are being made at once, each worker reading one
    chunk of each, and a worker holds the shards of the last chunk it read until its next one:
    every pin lies in the shards of ``prefetch + 1`` consecutive batches of the rank's order
    (one batch without workers). ``sampler.shard_span`` says how many shards that is at most.
    ``shuffle``: what the user passed (``None``: a sampler of theirs), for messages."""
    records = (prefetch + 1) * per_batch if workers else per_batch
    span = sampler.shard_span(records, np.asarray(shard_sizes, dtype=np.int64))
    if shuffle is None:
        order = f"sampler={type(sampler).__name__}"
    else:
        order = 'shuffle="shards"' if shuffle == SHARDS else f"shuffle={bool(shuffle)}"
    rank, world = getattr(sampler, "rank", 0), getattr(sampler, "world_size", 1)
    run = (
        f"rank {rank} of {world}, {workers} workers, "
        f"{prefetch if workers else 1} batches of {per_batch} in flight"
    )
    # ranks of a sequential order interleave, so they read the same shards at once
    shared = span is not None and not isinstance(sampler, ShardOrder)
    return ReadPlan(span, shared, order, run)


def claim_cache(
    src: Source,
    sampler: Sampler,
    *,
    shuffle: bool | str | None,
    per_batch: int,
    prefetch: int,
    workers: int,
) -> Any:
    """A loader's claim on the shard cache its source reads through (``None`` for a source
    without one): the room :func:`read_plan` says it pins; with workers, this process then
    lets go of what it pinned while opening the set."""
    if isinstance(src, MixtureSource) and isinstance(sampler, MixtureOrder):
        opts = {"per_batch": per_batch, "prefetch": prefetch, "workers": workers}
        return claim_mixture(src, sampler, **opts)
    sizes = src.shard_sizes()
    if sizes is None:
        return None
    plan = read_plan(
        sampler, sizes, shuffle=shuffle, per_batch=per_batch, prefetch=prefetch, workers=workers
    )
    remote = src.remote()
    claim = None if remote is None else remote.claim(plan)
    if claim is not None and workers:
        remote.let_go()  # the workers read; this process keeps nothing pinned
    return claim
