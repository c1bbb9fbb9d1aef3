"""The loader: batches of a source, decoded and augmented by worker processes into a
shared-memory batch ring.

This module is the loader's face: its options, its position in the data (epochs, resuming),
the iteration, and the ``workers=0`` path. The ring and the workers are its base class
:class:`~stoker.loader._feed.RingFeed`, whose module holds the protocol NOTE.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from stoker._core.checks import check_choice, check_int, check_seed, refuse_unknown
from stoker._core.errors import (
    IncompatibleStateError,
    LoaderError,
    SpecError,
    TooManyBadSamplesError,
    without_reprs,
)
from stoker._core.schema import Schema
from stoker._core.seeding import fresh_seed
from stoker._core.specs import ArraySpec
from stoker._core.system import usable_cores
from stoker.formats.remote import RemoteOptions
from stoker.loader import _elastic, _keep, _shm
from stoker.loader._engine import LINUX, choose
from stoker.loader._feed import Epoch, RingFeed
from stoker.loader._fields import FieldPlan, plan_fields
from stoker.loader._habits import DATALOADER_NAMES
from stoker.loader._mixture import open_source, per_set, tag
from stoker.loader._order import check_shuffle, claim_cache, default_sampler, sampler_args
from stoker.loader._pool import WorkerPool, warm_up
from stoker.loader._startup import make_local
from stoker.loader._state import (
    MAX_COUNTER,
    LoaderState,
    check_batch_size,
    check_fraction,
    check_timeout,
)
from stoker.loader.batch import Batch
from stoker.loader.sources import ArraySource, Source
from stoker.loader.sources.shape import input_spec, learned_output
from stoker.pipeline import DecodeOptions, Pipeline
from stoker.sampling import Sampler
from stoker.transforms.compose import as_chain

__all__ = ["Loader", "warm_up"]

log = logging.getLogger("stoker.loader")

_MAX_REJECTS_KEPT = 10_000

_live: weakref.WeakSet[Loader] = weakref.WeakSet()


def _close_all() -> None:
    global _exiting
    _exiting = True  # no pool is kept from here on
    for loader in list(_live):
        with contextlib.suppress(Exception):
            loader.close()
    _keep.release_workers()
    _shm.unlink_owned()


_exiting = False
atexit.register(_close_all)


class Loader(RingFeed):
    """Batches from ``source``, decoded and augmented by worker processes into shared memory.

    See ``docs/loader.md`` for the knobs and the NOTE in ``_feed.py`` for the protocol.

    ``engine``: ``"linux"`` or ``"portable"`` (any platform); ``None`` chooses (``_engine.py``).
    ``start_method``: the workers' start method; ``None`` when ``workers=0``.

    ``shuffle``: ``False`` (the set's order), ``True`` (a permutation of the whole set each
    epoch) or ``"shards"`` (shard-aware order for sets read through a cache; see ``_order``).

    ``mix``: ``MixUp``, ``CutMix`` or ``MixUpCutMix`` (:mod:`stoker.transforms.mix`), run by
    the workers on each batch's rows; the labels become soft targets (docs/policies.md).
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        transforms: Any = None,
        pair_with: Any = None,
        sampler: Sampler | None = None,
        shuffle: bool | str = False,
        seed: int | None = None,
        drop_last: bool = False,
        workers: int | None = None,
        prefetch: int = 2,
        timeout: float | None = None,
        on_error: str = "raise",
        max_bad_fraction: float = 0.001,
        layout: str = "NHWC",
        rank: int | None = None,
        world_size: int | None = None,
        decode: DecodeOptions | None = None,
        on_worker_death: str = "raise",
        fields: list[str] | tuple[str, ...] | None = None,
        keep_workers: float = 0.0,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        prefetch_shards: int = 2,
        allow_hosts: tuple[str, ...] | list[str] = (),
        engine: str | None = None,
        mix: Any = None,
        weights: Any = None,
        epoch_size: int | None = None,
        label_offset: Any = None,
        **unknown: Any,
    ) -> None:
        # DataLoader habits get the stoker spelling by name, not a bare TypeError
        refuse_unknown("Loader", unknown, _PARAMS, DATALOADER_NAMES)
        self._blank(on_worker_death)
        self.batch_size = check_batch_size(batch_size)
        if pair_with is not None and self.batch_size % 2:
            raise ValueError(f"with pair_with, batch_size must be even, got {self.batch_size}")
        workers = min(8, usable_cores()) if workers is None else workers
        self.workers = check_int("workers", workers, minimum=0, maximum=1024)
        self.prefetch = check_int("prefetch", prefetch, minimum=1, maximum=1024)
        self.timeout = check_timeout(timeout)
        self.on_worker_death = check_choice(
            "on_worker_death", on_worker_death, ("raise", "respawn")
        )
        self.on_error = check_choice("on_error", on_error, ("raise", "skip"))
        self.keep_workers = _keep.check_keep(keep_workers)
        self.max_bad_fraction = check_fraction(max_bad_fraction)
        if sampler is not None and not isinstance(sampler, Sampler):
            raise TypeError(
                f"sampler must be a stoker.sampling.Sampler, got {type(sampler).__name__}"
            )
        shuffle = check_shuffle(shuffle, sampler)
        self.drop_last = bool(drop_last)
        self._engine = self._pool.engine = choose(engine, self.workers)  # its server boots now
        self.engine: str = self._engine.name
        self.start_method: str | None = self._engine.start_method if self.workers else None

        _shm.cleanup_stale()
        whole = sampler is None and shuffle is True  # reads from any shard in any batch
        remote = (storage_options, cache_dir, cache_limit, prefetch_shards, tuple(allow_hosts))
        how = RemoteOptions(*remote, whole_set=whole, loader=True)
        src, owned = open_source(source, how, weights, epoch_size, label_offset, sampler)
        self._source: Source | None = src
        self._owns_source = owned
        try:
            self.pipeline = self._make_pipeline(
                src, transforms, pair_with, layout, decode, sampler, fields, mix
            )
            self._seed_given = seed is not None
            self.seed = fresh_seed() if seed is None else check_seed(seed)
            self._own_sampler = sampler is None
            self._sampler_args: dict[str, Any] = {}
            if sampler is None:
                sampler = self._default_sampler(src, shuffle, rank, world_size)
            self.sampler: Sampler = sampler
            self._label_spec = src.label_spec if mix is None else _soft_targets(src, mix)
            self._per_batch = self.batch_size // 2 if pair_with is not None else self.batch_size
            self._claim = claim_cache(
                src,
                self.sampler,
                shuffle=shuffle if self._own_sampler else None,
                per_batch=self._per_batch,
                prefetch=self.prefetch,
                workers=self.workers,
            )
        except BaseException:
            if owned:
                src.close()
            raise
        self._closed = False
        _live.add(self)

    def _blank(self, on_worker_death: str) -> None:
        """The state of a loader before its source, pipeline and workers exist."""
        self._closed = True  # until construction succeeded
        self._owner_pid = os.getpid()
        self._epoch = self._next = self._bad_epoch = self._bad_total = self._warned = 0
        self.rejects: list[dict] = []
        self._fields: FieldPlan | None = None
        self._out_sizes: dict[tuple[int, int], tuple[int, int]] = {}
        # the engine is chosen once the source opens
        self._pool = WorkerPool(on_worker_death, LINUX)
        self._slot_state = []
        self._unreserved = set()
        self._ring_width = None
        self._layout = None
        self._inflight = {}
        self._ring_id = 0
        self._generation = 0
        self._ring = None
        self._mem = None
        self._source = None
        self._owns_source = False

    def _make_pipeline(
        self,
        src: Source,
        transforms: Any,
        pair_with: Any,
        layout: str,
        decode: DecodeOptions | None,
        sampler: Sampler | None,
        fields: list[str] | tuple[str, ...] | None,
        mix: Any = None,
    ) -> Pipeline:
        """The fields the batches carry (``self._fields``) and the pipeline, checked before any
        data flows: ``pair_with`` carries no fields, every step must move the geometric ones;
        with no transforms that fix the size, the one size every image shares (``shape``)."""
        sized = sampler is not None and sampler.variable_size
        self._fields = plan_fields(src.schema, fields, size=sized)
        if self._fields is not None and pair_with is not None:
            raise SpecError(
                "pair_with works on image and label only; this loader carries the fields "
                f"{list(self._fields.schema.extra)} (pass fields=[] to leave them out)"
            )
        wide = sampler is not None and (sampler.variable_width or sized)
        pair_with = as_chain(pair_with)

        def build(chain: Any) -> Pipeline:  # one chain's (PerSet: one per set, _mixture)
            spec, where = input_spec(src, chain, wide, sized, self.on_error)
            return Pipeline(
                spec,
                transforms=chain,
                pair_with=pair_with,
                layout=layout,
                decode=decode or DecodeOptions(),
                variable_width=wide,
                variable_height=sized,
                geometry=self._fields.geometry if self._fields is not None else frozenset(),
                input_from=where,
                learned=learned_output(src, spec, chain, wide, sized),
                mix=mix,
            )

        return per_set(src, transforms, build)

    def _default_sampler(
        self, src: Source, shuffle: bool | str, rank: int | None, world_size: int | None
    ) -> Sampler:
        """The order ``shuffle`` names over ``src`` (``_order``), kept to rebuild on resume."""
        self._sampler_args = sampler_args(shuffle, rank, world_size, self.drop_last)
        return default_sampler(src, seed=self.seed, **self._sampler_args)

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        n = len(self.sampler)
        per = self._per_batch
        return n // per if self.drop_last else -(-n // per)

    @property
    def slots(self) -> int:
        """Batch slots in the ring: ``prefetch`` being made, one the consumer holds, one spare
        for a retained batch."""
        return self.prefetch + 2

    @property
    def output_spec(self) -> ArraySpec:
        """One batch row, layout applied (``None`` width, or height, when the sampler sets it
        per batch)."""
        h_open, w_open = (d is None for d in self.pipeline.sample_spec.shape[:2])
        if h_open or w_open:
            shape: list[int | None] = list(self.pipeline.row_shape(1, 1 if h_open else None))
            nchw = self.pipeline.layout == "NCHW"
            if w_open:
                shape[-1 if nchw else 1] = None
            if h_open:
                shape[-2 if nchw else 0] = None
            return ArraySpec(tuple(shape), self.pipeline.dtype)
        return self.pipeline.output_spec()

    @property
    def schema(self) -> Schema | None:
        """What each batch carries beyond images and labels (``batch.schema``), or ``None``
        when it carries nothing else (the classification path)."""
        return None if self._fields is None else self._fields.schema

    @property
    def source(self) -> Source:
        if self._source is None:
            raise LoaderError("this loader has no source")
        return self._source

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers (or is delivering)."""
        self._normalise_position()
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch at the next iteration."""
        self._epoch = check_int("epoch", epoch, minimum=0, maximum=MAX_COUNTER)
        self._next = 0
        self._bad_epoch = 0
        self.sampler = _elastic.settle(self.sampler)  # a resumed rest ends here
        self._cancel()

    @property
    def stats(self) -> dict:
        return {
            "bad_samples": self._bad_total,
            "bad_samples_this_epoch": self._bad_epoch,
            "rejects": len(self.rejects),
            "respawns": self._pool.respawns,
        }

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise LoaderError("this loader is closed")
        return self._run()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first batch and after close).

        Each worker prints its Python stack on stderr when sent SIGUSR1 and then carries on:
        ``stoker.watch``'s stall watchdog uses this to show where a stuck worker is.
        """
        return self._pool.pids()

    def close(self) -> None:
        """Stop the workers (or keep them, idle, ``keep_workers`` s for the next loader of this
        configuration), remove the shared memory; idempotent."""
        if os.getpid() != getattr(self, "_owner_pid", os.getpid()):
            return  # a forked copy of this object owns nothing
        self._closed = True
        if hasattr(self, "_slot_state"):
            # kept workers: not at exit, nor for a copy of arrays that close() removes
            arrays = self._owns_source and isinstance(self._source, ArraySource)
            if getattr(self, "keep_workers", 0) and not _exiting and not arrays:
                self._park_workers()
            self._teardown()
        claim, self._claim = getattr(self, "_claim", None), None
        if claim is not None:
            with contextlib.suppress(Exception):
                claim.close()
        if getattr(self, "_owns_source", False) and self._source is not None:
            self._owns_source = False
            with contextlib.suppress(Exception):
                self._source.close()
        _live.discard(self)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """JSON-safe position: resume with ``load_state_dict`` (any worker count)."""
        self._normalise_position()
        return LoaderState(
            dataset=self.source.fingerprint(),
            sampler=self.sampler.fingerprint(),
            seed=self.seed,
            batch_size=self.batch_size,
            pair=self.pipeline.pair_with is not None,
            epoch=self._epoch,
            batch=self._next,
            bad_epoch=self._bad_epoch,
            bad_total=self._bad_total,
            **_elastic.place(self.sampler, self._epoch, self.drop_last),
        ).to_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; refuses a state of another dataset, seed or configuration."""
        st = LoaderState.from_dict(state)
        mine = self.source.fingerprint()
        if st.dataset != mine:
            raise IncompatibleStateError(
                f"dataset: the state is for {_describe_fp(st.dataset)}; this loader reads "
                f"{_describe_fp(mine)}"
            )
        if st.batch_size != self.batch_size:
            raise IncompatibleStateError(
                f"batch_size: the state was saved with batch_size={st.batch_size}, this loader "
                f"has {self.batch_size}"
            )
        if st.pair != (self.pipeline.pair_with is not None):
            raise IncompatibleStateError("pair: the state and this loader differ in pair_with")
        if st.seed != self.seed and self._seed_given:
            raise IncompatibleStateError(
                f"seed: the state was saved with seed={st.seed}, this loader has seed={self.seed}"
            )
        sampler = _elastic.settle(self.sampler)
        if self._own_sampler and st.seed != self.seed:
            sampler = default_sampler(self.source, seed=st.seed, **self._sampler_args)
        # the same batch on as many ranks; the rest of the epoch split anew on another count
        sampler, batch = _elastic.resume(
            st, sampler, batch_size=self._per_batch, drop_last=self.drop_last
        )
        self._cancel()  # workers get the seed with each task: they stay up
        self.seed = st.seed
        self.sampler = sampler
        self._epoch, self._next = st.epoch, batch
        self._bad_epoch, self._bad_total = st.bad_epoch, st.bad_total

    # ------------------------------------------------------------------ planning
    def _normalise_position(self) -> None:
        if self._next >= len(self) and len(self) > 0:
            self._epoch += 1
            self._next = 0
            self._bad_epoch = 0

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The epoch's order and per-batch widths and heights (``None``: the chain's own)."""
        idx = np.asarray(self.sampler.indices(epoch), dtype=np.int64)
        if self.pipeline.variable_height:
            bs = getattr(self.sampler, "batch_size", self._per_batch)
            if bs != self._per_batch:
                raise ValueError(
                    f"the sampler makes batches of {bs} samples, the loader of "
                    f"{self._per_batch}; build the sampler with the loader's batch size"
                )
            frames = self._frames(idx)
            return idx, frames[:, 1].copy(), frames[:, 0].copy()
        widths = self.sampler.batch_widths(epoch, self._per_batch)
        if widths is not None:
            widths = np.asarray(widths, dtype=np.int64)
            if len(widths) < len(self) or (len(widths) and widths.min() < 1):
                raise ValueError(
                    f"sampler.batch_widths gave {len(widths)} widths (min "
                    f"{widths.min() if len(widths) else '-'}) for {len(self)} batches"
                )
        elif self.pipeline.sample_spec.shape[1] is None:
            raise SpecError(
                "the transforms leave the width open but the sampler gives no batch_widths"
            )
        return idx, widths, None

    def _frames(self, order: np.ndarray) -> np.ndarray:
        """int64 ``(batches, 2)``: each batch's (height, width), the largest the chain makes of
        its samples' stored sizes (``source.image_sizes()``, read once and kept), so that every
        sample fits and the smaller ones are padded bottom and right."""
        nb, per = len(self), self._per_batch
        if nb == 0:
            return np.zeros((0, 2), dtype=np.int64)
        sizes = self.source.image_sizes()[order[: nb * per]]
        uniq, inv = np.unique(sizes, axis=0, return_inverse=True)
        cache = self._out_sizes
        out = []
        for h, w in uniq.tolist():
            got = cache.get((h, w))
            if got is None:
                got = cache[(h, w)] = self.pipeline.output_hw((h, w))
            out.append(got)
        per_sample = np.asarray(out, dtype=np.int64)[np.asarray(inv).reshape(-1)]
        starts = np.arange(0, len(per_sample), per)[:nb]
        return np.maximum.reduceat(per_sample, starts, axis=0)

    def _batch_plan(
        self, ep: Epoch, number: int
    ) -> tuple[np.ndarray, int | None, int | None, int, int]:
        """Batch ``number``'s ``(indices, width, height, half, rows)``: with ``pair_with`` the
        paired copies start at row ``half`` (the batch's source samples) and ``rows`` is twice
        that; otherwise ``half`` is 0 and ``rows`` the source samples."""
        per = self._per_batch
        bidx = ep.order[number * per : (number + 1) * per]
        width = None if ep.widths is None else int(ep.widths[number])
        height = None if ep.heights is None else int(ep.heights[number])
        half = len(bidx) if self.pipeline.pair_with is not None else 0
        return bidx, width, height, half, len(bidx) + half

    # ------------------------------------------------------------------ iteration
    def _run(self) -> Iterator[Batch]:
        self._normalise_position()
        epoch, start = self._epoch, self._next
        order, widths, heights = self._plan(epoch)
        if self.workers:
            self._ensure_running(
                None if widths is None else int(widths.max(initial=1)),
                None if heights is None else int(heights.max(initial=1)),
            )
        self._cancel()  # a new iteration supersedes any earlier one
        gen = self._generation
        nb = len(self)
        ep = Epoch(gen, epoch, order, widths, deque(range(start, nb)), heights)
        held: Batch | None = None
        per = self._per_batch
        ahead = (r := self.source.remote()) and r.read_ahead(order, start * per)  # downloads
        try:
            if self.workers == 0:
                for number in range(start, nb):
                    batch = make_local(self, ep, number)  # workers=0: into fresh arrays here
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
                    self._next = number + 1
                    if ahead is not None:
                        ahead.reached(self._next * per)
                    if batch is not None:
                        yield tag(batch, self._source)
            else:
                for number in range(start, nb):
                    self._dispatch(ep)
                    if ahead is not None:  # downloads run ahead of what the workers were given
                        ahead.reached((ep.pending[0] if ep.pending else nb) * per)
                    batch = self._wait(ep, number)
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
                    if held is not None and not held._retained:
                        held.release()
                    held = None
                    self._next = number + 1
                    if batch is None:
                        continue
                    held = batch
                    yield tag(batch, self._source)
                    if gen != self._generation:
                        raise LoaderError("this iteration was superseded by a newer one")
            if gen == self._generation:
                self._epoch, self._next, self._bad_epoch = epoch + 1, 0, 0
        except GeneratorExit:
            if gen == self._generation:
                self._cancel()
            raise
        except BaseException:
            if gen == self._generation and not self._closed:
                self._teardown_workers(grace=0.2)  # a worker may be hung: do not wait long
            raise
        finally:
            if held is not None and not held._retained:
                held.release()
            if ahead is not None:
                ahead.close()

    def _account(self, epoch: int, bad: list) -> None:
        """Count skipped samples of a delivered batch; trip the breaker."""
        if not bad:
            return
        for _row, index, key, reason in bad:
            self._bad_epoch += 1
            self._bad_total += 1
            if len(self.rejects) < _MAX_REJECTS_KEPT:
                self.rejects.append({"epoch": epoch, "index": index, "key": key, "reason": reason})
            self._warned += 1
            w = self._warned
            if w <= 10 or (w <= 1000 and w % 100 == 0) or w % 10_000 == 0:
                log.warning(
                    "skipped sample key %s (position %s): %s [%d skipped so far]",
                    key,
                    index,
                    reason,
                    w,
                )
        ceiling = self.max_bad_fraction * len(self.sampler)
        if self._bad_epoch > ceiling:
            last = bad[-1]
            raise TooManyBadSamplesError(
                f"{self._bad_epoch} bad samples in epoch {epoch} exceed max_bad_fraction="
                f"{self.max_bad_fraction} of {len(self.sampler)} samples (last: key {last[2]}: "
                f"{without_reprs(str(last[3]))}); see loader.rejects"
            )


def _soft_targets(src: Source, mix: Any) -> ArraySpec:
    """The labels of mixed batches: float32 soft targets of ``mix.num_classes``, made from the
    set's integer class labels."""
    lab = src.label_spec
    if lab.shape or np.dtype(lab.dtype).kind not in "iu":
        raise SpecError(
            f"mix makes soft targets of integer class labels; this set's labels are "
            f"{lab.describe()}"
        )
    return ArraySpec((int(mix.num_classes),), "float32")


def _describe_fp(fp: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in fp.items())


_PARAMS = [p for p in inspect.signature(Loader.__init__).parameters if p not in ("self", "unknown")]
