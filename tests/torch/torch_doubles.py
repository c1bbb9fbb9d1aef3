"""Doubles for checking ``CudaPrefetcher``'s stream protocol, in the tests and on a GPU.

- :class:`SlotRing`: a loader double with stoker's slot protocol whose slots are scribbled
  over the moment they are free again, so any batch read too late comes out wrong;
- :class:`FakeBackend`: streams as queues of deferred work on the CPU, whose copies really run
  late, recording the calls the protocol promises (no CUDA needed); ``hold_events=True``: events
  complete only when the test says so or after ``lag`` polls, never on handover; ``pin``/
  ``on_device`` flag tensors for the pinned and on-device paths; ``fail`` injects errors;
- :class:`EagerBackend`: submissions run at once, as CUDA's do (an OOM raises from the launch),
  events held, and copies that check their host buffer was not touched before they ran;
- :class:`SlowCopyBackend`: the CUDA backend with every side-stream submission delayed (it and
  the fakes count the staging buffers still alive: ``live_pinned()``), which
  widens the race windows on a real GPU; :class:`BrokenBackend`: the same with the protocol
  deliberately broken, to show a check catches it (:class:`BrokenFakeBackend` on the CPU);
- :class:`FieldRing`: a loader double like :class:`SlotRing` whose batches are stoker
  ``Batch`` objects with fields (boxes, classes, text, ...), every column scribbled over when
  its slot is freed; :func:`field_batch`: such a batch, a function of a seed;
- :func:`random_images`, :data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`: test data.

Pass a backend as ``CudaPrefetcher(loader, backend=...)``.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from field_ring import FIELD_SCHEMA, FieldRing, field_batch

from stoker.torch.backend import CudaBackend, Done

__all__ = [
    "FIELD_SCHEMA",
    "IMAGENET_MEAN",
    "IMAGENET_MEAN_PX",
    "IMAGENET_STD",
    "IMAGENET_STD_PX",
    "BrokenBackend",
    "BrokenFakeBackend",
    "EagerBackend",
    "FakeBackend",
    "FakeEvent",
    "FakeHandle",
    "FakeStream",
    "FieldRing",
    "SlotBatch",
    "SlotRing",
    "SlowCopyBackend",
    "delay",
    "field_batch",
    "random_images",
]

# per-channel ImageNet statistics in 0-1 units, as CudaPrefetcher and Normalize take them,
# and in the 0-255 units of uint8 images (what the conversion subtracts and divides by)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET_MEAN_PX = tuple(v * 255 for v in IMAGENET_MEAN)
IMAGENET_STD_PX = tuple(v * 255 for v in IMAGENET_STD)

SCRIBBLE = 0xEE  # what a free slot's images are overwritten with (its labels: -1)


def random_images(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """uint8 noise of ``shape``, a function of ``seed``."""
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _track(backend: Any, t: torch.Tensor) -> torch.Tensor:
    refs = backend.__dict__.setdefault("_pinned_refs", [])
    refs.append(weakref.ref(t))
    return t


def _live(backend: Any) -> int:
    refs = backend.__dict__.get("_pinned_refs", [])
    refs[:] = [r for r in refs if r() is not None]
    return len(refs)


# --- a loader double ---


def _fill(buf: Any, value: int) -> None:
    if isinstance(buf, torch.Tensor):
        buf.fill_(value)
    else:
        buf.fill(value)


class SlotRing:
    """A loader double with stoker's slot protocol and a ring of ``slots`` batch buffers.

    Batch ``i`` of an epoch is numbered ``first_number + i``; its images are ``content(i)``
    copied into a free slot, its labels (all equal to its number) sit in the slot too. A slot
    is free again when the next batch is requested unless the batch was retained, or on
    ``release()``; it is scribbled over at once, as a worker refilling it would, so a copy that
    reads it late gets garbage. ``pinned=True`` makes the slots page-locked tensors (needs
    CUDA): a prefetcher copies from them directly, so it must hold each slot until its copy
    has completed; ``pin`` (e.g. ``FakeBackend.pin``) makes them tensors flagged page-locked
    by that function instead, for a fake backend. ``on_retain``/``on_release`` are called with
    each batch retained/released.
    """

    def __init__(
        self,
        n: int,
        shape: tuple[int, ...],
        content: Callable[[int], np.ndarray],
        *,
        slots: int = 3,
        pinned: bool = False,
        epoch: int = 0,
        first_number: int = 0,
        on_retain: Callable[[SlotBatch], None] | None = None,
        on_release: Callable[[SlotBatch], None] | None = None,
        pin: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        pinned = pinned or pin is not None
        self.n, self.shape, self.content, self.pinned = n, tuple(shape), content, pinned
        self.images: list[Any]
        self.labels: list[Any]
        if pinned:
            real = pin is None
            wrap = pin or (lambda t: t)
            self.images = [
                wrap(torch.empty(shape, dtype=torch.uint8, pin_memory=real)) for _ in range(slots)
            ]
            self.labels = [
                wrap(torch.empty(shape[0], dtype=torch.int64, pin_memory=real))
                for _ in range(slots)
            ]
        else:
            self.images = [np.empty(shape, np.uint8) for _ in range(slots)]
            self.labels = [np.empty(shape[0], np.int64) for _ in range(slots)]
        self.free = list(range(slots))
        self.epoch, self.first_number = epoch, first_number
        self.on_retain, self.on_release = on_retain, on_release

    @classmethod
    def over(cls, arrays: Sequence[np.ndarray], **kw: Any) -> SlotRing:
        """A ring whose batch ``i`` holds ``arrays[i]``."""
        return cls(len(arrays), arrays[0].shape, arrays.__getitem__, **kw)

    def __len__(self) -> int:
        return self.n

    def give_back(self, batch: SlotBatch) -> None:
        if self.on_release is not None:
            self.on_release(batch)
        _fill(self.images[batch.slot], SCRIBBLE)
        _fill(self.labels[batch.slot], -1)
        self.free.append(batch.slot)

    def _fill_slot(self, slot: int, i: int, number: int) -> None:
        content = self.content(i)
        if self.pinned:
            self.images[slot].copy_(torch.from_numpy(content))
        else:
            self.images[slot][...] = content
        _fill(self.labels[slot], number)

    def __iter__(self) -> Any:
        prev = None
        for i in range(self.n):
            if prev is not None and not prev.retained:
                prev.release()
            if not self.free:
                raise RuntimeError("no free batch slot: every slot is retained")
            slot = self.free.pop(0)
            number = self.first_number + i
            self._fill_slot(slot, i, number)
            prev = SlotBatch(self, slot, self.epoch, number)
            yield prev
        if prev is not None and not prev.retained:
            prev.release()
        self.epoch += 1


class SlotBatch:
    """One batch of a :class:`SlotRing`: views of its slot, and ``retain``/``release``."""

    def __init__(self, ring: SlotRing, slot: int, epoch: int, number: int) -> None:
        self.ring, self.slot, self.epoch, self.number = ring, slot, epoch, number
        self.images, self.labels = ring.images[slot], ring.labels[slot]
        rows = ring.shape[0]
        self.keys = np.arange(rows, dtype=np.int64) + 1000 * number
        self.indices = np.arange(rows, dtype=np.int64)
        self.retained = False
        self.live = True

    def retain(self) -> SlotBatch:
        if self.ring.on_retain is not None:
            self.ring.on_retain(self)
        self.retained = True
        return self

    def release(self) -> None:
        if self.live:
            self.live = False
            self.retained = False
            self.ring.give_back(self)


# --- CPU backends: copies that run late, events that complete late ---


class FakeStream:
    """A queue of deferred work (events, submitted functions, copies), run in order on demand."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: list[Any] = []

    def run_through(self, target: Any) -> None:
        """Run the queued work up to and including ``target`` (nothing if it has run)."""
        while not target.ran:
            op = self.queue.pop(0)
            op.run()


