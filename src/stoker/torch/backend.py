"""The device side of ``CudaPrefetcher``: the seam between its stream protocol and CUDA.

:class:`Backend` lists every stream, event and memory operation the prefetcher asks for;
:class:`CudaBackend` does them with the CUDA streams, events and pinned memory of one device.
``CudaPrefetcher(loader, backend=...)`` takes any object with these methods, so the protocol
can be checked with the fakes of ``tests/torch/torch_doubles.py`` (test code) on a machine
without CUDA, or with a CUDA backend whose copies are slowed down on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

__all__ = ["Backend", "CudaBackend", "Done", "Handle"]


class Handle(Protocol):
    """Work submitted to a stream; ``result()`` gives its value once the stream has run it."""

    def result(self) -> Any: ...


class Backend(Protocol):
    """What ``CudaPrefetcher`` needs from a device: streams, events, pinned host memory.

    Streams and events are opaque to the prefetcher; it only passes them back to the backend.
    """

    device: torch.device

    def new_stream(self) -> Any:
        """A new side stream (the prefetcher makes one for its whole life)."""

    def current_stream(self) -> Any:
        """The stream current now: the consumer's."""

    def wait_stream(self, waiter: Any, waitee: Any) -> None:
        """Make ``waiter`` wait for the work queued on ``waitee`` so far."""

    def record_event(self, stream: Any) -> Any:
        """An event that completes when the work queued on ``stream`` so far has run."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event`` (the host does not block)."""

    def event_done(self, event: Any) -> bool:
        """Whether ``event`` has completed (no wait)."""

    def event_wait(self, event: Any) -> None:
        """Block the host until ``event`` has completed."""

    def submit(self, stream: Any, fn: Callable[[], Any]) -> Handle:
        """Queue ``fn`` on ``stream``."""

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new page-locked host tensor (a staging buffer)."""

    def is_pinned(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is page-locked host memory (copied directly, without staging)."""

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A copy of ``host`` on the device, queued on the current stream."""

    def is_on_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is on the device already (not copied)."""

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """Mark device tensor ``t`` as in use by ``stream`` for the caching allocator."""


class Done:
    """A result that is available at once (the real CUDA backend: work is queued async)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class CudaBackend:
    """Streams, events and pinned memory of one CUDA device."""

    def __init__(self, device: torch.device) -> None:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def wait_stream(self, waiter: Any, waitee: Any) -> None:
        waiter.wait_stream(waitee)

    def record_event(self, stream: Any) -> Any:
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def event_done(self, event: Any) -> bool:
        return bool(event.query())

    def event_wait(self, event: Any) -> None:
        event.synchronize()

    def submit(self, stream: Any, fn: Callable[[], Any]) -> Done:
        with torch.cuda.stream(stream):
            return Done(fn())

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(t.is_pinned())

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def is_on_device(self, t: torch.Tensor) -> bool:
        return t.device == self.device

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)
