"""Where a loader resumes a saved state: the same batches on the same number of ranks, the rest
of the epoch split anew on another (``stoker.sampling.elastic`` holds the arithmetic and the
NOTE on what a saved position promises).

- Same world size, a plain epoch: the state's batch, as saved; the state of any rank serves
  every rank (all ranks of a checkpoint are at the same batch).
- Another world size: the samples of the epoch that no rank delivered yet are split across
  this loader's ranks (equal batch counts, padded by wrapping or cut to whole batches), and
  the loader starts at the batch where that rest begins (``len(loader)`` stays a full epoch of
  the new world; the loader yields ``len(loader) - state["batch"]`` batches). The next epoch
  is the plain order. Only the orders ``shuffle=False/True/"shards"`` build (``EpochOrder``,
  ``Subset``, ``ShardOrder``) can; another sampler is refused, naming it.
- A state saved during such a rest carries the earlier parts (``resumed``) and replays them.
"""

from __future__ import annotations

import logging
from typing import Any

from stoker._core.errors import IncompatibleStateError
from stoker.loader._state import LoaderState
from stoker.sampling import ElasticOrder, Sampler, Segment, split_rest
from stoker.sampling.elastic import configuration, epoch_batches, is_elastic

__all__ = ["place", "resume", "settle"]

log = logging.getLogger("stoker.loader")


def settle(sampler: Sampler) -> Sampler:
    """The plain order under a resumed rest (what a new epoch or ``set_epoch`` uses)."""
    return sampler.base if isinstance(sampler, ElasticOrder) else sampler


def _world(sampler: Sampler) -> int:
    world = getattr(settle(sampler), "world_size", 1)
    return world if isinstance(world, int) and not isinstance(world, bool) else 1


def place(sampler: Sampler, epoch: int, drop_last: bool) -> dict[str, Any]:
    """The state's ``world_size``, ``drop_last`` and ``resumed`` (earlier parts of ``epoch``)."""
    parts: tuple[tuple[int, int], ...] = ()
    if isinstance(sampler, ElasticOrder) and sampler.rest_epoch == epoch:
        parts = tuple((s.world_size, s.batch) for s in sampler.history)
    return {"world_size": _world(sampler), "drop_last": drop_last, "resumed": parts}


def _check_sampler(st: LoaderState, base: Sampler) -> None:
    fp = base.fingerprint()
    if st.sampler == fp:
        return
    elastic = is_elastic(base)
    if elastic and configuration(st.sampler) == configuration(fp):
        return
    why = ""
    if not elastic and configuration(st.sampler) == configuration(fp):
        why = (
            f"; {type(base).__name__} resumes only at the rank and world size it was saved "
            'with (EpochOrder, Subset and ShardOrder, the loader\'s shuffle=False/True/"shards", '
            "resume on any number of ranks)"
        )
    raise IncompatibleStateError(
        f"sampler: the state was saved with {st.sampler}, this loader has {fp}{why}"
    )


def resume(
    st: LoaderState, sampler: Sampler, *, batch_size: int, drop_last: bool
) -> tuple[Sampler, int]:
    """``(sampler, next batch)`` that continue ``st`` on this loader; ``sampler``: this loader's
    order at the state's seed, ``batch_size``: samples per batch, ``drop_last``: the loader's."""
    base = settle(sampler)
    _check_sampler(st, base)
    world = _world(base)
    frame = epoch_batches(len(base), batch_size, drop_last)
    history = [Segment(w, b) for w, b in st.resumed]
    if not history and st.world_size == world:
        if st.batch > frame:
            raise ValueError(f"batch must be in [0, {frame}], got {st.batch}")
        return base, st.batch
    if not is_elastic(base):
        raise IncompatibleStateError(
            f"world_size: the state was saved on {st.world_size} ranks, this loader runs on "
            f"{world}; {type(base).__name__} cannot resume on another number of ranks (only "
            'EpochOrder, Subset and ShardOrder, the loader\'s shuffle=False/True/"shards", can)'
        )
    saved_world = st.sampler.get("world_size", st.world_size)
    if saved_world != st.world_size:
        raise IncompatibleStateError(
            f"world_size: the state says {st.world_size} ranks, its sampler {saved_world}"
        )
    if st.drop_last != drop_last:
        raise IncompatibleStateError(
            f"drop_last: the state was saved with drop_last={st.drop_last}, this loader has "
            f"{drop_last}; batches are counted the same way on both sides of a resume"
        )
    if st.world_size == world:  # the same ranks, inside a rest they already share
        rest = split_rest(
            base, st.epoch, batch_size, drop_last=drop_last, history=history, world_size=world
        )
        if not rest.start <= st.batch <= frame:
            raise ValueError(
                f"batch must be in [{rest.start}, {frame}] (the resumed part of epoch "
                f"{st.epoch}), got {st.batch}"
            )
        return ElasticOrder(base, rest), st.batch
    if not history and st.batch == 0:  # nothing of this epoch delivered yet
        return base, 0
    history.append(Segment(st.world_size, st.batch))
    rest = split_rest(
        base, st.epoch, batch_size, drop_last=drop_last, history=history, world_size=world
    )
    log.info(
        "epoch %d saved by %d ranks at batch %d resumes on %d ranks: %d samples left, "
        "batches %d to %d on each rank (%d padded, %d dropped)",
        st.epoch,
        st.world_size,
        st.batch,
        world,
        rest.remaining,
        rest.start,
        frame,
        rest.padding,
        rest.dropped,
    )
    return ElasticOrder(base, rest), rest.start