class FakeEvent:
    """An event: reached when its stream runs it; ``done`` once reached and, for a backend
    that holds events, once the test or enough polls complete it."""

    def __init__(self, stream: FakeStream, seq: int, held: bool = False) -> None:
        self.stream, self.seq, self.held = stream, seq, held
        self.ran = False
        self.done = False
        self.queries = 0

    def run(self) -> None:
        self.ran = True
        if not self.held:
            self.done = True


class FakeHandle:
    def __init__(self, stream: FakeStream, fn: Callable[[], Any]) -> None:
        self.stream, self.fn = stream, fn
        self.done = self.ran = False
        self.value: Any = None

    def run(self) -> None:
        self.value = self.fn()
        self.done = self.ran = True

    def result(self) -> Any:
        self.stream.run_through(self)  # the consumer's kernels wait on the ready event
        return self.value


class _CopyCheck:
    """A device copy as the stream runs it: it reads ``host`` then, which must still hold what
    was in it when the copy was queued (else the buffer was refilled or freed too early)."""

    def __init__(self, backend: FakeBackend, host: torch.Tensor) -> None:
        self.backend, self.host, self.snapshot = backend, host, host.clone()
        self.ran = False

    def run(self) -> None:
        self.ran = True
        if not torch.equal(self.host, self.snapshot):
            self.backend.violations.append(
                f"a host buffer {tuple(self.host.shape)} changed before its copy ran"
            )
        self.host = self.snapshot = None  # type: ignore[assignment]


