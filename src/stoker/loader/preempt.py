"""SIGTERM as a clean stop: what a preempted job (a spot instance, a cluster scheduler) needs.

By default SIGTERM ends Python at once: no ``finally``, no ``with`` exit, no atexit hook. Loader
workers still die with the main process, but its shared-memory segment stays in ``/dev/shm``
until a sweep, and the training loop never gets to save where it was.

:func:`on_sigterm` makes SIGTERM behave like Ctrl-C does for a loader: it first calls the
hook (save ``loader.state_dict()`` and a checkpoint there), then raises :class:`Preempted` in
the main thread, so ``with`` blocks and generators unwind, the loader stops its workers and
unlinks its segment, and the process exits with status 143 (128 + SIGTERM) unless the program
catches it. Opt-in: a library does not take a signal behind the program's back.

    with stoker.Loader("train.rec", batch_size=256, workers=8) as loader:
        stoker.on_sigterm(lambda: save(loader.state_dict(), model))
        for images, labels in loader:
            ...
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Preempted", "on_sigterm"]


class Preempted(SystemExit):
    """Raised in the main thread when SIGTERM arrives under :func:`on_sigterm`. A
    ``SystemExit`` with code 143, so an uncaught one ends the program with the status a
    process killed by SIGTERM reports."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


def on_sigterm(
    hook: Callable[[], Any] | None = None, *, signals: tuple[int, ...] = (signal.SIGTERM,)
) -> Callable[[], None]:
    """Install the handler for ``signals`` (SIGTERM by default); returns a function that puts
    the previous handlers back.

    On the signal: ``hook()`` runs first (in the main thread, between two Python statements
    of the loop; an exception from it is chained to the ``Preempted`` raised after it), then
    :class:`Preempted` is raised. A second signal while the hook runs is ignored, so a
    scheduler that repeats its SIGTERM does not cut the save short.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("on_sigterm must be called from the main thread (signal handlers)")
    if hook is not None and not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    busy = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal busy
        if busy:
            return
        busy = True
        try:
            if hook is not None:
                try:
                    hook()
                except BaseException as e:
                    raise Preempted(signum) from e
            raise Preempted(signum)
        finally:
            busy = False

    previous = {s: signal.signal(s, handler) for s in signals}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
