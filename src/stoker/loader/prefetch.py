"""A background-thread prefetcher for any iterable: ``stoker.prefetch(iterable, depth=2)``.

NOTE [ Thread prefetch protocol ]

Buffers: one bounded ``queue.Queue(maxsize=depth)`` between one producer thread and the
consumer. Each entry is ``(kind, payload)``: an item, the end of the iterable, or a failure
carrying the exception raised by the iterable (with its traceback).

Ownership:
- The producer thread owns the source iterator: only it calls ``next()`` and ``close()`` on it
  (a generator may not be closed from another thread while it runs).
- The thread holds no reference to the ``Prefetcher`` object, so the consumer dropping the
  prefetcher (``break`` out of a ``for`` loop, ``del``, a generator that wraps it being closed)
  lets it be garbage-collected, and its finaliser stops the thread.
- Items that follow the slot protocol of stoker batches (callable ``retain`` and ``release``)
  are retained by the producer before they enter the queue, because the producer asks the
  source for the next item long before the consumer is done with the current one. The
  consumer side releases an item when the consumer asks for the next one (the same "valid until
  the next batch" rule the loader has), and on ``close()``.

Shutdown order, on every path (end of data, ``break``/``close()``/GC, an exception in the
source, interpreter exit):
1. the consumer sets the stop event;
2. it drains the queue (releasing retained items), which unblocks a producer waiting on a full
   queue; the producer's ``put`` also uses a short timeout and re-checks the stop event;
3. the producer leaves its loop, closes the source iterator (in its own thread) and exits;
4. the consumer joins the thread (bounded by ``join_timeout``); a producer stuck inside a
   source that never returns is a daemon thread, so it cannot hold up interpreter exit.

Timeouts: the producer polls the stop event every ``_POLL`` seconds while the queue is full.
The consumer's ``get`` blocks as long as the source takes (no timeout of its own: put a
``timeout=`` on the source, as ``stoker.Loader`` has). At interpreter exit an ``atexit`` hook
sets the stop event of every live prefetcher, so no thread is left in a ``put``.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from stoker.loader.loader import Loader

__all__ = ["Prefetcher", "prefetch"]

T = TypeVar("T")

_POLL = 0.05  # seconds between stop-event checks while the queue is full
_ITEM, _END, _FAIL = 0, 1, 2

# Stop events of live prefetchers, set at interpreter exit. Only events are held, weakly.
_LIVE_STOPS: weakref.WeakSet[threading.Event] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for ev in list(_LIVE_STOPS):
        ev.set()


atexit.register(_stop_all_at_exit)


def _holds_slot(item: object) -> bool:
    return callable(getattr(item, "retain", None)) and callable(getattr(item, "release", None))


def _release(item: object) -> None:
    if _holds_slot(item):
        item.release()  # type: ignore[attr-defined]


def _produce(source: Iterable[Any], q: queue.Queue, stop: threading.Event) -> None:
    """The producer thread: pull from ``source`` until it ends, fails or ``stop`` is set."""
    it: Iterator[Any] | None = None
    try:
        it = iter(source)
        while not stop.is_set():
            try:
                item = next(it)
            except StopIteration:
                _put(q, stop, (_END, None))
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer as is
                _put(q, stop, (_FAIL, exc))
                return
            if _holds_slot(item):
                item.retain()
            if not _put(q, stop, (_ITEM, item)):
                _release(item)
                return
    except BaseException as exc:  # noqa: BLE001 - iter() itself failed
        _put(q, stop, (_FAIL, exc))
    finally:
        close = getattr(it, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - nobody is left to hear about it
                pass


def _put(q: queue.Queue, stop: threading.Event, entry: tuple[int, Any]) -> bool:
    """Put ``entry``, giving up when ``stop`` is set. True when it was put."""
    while not stop.is_set():
        try:
            q.put(entry, timeout=_POLL)
            return True
        except queue.Full:
            continue
    return False


def _shutdown(
    thread: threading.Thread,
    q: queue.Queue,
    stop: threading.Event,
    current: list[object],
    timeout: float,
) -> None:
    """Stop the producer, release what the consumer and the queue hold, join the thread."""
    stop.set()
    held, current[0] = current[0], None
    if held is not None:
        _release(held)
    _drain(q)
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)
    _drain(q)  # whatever it put between the first drain and its exit


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            kind, payload = q.get_nowait()
        except queue.Empty:
            return
        if kind == _ITEM:
            _release(payload)


class Prefetcher(Generic[T]):
    """Iterates ``source`` in a background thread, ``depth`` items ahead.

    Use it as an iterator (once), ideally as a context manager::

        with stoker.prefetch(loader, depth=2) as batches:
            for images, labels in batches:
                ...

    An exception raised by ``source`` is re-raised by ``next()`` with the source's traceback.
    Leaving the loop early, ``close()``, or dropping the object stops the thread.
    """

    def __init__(self, source: Iterable[T], *, depth: int = 2, join_timeout: float = 10.0):
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int >= 1, got {depth!r}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (items fetched ahead), got {depth}")
        if isinstance(source, Loader) and depth + 2 > source.slots:
            raise ValueError(
                f"prefetch depth {depth} needs more batch slots than the loader has (prefetch="
                f"{source.prefetch}: {source.slots} slots, {depth + 1} held here plus one being "
                f"filled); use depth <= {source.slots - 2} or a loader with prefetch >= {depth}"
            )
        if join_timeout <= 0:
            raise ValueError(f"join_timeout must be > 0 seconds, got {join_timeout}")
        self.depth = depth
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=(source, self._queue, self._stop),
            name="stoker-prefetch",
            daemon=True,
        )
        # The item last handed to the consumer, released on the next request or at shutdown
        # (a one-element list, so the finaliser sees it without referring to ``self``).
        self._current: list[object] = [None]
        self._done = False
        _LIVE_STOPS.add(self._stop)
        self._thread.start()
        # Runs on close(), on garbage collection, and never twice.
        self._finalizer = weakref.finalize(
            self, _shutdown, self._thread, self._queue, self._stop, self._current, join_timeout
        )
        # At interpreter exit only the stop event is set (``_stop_all_at_exit``); nobody waits
        # for a daemon thread that may be stuck inside the source.
        self._finalizer.atexit = False

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._current[0] is not None:
            current, self._current[0] = self._current[0], None
            _release(current)
        if self._done:
            raise StopIteration
        kind, payload = self._queue.get()
        if kind == _ITEM:
            self._current[0] = payload
            return payload
        self._done = True
        self.close()
        if kind == _FAIL:
            raise payload
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and release anything held. Safe to call more than once."""
        self._done = True
        self._finalizer()

    @property
    def alive(self) -> bool:
        """True while the producer thread runs."""
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch(iterable: Iterable[T], depth: int = 2) -> Prefetcher[T]:
    """Iterate ``iterable`` in a background thread, ``depth`` items ahead.

    The thread stops when the consumer stops (end of data, ``break``, ``close()``, garbage
    collection) and exceptions from ``iterable`` reach the consumer with their traceback.
    Stoker batches (anything with ``retain``/``release``) stay valid until the next item is
    requested, as they are when iterating the loader directly; that holds ``depth + 1`` of the
    loader's ``slots`` and one more is being filled, so ``depth`` may be at most
    ``loader.slots - 2`` (checked here).
    """
    return Prefetcher(iterable, depth=depth)