class FakeBackend:
    """Streams as queues of deferred work: a "device copy" reads its host buffer only when the
    stream runs it. An event completes after it has been queried ``lag`` times, or on
    ``event_wait``. Records the calls the protocol promises: ``log`` (waits, records, submits
    in order), ``events``, ``recorded`` (record_stream calls as (id(tensor), stream name)),
    ``streams_made``, ``pinned`` (staging buffers made).

    ``hold_events=True``: an event the stream has run is still not done until it has been
    queried more than ``lag`` times, waited for, or completed by the test (``complete(ev)``,
    ``complete_all()``); handing a batch over does not complete it, as on a GPU where the
    consumer waits on the device. Completing an event completes the earlier ones of its stream.

    The pinned and on-device paths: ``pin(t)`` flags a CPU tensor as page-locked (staging
    buffers are flagged too) and ``on_device(t)`` as on the device (``to_device`` results are
    flagged too); ``is_pinned``/``is_on_device`` read the flags. ``fail(op, exc, at=1)`` makes
    the ``at``-th next call of ``op`` (``submit``, ``to_device``, ``record_event``,
    ``event_wait``) raise ``exc``.
    """

    device = torch.device("cpu")

    def __init__(self, lag: int = 2, *, hold_events: bool = False) -> None:
        self.lag = lag
        self.hold_events = hold_events
        self.consumer = FakeStream("consumer")
        self.streams_made = 0
        self.events: list[FakeEvent] = []
        self.log: list[tuple[Any, ...]] = []
        self.pinned = 0
        self.recorded: list[tuple[int, str]] = []
        self.violations: list[str] = []
        self._faults: dict[str, list[Any]] = {}

    # --- test controls ---

    def fail(self, op: str, exc: BaseException, at: int = 1) -> None:
        """Make the ``at``-th next call of ``op`` raise ``exc``."""
        self._faults[op] = [at, exc]

    def _maybe_fail(self, op: str) -> None:
        fault = self._faults.get(op)
        if fault is not None:
            fault[0] -= 1
            if fault[0] == 0:
                del self._faults[op]
                raise fault[1]

    def complete(self, ev: FakeEvent) -> None:
        """Run ``ev``'s stream through it and mark it (and the earlier events) done."""
        ev.stream.run_through(ev)
        for e in self.events:
            if e.stream is ev.stream and e.seq <= ev.seq:
                e.done = True

    def complete_all(self) -> None:
        for ev in list(self.events):
            self.complete(ev)

    @staticmethod
    def pin(t: torch.Tensor) -> torch.Tensor:
        t._fake_pinned = True  # type: ignore[attr-defined]
        return t

    @staticmethod
    def on_device(t: torch.Tensor) -> torch.Tensor:
        t._fake_on_device = True  # type: ignore[attr-defined]
        return t

    # --- the Backend protocol ---

    def new_stream(self) -> FakeStream:
        self.streams_made += 1
        return FakeStream(f"side{self.streams_made}")

    def current_stream(self) -> FakeStream:
        return self.consumer

    def wait_stream(self, waiter: FakeStream, waitee: FakeStream) -> None:
        self.log.append(("wait_stream", waiter.name, waitee.name))

    def record_event(self, stream: FakeStream) -> FakeEvent:
        self._maybe_fail("record_event")
        ev = FakeEvent(stream, len(self.events), held=self.hold_events)
        stream.queue.append(ev)
        self.events.append(ev)
        self.log.append(("record", stream.name, len(self.events) - 1))
        return ev

    def wait_event(self, stream: FakeStream, ev: FakeEvent) -> None:
        self.log.append(("wait_event", stream.name, self.events.index(ev)))

    def event_done(self, ev: FakeEvent) -> bool:
        ev.queries += 1
        if ev.queries > self.lag:
            self.complete(ev)
        return ev.done

    def event_wait(self, ev: FakeEvent) -> None:
        self._maybe_fail("event_wait")
        self.complete(ev)

    def submit(self, stream: FakeStream, fn: Callable[[], Any]) -> FakeHandle:
        self._maybe_fail("submit")
        h = FakeHandle(stream, fn)
        stream.queue.append(h)
        self.log.append(("submit", stream.name))
        return h

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.pinned += 1
        return _track(self, self.pin(torch.empty(shape, dtype=dtype)))

    def live_pinned(self) -> int:
        """Staging buffers made and not yet freed."""
        return _live(self)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(getattr(t, "_fake_pinned", False))

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        self._maybe_fail("to_device")
        return self.on_device(host.clone())  # runs when the stream gets to it: reads it *then*

    def is_on_device(self, t: torch.Tensor) -> bool:
        return bool(getattr(t, "_fake_on_device", False))

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.recorded.append((id(t), stream.name))


