"""A loader over several sets (``Loader([A, B], weights=[...])``): the sets opened as one
:class:`~stoker.loader.sources.mixture.MixtureSource`, the mixture's order
(:class:`~stoker.sampling.MixtureOrder`) and its one claim on the node's shard cache
(:func:`claim_mixture`, the only place a mixture claims cache room)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import CacheFullError, SpecError, size_text
from stoker.formats.remote import ReadPlan, RemoteOptions
from stoker.loader.sources import as_source
from stoker.loader.sources.mixture import MixtureSource, let_go
from stoker.pipeline import Pipeline
from stoker.sampling import MixtureOrder, Sampler
from stoker.transforms.compose import PerSet, as_chain

__all__ = ["claim_mixture", "mixture_order", "open_source", "per_set", "tag"]


def open_source(
    source: Any,
    remote: RemoteOptions,
    weights: Any,
    epoch_size: int | None,
    label_offset: Any,
    sampler: Sampler | None,
) -> tuple[Any, bool]:
    """``(reader, owned)``: a list of sets as a :class:`MixtureSource` (``weights`` required,
    ``label_offset``: a list of ints or ``True`` to stack the sets' classes), anything else as
    :func:`as_source` opens it (the mixture's options are then refused)."""
    if not isinstance(source, list):
        given = [n for n, v in (("weights", weights), ("epoch_size", epoch_size)) if v is not None]
        if given or label_offset is not None:
            raise ValueError(
                f"{', '.join(given) or 'label_offset'}= mixes several sets: pass them as a list, "
                "Loader([SET_A, SET_B], weights=[0.75, 0.25], ...)"
            )
        return as_source(source, remote=remote)
    if weights is None:
        raise ValueError(f"a list of {len(source)} sets needs weights=, one number per set")
    if sampler is not None:
        raise ValueError(
            f"sampler={type(sampler).__name__}(...) does not combine with a mixture of sets: "
            "the mixture's order (weights=, epoch_size=, shuffle=) decides which samples come"
        )
    readers: list[Any] = []
    owned: list[bool] = []
    try:
        for s in source:
            r, own = as_source(s, remote=remote)
            readers.append(r)
            owned.append(own)
            let_go(r)  # what opening it pinned: the next set opens beside nothing held
        mix = MixtureSource(
            readers,
            weights,
            epoch_size=epoch_size,
            label_offsets=_offsets(readers, label_offset),
            owned=owned,
        )
    except BaseException:
        for r, own in zip(readers, owned):
            if own:
                r.close()
        raise
    return mix, True


def per_set(src: Any, transforms: Any, build: Callable[[Any], Pipeline]) -> Pipeline:
    """``build(chain)`` of ``transforms`` as one chain, or with :class:`PerSet` of each set's
    (``Pipeline.per_set``), every one ending in set 0's sample shape and dtype: else a
    ``SpecError`` naming the set."""
    if not isinstance(transforms, PerSet):
        return build(as_chain(transforms))
    sets = src.readers if isinstance(src, MixtureSource) else [src]
    if len(transforms.chains) != len(sets):
        raise ValueError(
            f"PerSet holds {len(transforms.chains)} chains for {len(sets)} set(s): one per set "
            "of a mixture, Loader([SET_A, SET_B], weights=..., transforms=PerSet([ta, tb]))"
        )
    pipes: list[Pipeline] = []
    for s, chain in enumerate(transforms.chains):
        try:
            pipes.append(build(chain))
            end, first = pipes[s].sample_spec, pipes[0].sample_spec
            if end != first:
                raise SpecError(f"it ends in {end.describe()}, set 0's in {first.describe()}")
        except SpecError as e:
            raise SpecError(f"PerSet: the chain of set {s} ({sets[s].path}): {e}") from e
    return dataclasses.replace(pipes[0], per_set=tuple(pipes))


def _offsets(readers: list[Any], label_offset: Any) -> list[int] | None:
    if label_offset is None or label_offset is False:
        return None
    if label_offset is True:  # each set's classes after the previous sets'
        tops = [int(np.max(r.labels(), initial=-1)) + 1 for r in readers]
        return np.concatenate([[0], np.cumsum(tops)[:-1]]).astype(int).tolist()
    offsets = list(label_offset)
    if len(offsets) != len(readers) or not all(isinstance(o, int) for o in offsets):
        raise ValueError(
            f"label_offset must be True or one int per set ({len(readers)}), got {label_offset!r}"
        )
    return offsets


def mixture_order(
    src: MixtureSource,
    *,
    seed: int,
    shuffle: bool | str,
    rank: int,
    world_size: int,
    drop_last: bool,
) -> MixtureOrder:
    """The mixture's order; ``shuffle="shards"`` reads each set shard by shard."""
    shards = None
    if shuffle == "shards":
        shards = [r.shard_sizes() for r in src.readers]
        flat = [s for s, per in enumerate(shards) if per is None]
        if flat:
            raise ValueError(
                f'shuffle="shards" needs sets made of shards; set {flat[0]} '
                f"({src.readers[flat[0]].path}) has none: use shuffle=True"
            )
    return MixtureOrder(
        src.sizes,
        src.weights,
        epoch_size=src.epoch_size,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        shard_sizes=shards,
    )


def claim_mixture(
    src: MixtureSource, sampler: MixtureOrder, *, per_batch: int, prefetch: int, workers: int
) -> Any:
    """The mixture's claim on the node's shard cache: every remote set's room, claimed one
    after another in the same budget, so that they must fit together; a set that does not
    fit beside the others is a :class:`CacheFullError` naming each set's share and what it
    claimed. With workers, this process then lets go of what it pinned while opening."""
    records = (prefetch + 1) * per_batch if workers else per_batch
    total = sampler.global_size()
    shares = [
        f"set {s} ({r.path}): weight {w / sum(sampler.weights):.3g}, {int(q)} of {total} draws"
        for s, (r, w, q) in enumerate(zip(src.readers, sampler.weights, sampler.quotas))
    ]
    src.let_go()  # what the probes at open pinned: from here the claims below cover the reads
    claims = contextlib.ExitStack()  # its close() closes every claim
    held: list[str] = []
    for s, r in enumerate(src.readers):
        sizes = r.shard_sizes()
        if sizes is None:
            continue
        span = sampler.set_span(s, records, np.asarray(sizes, dtype=np.int64))
        order = f"a mixture with shuffle={sampler.shuffle!r}"
        run = f"rank {sampler.rank} of {sampler.world_size}, {workers} workers"
        try:
            remote = r.remote()
            claim = None if remote is None else remote.claim(ReadPlan(span, True, order, run))
        except CacheFullError as e:
            claims.close()
            raise CacheFullError(
                f"the mixture's sets do not fit the shard cache together ({'; '.join(shares)} "
                f"an epoch). Claimed: {'; '.join(held) or 'nothing'}. Refused: set {s}: {e}"
            ) from None
        if claim is not None:
            claims.callback(claim.close)
            nbytes = getattr(claim, "bytes", None)
            held.append(f"set {s} {size_text(nbytes)}" if nbytes else f"set {s}")
    if held and workers:
        src.let_go()
    return claims if held else None


def tag(batch: Any, src: Any) -> Any:
    """``batch`` with ``batch.source`` (each row's set) when ``src`` is a mixture."""
    if isinstance(src, MixtureSource):
        batch.source = src.set_of(batch.indices)
    return batch
