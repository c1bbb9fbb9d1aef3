"""``CudaPrefetcher``: batches arrive on the device, converted and normalised there.

NOTE [ CUDA prefetch stream protocol ]

Streams: one side stream per prefetcher, created once in ``__init__`` (never per epoch). The
consumer stream is whatever stream is current when the consumer asks for the next batch.

Per batch (``_launch``):
1. the side stream waits on the consumer stream (``side.wait_stream(consumer)``), so nothing
   the side stream does overtakes work the consumer queued earlier;
2. every host array of the batch (images, labels, and the columns and lengths of its fields;
   text and bytes stay on the host) is copied into a pinned staging buffer taken from a pool
   keyed by (shape, dtype) (a CPU tensor that is already pinned is used as it is);
3. on the side stream: one ``non_blocking`` host-to-device copy per leaf, then a ``copy`` event;
   then conversion of the image leaves (uint8 -> float32, NHWC -> NCHW, ``(x - mean) / std``,
   optional flip/erase, cast to ``dtype``, memory format), then a ``ready`` event.
   Only uint8 crosses the bus; all arithmetic happens on the device.

Buffer ownership:
- a stoker shared-memory slot is ``retain()``ed at launch and ``release()``d only once that
  batch's ``copy`` event has completed (``event.query()``; before asking the loader for the
  next batch the prefetcher holds at most ``depth`` slots, waiting with
  ``event.synchronize()`` on the oldest if needed, so the loader's ring never runs dry:
  a ``stoker.Loader`` has ``Loader.slots`` slots, so ``depth <= slots - 1``, checked up front);
- a pinned staging buffer returns to its pool only once the ``copy`` event of the batch that
  used it has completed; a pool grows to at most ``depth + 2`` buffers per (shape, dtype), after
  that the prefetcher waits for the oldest copy; at most ``MAX_SHAPES`` (4) keys are kept (two
  batches' worth when a batch with fields has more shapes): a new
  shape (a partial last batch, per-batch widths) drops the least recently used keys whose
  buffers are all free (``stoker.torch._staging``);
- a pinned tensor supplied by the loader is referenced until its ``copy`` event completed;
- a tensor already on the device is not copied; it is ``record_stream``ed on the side stream,
  which the conversion reads it on;
- device tensors are made on the side stream; before a batch is handed over, the consumer
  stream waits on its ``ready`` event (``consumer.wait_event``, no host block) and every
  output tensor gets ``record_stream(consumer)``, so the caching allocator does not give its
  memory to the side stream while the consumer may still read it.

A launch that fails (on CUDA the copy and the conversion are issued inside the launch: an OOM,
a mean/std channel mismatch, a Ctrl-C) gives back what it took before the error propagates:
if no copy was queued yet, its slot and staging buffers at once; otherwise the batch is held
like any other until an event recorded after the failure has completed (if even that event
cannot be recorded, the slot is released and the buffers are dropped, never reused).

Order: ``depth`` batches are launched ahead of the one the consumer holds. An empty loader
yields nothing. An exception from the wrapped loader surfaces from ``next()`` at once (batches
launched ahead of it are dropped) after the shutdown below.

State: each ``iter()`` owns its loader iterator, its batches launched ahead and those still
holding host memory (``_StreamRun``); only the side stream and the pools (whose buffers each
carry the event they wait for) are shared between iterations.

Shutdown (end of data, ``break``, an exception or Ctrl-C inside ``next()``, garbage
collection of the generator): every copy event this iteration holds is synchronised and its
slot released, then the loader's iterator is closed. A wait that fails (a sticky CUDA error)
does not stop the releases: the first error is raised after all of them. The side stream and
the pools live as long as the prefetcher and are reused across epochs.

Timeouts: none of its own. The only host waits are on events of copies already queued
(bounded by the device); a stalled loader is bounded by the loader's own ``timeout=``.

Every stream, event and pinned-memory operation goes through a backend
(:class:`stoker.torch.backend.Backend`; :class:`~stoker.torch.backend.CudaBackend` on a GPU),
so the protocol above is checked with fakes on a machine without CUDA.

Without CUDA (``device="cpu"``, or no CUDA available) there are no streams, events or pinned
buffers: each batch is converted synchronously on the CPU by the same code, so a training
script written for a GPU runs unchanged on a laptop.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stoker.loader import Loader
from stoker.torch._batch import Tree, flatten, follows_slot_protocol
from stoker.torch._staging import MAX_SHAPES, Pinned, StagingPools
from stoker.torch.augment import batch_generator
from stoker.torch.backend import Backend, CudaBackend
from stoker.torch.convert import (
    LAYOUTS,
    channel_tensor,
    check_units,
    convert_images,
    convert_px,
    resolve_scale,
)

__all__ = ["CudaPrefetcher", "convert_images"]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    torch.float32: torch.float32,
    torch.float16: torch.float16,
    torch.bfloat16: torch.bfloat16,
}


@dataclass
class _Flight:
    """One launched batch: its events, its output, and what it holds until its copy is done."""

    copy_event: Any
    ready_event: Any
    output: Any  # handle with .result() -> (tree, device leaves)
    holds: list[Callable[[], None]] = field(default_factory=list)

    def release(self) -> None:
        holds, self.holds = self.holds, []
        for fn in holds:
            fn()


def _check_depth_fits_ring(loader: Iterable[Any], depth: int) -> None:
    """Refuse a ``depth`` that would hold every free slot of the loader's batch ring.

    The prefetcher holds up to ``depth`` slots when it asks for the next batch, and the loader
    needs one more to fill: ``depth <= slots - 1``. A ``stoker.Loader`` says how many slots its
    ring has; another iterable with an int ``prefetch`` is taken to be a loader like it, with
    ``prefetch + 2`` slots; any other iterable has no ring to check.
    """
    prefetch = getattr(loader, "prefetch", None)
    if isinstance(loader, Loader):
        slots = loader.slots
    elif isinstance(prefetch, int) and not isinstance(prefetch, bool):
        slots = prefetch + 2
    else:
        return
    if depth > slots - 1:
        raise ValueError(
            f"depth {depth} would hold more batch slots than the loader can spare "
            f"(prefetch={prefetch}: {slots} slots); use depth <= {slots - 1} or a loader with "
            f"prefetch >= {depth - 1}"
        )


def _as_host_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        return torch.from_numpy(x)
    return x


class CudaPrefetcher:
    """Wrap an iterable of batches; yield them on ``device``, images converted there.

    ``loader`` yields stoker batches (from ``stoker.Loader`` or :func:`as_tensors`, yielded as
    :class:`~stoker.torch.TensorBatch`), tensors or arrays, or tuples, lists or dicts of them
    (from a plain ``torch.utils.data.DataLoader``); the structure is kept. The image entries
    (the bare tensor, ``batch.images``, or the dict keys / tuple positions in
    ``normalize_keys``) become NCHW ``dtype`` tensors ``(x / scale - mean) / std``, the
    convention of :class:`stoker.transforms.Normalize`: ``mean``/``std`` per channel in 0-1
    units (torchvision's ImageNet constants as they are), ``scale`` 255 for integer images and
    1 for float ones unless given (statistics above 1 with the default scale are refused: they
    look like pixel units);
    other arrays are copied to the device unchanged. ``flip_p``/``erase_p`` add a random
    horizontal flip / random erasing per image, drawn on the device from (``seed``, epoch,
    batch number). ``depth`` batches are copied ahead of the one in use.

    ``device=None`` picks CUDA when available, else the CPU; on the CPU the same conversion
    runs synchronously. See the NOTE at the top of this module for the stream protocol.
    ``backend`` replaces the CUDA streams and events (its ``device`` is used, ``device`` is
    ignored): see :mod:`stoker.torch.backend` (the test doubles: ``tests/torch/torch_doubles.py``).

    Pinned staging buffers are kept per (shape, dtype): at most ``depth + 2`` per key and at
    most ``pool_shapes`` keys, or twice the distinct (shape, dtype) of one batch when a batch
    with fields has more (the least recently used idle ones are dropped).

    A stoker batch with fields (``Loader(..., fields=...)``) comes out as a
    :class:`~stoker.torch.TensorBatch` whose numeric, mask, size and ragged columns and ragged
    lengths were copied with the images, on the side stream, the same way; text and bytes stay
    on the host (see :class:`~stoker.torch.TensorBatch`). ``flip_p`` is refused for a batch
    with boxes, points or masks: flip them in the loader's transforms, which move them too.
    """

    pool_shapes: int = MAX_SHAPES

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        device: str | torch.device | None = None,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        scale: float | None = None,
        dtype: torch.dtype | str = torch.float32,
        channels_last: bool = False,
        normalize_keys: Sequence[str | int] = ("images", 0),
        layout: str = "auto",
        flip_p: float = 0.0,
        erase_p: float = 0.0,
        seed: int = 0,
        depth: int = 1,
        backend: Backend | None = None,
    ) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader must be iterable, got {type(loader).__name__}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if scale is not None and not (np.isfinite(float(scale)) and float(scale) > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        check_units(mean, std, scale)
        for name, p in (("flip_p", flip_p), ("erase_p", erase_p)):
            if not 0.0 <= float(p) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (batches copied ahead), got {depth!r}")
        _check_depth_fits_ring(loader, depth)
        if isinstance(normalize_keys, (str, int)):
            normalize_keys = (normalize_keys,)
        self.loader = loader
        self.dtype = _DTYPES[dtype]
        self.channels_last = bool(channels_last)
        self.normalize_keys = tuple(normalize_keys)
        self.layout = layout
        self.flip_p = float(flip_p)
        self.erase_p = float(erase_p)
        self.seed = int(seed)
        self.depth = depth
        self.epoch = 0

        self._backend: Backend | None
        if backend is not None:
            self._backend = backend
            self.device = backend.device
        else:
            self.device = self._pick_device(device)
            self._backend = CudaBackend(self.device) if self.device.type == "cuda" else None
        # the statistics in the images' own units, per kind of input: scaled once, not per batch
        self.scale = scale
        self._stats: dict[bool, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        for is_float in (False, True):
            k = resolve_scale(scale, torch.float32 if is_float else torch.uint8)
            self._stats[is_float] = (
                channel_tensor(mean, "mean", self.device, k),
                channel_tensor(std, "std", self.device, k),
            )
        self._side = self._backend.new_stream() if self._backend is not None else None
        # pinned staging buffers, shared by every iteration; bounded (see _staging)
        self._pools: StagingPools | None = None
        if self._backend is not None:
            self._pools = StagingPools(self._backend, per_key=depth + 2, max_keys=self.pool_shapes)
        self._launches = 0

    @staticmethod
    def _pick_device(device: str | torch.device | None) -> torch.device:
        if device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            warnings.warn(
                f"CudaPrefetcher: CUDA is not available, running on the CPU instead of {dev}",
                RuntimeWarning,
                stacklevel=3,
            )
            return torch.device("cpu")
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used for flip/erase seeds (and forward it to the loader if it has one)."""
        self.epoch = int(epoch)
        set_epoch = getattr(self.loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._backend is None:
            return self._iter_sync()
        return self._iter_streams()

    # --- shared pieces ---

    def _positions(self, item: Any, counter: int) -> tuple[int, int]:
        """(epoch, batch number) for the augmentation seed."""
        if follows_slot_protocol(item) and hasattr(item, "number"):
            return int(getattr(item, "epoch", self.epoch)), int(item.number)
        return self.epoch, counter

    def _flatten(self, item: Any) -> Tree:
        if self.flip_p > 0.0:  # a flip on the device would leave boxes, points, masks behind
            schema = getattr(item, "schema", None)
            moved = [
                n
                for n in getattr(item, "fields", None) or {}
                if schema is not None
                and n in schema
                and (schema[n].geometry is not None or schema[n].kind == "mask")
            ]
            if moved:
                raise ValueError(
                    f"flip_p flips the images on the device but not the fields {moved}; flip "
                    "in the loader's transforms instead (HorizontalFlip moves them too)"
                )
        return flatten(item, self.normalize_keys)

    def _convert(self, x: torch.Tensor, epoch: int, number: int) -> torch.Tensor:
        gen = None
        if self.flip_p > 0.0 or self.erase_p > 0.0:
            gen = batch_generator(self.seed, epoch, number, x.device)
        px_mean, px_std = self._stats[x.dtype.is_floating_point]
        return convert_px(
            x,
            px_mean,
            px_std,
            dtype=self.dtype,
            channels_last=self.channels_last,
            layout=self.layout,
            flip_p=self.flip_p,
            erase_p=self.erase_p,
            generator=gen,
        )

    # --- CPU: synchronous, same conversion ---

    def _iter_sync(self) -> Iterator[Any]:
        counter = 0
        for item in self.loader:
            tree = self._flatten(item)
            epoch, number = self._positions(item, counter)
            in_slot = follows_slot_protocol(item)
            out = []
            for leaf, is_target in zip(tree.leaves, tree.targets):
                t = _as_host_tensor(leaf)
                if t.device != self.device:
                    t = t.to(self.device)
                if is_target:
                    t = self._convert(t, epoch, number)
                elif isinstance(leaf, np.ndarray) or in_slot:
                    t = t.clone()  # never hand out a view of memory the loader will reuse
                out.append(t)
            counter += 1
            yield tree.rebuild(out)
        self.epoch += 1

    # --- CUDA: side stream, events, pinned staging ---

    def _streams(self) -> Backend:
        """The backend of the stream path (which runs only when there is one)."""
        assert self._backend is not None
        return self._backend

    def _launch(self, item: Any, epoch: int, number: int, holding: deque[_Flight]) -> _Flight:
        """Queue the copy and the conversion of one batch; the flight joins ``holding`` as soon
        as its copy event is recorded. A launch that fails gives back what it took: its slot
        and buffers at once when nothing was queued, else once an event recorded after the
        failure has completed (on CUDA ``submit`` runs at once: an OOM or a bad mean/std
        raises here)."""
        be = self._streams()
        side, pools = self._side, self._pools
        assert pools is not None
        tree = self._flatten(item)
        pools.fit(len({(tuple(leaf.shape), str(leaf.dtype)) for leaf in tree.leaves}))
        be.wait_stream(side, be.current_stream())
        launch = self._launches
        self._launches += 1
        flight = _Flight(None, None, None)
        staged: list[Pinned] = []
        queued = False
        if follows_slot_protocol(item):
            item.retain()
            flight.holds.append(item.release)
        try:
            sources: list[torch.Tensor] = []
            for leaf in tree.leaves:
                t = _as_host_tensor(leaf)
                if be.is_on_device(t):
                    be.record_stream(t, side)  # read on the side stream by the conversion
                elif not be.is_pinned(t):  # a pinned one is referenced until its copy is done
                    p = pools.take(tuple(t.shape), t.dtype)
                    staged.append(p)
                    p.buf.copy_(t)
                    t = p.buf
                sources.append(t)
            tree.leaves = []  # drop the views of the loader's memory as soon as they are staged
            flight.holds.append(sources.clear)  # drop the references to pinned sources

            def copy_all() -> list[torch.Tensor]:
                return [s if be.is_on_device(s) else be.to_device(s) for s in sources]

            queued = True
            copied = be.submit(side, copy_all)
            flight.copy_event = be.record_event(side)
            pools.lend(staged, flight.copy_event, launch)
            holding.append(flight)  # from now on _reap or the shutdown releases it
        except BaseException:
            self._abandon(flight, staged, queued, launch, holding)
            raise
        targets = tree.targets

        def convert_all() -> list[torch.Tensor]:
            devs = copied.result()
            return [
                self._convert(d, epoch, number) if is_t else d for d, is_t in zip(devs, targets)
            ]

        flight.output = (tree, be.submit(side, convert_all))
        flight.ready_event = be.record_event(side)
        return flight

    def _abandon(
        self, flight: _Flight, staged: list[Pinned], queued: bool, launch: int, holding: deque
    ) -> None:
        """Undo a launch that failed before its copy event was recorded."""
        pools = self._pools
        assert pools is not None
        if not queued:
            pools.give_back(staged)
            flight.release()
            return
        try:  # a copy may be queued: what it reads stays held until it has run
            flight.copy_event = self._streams().record_event(self._side)
        except BaseException:  # no event to wait for (a failing device): never reuse them
            pools.drop(staged)
            flight.release()
            return
        pools.lend(staged, flight.copy_event, launch)
        holding.append(flight)

    def _iter_streams(self) -> Iterator[Any]:
        run = _StreamRun(self, iter(self.loader))  # this iteration's own state
        be = run.be
        try:
            run.fill()
            while run.ahead:
                flight = run.ahead.popleft()
                run.fill()  # the next copies are queued before this batch is handed over
                consumer = be.current_stream()
                be.wait_event(consumer, flight.ready_event)
                tree, output = flight.output
                leaves = output.result()
                for t in leaves:
                    be.record_stream(t, consumer)
                flight.output = None
                run.reap()
                yield tree.rebuild(leaves)
            self.epoch += 1
        finally:
            run.shutdown()


class _StreamRun:
    """The state of one iteration of the stream path: its loader iterator, the flights
    launched ahead of the consumer and those still holding host memory. Pools and the side
    stream belong to the prefetcher; nothing here is seen by another iteration."""

    def __init__(self, pf: CudaPrefetcher, it: Iterator[Any]) -> None:
        self.pf = pf
        self.be = pf._streams()
        self.it = it
        self.ahead: deque[_Flight] = deque()  # launched, not yet handed over
        self.holding: deque[_Flight] = deque()  # launched, still holding host memory
        self.counter = 0
        self.exhausted = False

    def fill(self) -> None:
        pf = self.pf
        while not self.exhausted and len(self.ahead) < pf.depth:
            self.reap(max_holding=pf.depth)
            try:
                item = next(self.it)
            except StopIteration:
                self.exhausted = True
                return
            epoch, number = pf._positions(item, self.counter)
            self.counter += 1
            self.ahead.append(pf._launch(item, epoch, number, self.holding))

    def reap(self, max_holding: int | None = None) -> None:
        """Release the host memory of batches whose copy finished (oldest first)."""
        be = self.be
        while self.holding:
            f = self.holding[0]
            if max_holding is not None and len(self.holding) > max_holding:
                be.event_wait(f.copy_event)
            elif not be.event_done(f.copy_event):
                return
            self.holding.popleft()
            f.release()

    def shutdown(self) -> None:
        """Wait for every held copy and release its memory, then close the loader's iterator;
        every slot is released even when a wait fails (a sticky CUDA error), and the first
        error is raised after all of it."""
        errors: list[BaseException] = []
        for f in self.ahead:
            f.output = None
        while self.holding:
            f = self.holding.popleft()
            try:
                self.be.event_wait(f.copy_event)
            except BaseException as e:
                errors.append(e)
            try:
                f.release()
            except BaseException as e:
                errors.append(e)
        close = getattr(self.it, "close", None)
        if callable(close):
            try:
                close()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]