class BrokenFakeBackend(FakeBackend):
    """:class:`FakeBackend` with the protocol deliberately broken, like :class:`BrokenBackend`:
    events count as complete at once, so slots and staging buffers are recycled before the
    deferred copies read them (for a CPU control pass that must be caught)."""

    def event_done(self, ev: FakeEvent) -> bool:
        return True

    def event_wait(self, ev: FakeEvent) -> None:
        pass


class EagerBackend(FakeBackend):
    """CUDA's timing on the CPU: ``submit`` runs its function at once (so an error in a copy or
    a conversion raises from the prefetcher's launch, as a CUDA OOM does), while the work it
    queued completes late: events are held (see :class:`FakeBackend`, ``hold_events``), and a
    device copy takes its data at once but checks, when its stream runs past it (at the next
    completed event), that its host buffer still holds what it read; a buffer refilled or a
    pinned slot released too early is listed in ``violations``."""

    def __init__(self, lag: int = 2) -> None:
        super().__init__(lag, hold_events=True)
        self._running: FakeStream | None = None

    def submit(self, stream: FakeStream, fn: Callable[[], Any]) -> FakeHandle:
        self._maybe_fail("submit")
        self.log.append(("submit", stream.name))
        h = FakeHandle(stream, fn)
        self._running = stream
        try:
            h.run()
        finally:
            self._running = None
        return h

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        self._maybe_fail("to_device")
        stream = self._running or self.consumer
        stream.queue.append(_CopyCheck(self, host))
        return self.on_device(host.clone())


# --- CUDA backends for a GPU machine ---


def delay(cycles: int) -> None:
    """Keep the current CUDA stream busy for about ``cycles`` GPU clock cycles."""
    if cycles <= 0:
        return
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(cycles)
    else:  # pragma: no cover - a torch without _sleep: matrix products instead
        a = torch.empty(1024, 1024, device="cuda")
        for _ in range(max(1, cycles // 2_000_000)):
            a = a @ a


class SlowCopyBackend(CudaBackend):
    """The CUDA backend with every side-stream submission delayed by ``cycles`` (none for 0).

    Counts the side streams (``streams_made``) and the pinned staging buffers per (shape,
    dtype) (``pinned``) it makes.
    """

    def __init__(self, device: torch.device, cycles: int = 0) -> None:
        super().__init__(device)
        self.cycles = cycles
        self.streams_made = 0
        self.pinned: Counter[tuple[tuple[int, ...], torch.dtype]] = Counter()

    def new_stream(self) -> Any:
        self.streams_made += 1
        return super().new_stream()

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.pinned[(tuple(shape), dtype)] += 1
        return _track(self, super().pinned_empty(shape, dtype))

    def live_pinned(self) -> int:
        """Staging buffers made and not yet freed."""
        return _live(self)

    def submit(self, stream: Any, fn: Callable[[], Any]) -> Done:
        with torch.cuda.stream(stream):
            delay(self.cycles)
            return Done(fn())


class BrokenBackend(SlowCopyBackend):
    """A deliberately wrong protocol: events count as complete at once (slots and staging
    buffers recycled while the copy may still read them) and the consumer does not wait."""

    def event_done(self, event: Any) -> bool:
        return True

    def event_wait(self, event: Any) -> None:
        pass

    def wait_event(self, stream: Any, event: Any) -> None:
        pass

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        pass
