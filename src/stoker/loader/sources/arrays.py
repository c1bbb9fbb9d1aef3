"""In-memory arrays as a :class:`~stoker.formats.Reader` of decoded images, copied once into
shared memory for the workers."""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.loader._named import NamedRing
from stoker.loader._shm import SHM_DIR, Segment, create_segment, preflight
from stoker.loader.sources.base import PositionKeyed, sha

__all__ = ["ArraySource"]


_ARRAY_DTYPES = ("uint8", "float16", "float32")


def _release(segment: Segment | NamedRing | None, pid: int) -> None:
    if segment is not None and os.getpid() == pid:  # not from a forked child
        segment.unlink()


class ArraySource(PositionKeyed):
    """In-memory images ``x`` (N, H, W) or (N, H, W, C) of uint8/float16/float32 and labels
    ``y`` (N, ...): nothing to decode.

    ``share()`` copies both once into a shared-memory segment (the loader calls it when it
    starts workers); workers then map it read-only and only the segment's name is pickled.
    The segment is a file in ``/dev/shm`` where that and ``posix_fallocate`` exist (Linux),
    else a ``multiprocessing.shared_memory`` segment (``_named``; macOS, Windows). It is
    removed by ``close()`` or when the source is garbage-collected.
    """

    _unit = "arrays"

    encoded = False

    def __init__(self, x: Any, y: Any = None) -> None:
        x = np.asarray(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"x must have shape (N, H, W) or (N, H, W, C), got {x.shape}")
        if x.dtype.name not in _ARRAY_DTYPES:
            raise TypeError(f"x must be one of {', '.join(_ARRAY_DTYPES)}, got {x.dtype}")
        if y is None:
            y = np.zeros(len(x), dtype=np.int64)
        y = np.asarray(y)
        if y.ndim == 0 or len(y) != len(x):
            raise ValueError(
                f"y must have one entry per image: x has {len(x)}, y has shape {y.shape}"
            )
        if y.dtype.kind not in "biuf":
            raise TypeError(f"y must be numeric, got {y.dtype}")
        self._x: np.ndarray = x
        self._y: np.ndarray = y
        self._x_shape = tuple(x.shape)
        self._x_dtype = x.dtype.name
        self._y_shape = tuple(y.shape)
        self._y_dtype = y.dtype.name
        self.segment: Segment | NamedRing | None = None
        self._finalizer: Any = None
        self._mapping: Any = None
        self._fp: dict | None = None

    @property
    def shared(self) -> bool:
        return self.segment is not None

    def _y_offset(self) -> int:
        return (self._x.nbytes + 63) // 64 * 64

    def share(self) -> None:
        """Copy ``x`` and ``y`` into a shared-memory segment (once; later calls do nothing)."""
        if self.segment is not None:
            return
        size = self._y_offset() + self._y.nbytes
        seg: Segment | NamedRing
        mapping: Any
        if hasattr(os, "posix_fallocate") and os.path.isdir(SHM_DIR):
            preflight(size, slots=1, what="array copies")
            seg, mapping = create_segment(size)
        else:
            seg, mapping = NamedRing.create(max(size, 1))
        self._finalizer = weakref.finalize(self, _release, seg, os.getpid())
        mem = mapping.array()
        xs = mem[: self._x.nbytes].view(self._x_dtype).reshape(self._x_shape)
        np.copyto(xs, self._x)
        ys = mem[self._y_offset() : self._y_offset() + self._y.nbytes].view(self._y_dtype)
        ys = ys.reshape(self._y_shape)
        np.copyto(ys, self._y)
        self.segment = seg
        self._mapping = mapping
        self._x, self._y = xs, ys

    def __getstate__(self) -> dict:
        if self.segment is None:
            raise TypeError(
                "an ArraySource crosses to worker processes only after share() placed it in "
                "shared memory"
            )
        return {
            "segment": self.segment,
            "x": (self._x_shape, self._x_dtype),
            "y": (self._y_shape, self._y_dtype),
            "fp": self.fingerprint(),
        }

    def __setstate__(self, state: dict) -> None:
        self.segment = state["segment"]
        self._x_shape, self._x_dtype = state["x"]
        self._y_shape, self._y_dtype = state["y"]
        self._fp = state["fp"]
        self._finalizer = None  # the worker does not own the segment
        mapping = self.segment.attach(writable=False)
        mem = mapping.array()
        nx = int(np.prod(self._x_shape)) * np.dtype(self._x_dtype).itemsize
        self._x = mem[:nx].view(self._x_dtype).reshape(self._x_shape)
        yo = (nx + 63) // 64 * 64
        ny = int(np.prod(self._y_shape)) * np.dtype(self._y_dtype).itemsize
        self._y = mem[yo : yo + ny].view(self._y_dtype).reshape(self._y_shape)
        self._mapping = mapping

    def __len__(self) -> int:
        return self._x_shape[0]

    def labels(self) -> np.ndarray:
        return self._y

    @property
    def sample_spec(self) -> ArraySpec:
        return ArraySpec(self._x_shape[1:], self._x_dtype)

    def read(self, i: int) -> tuple[Any, Any]:
        return self._x[i], self._y[i]

    def describe(self, i: int) -> str:
        return f"key {i} (row {i} of the arrays)"

    def fingerprint(self) -> dict:
        if self._fp is None:
            x = self._x
            ends = (
                b"".join(np.ascontiguousarray(x[j]).tobytes() for j in (0, -1)) if len(x) else b""
            )
            self._fp = {
                "type": "arrays",
                "len": len(x),
                "shape": list(self._x_shape),
                "dtype": self._x_dtype,
                "sha": sha(ends, np.ascontiguousarray(self._y).tobytes()),
            }
        return self._fp

    def close(self) -> None:
        """Remove the shared copy (only in the process that made it, never in a fork)."""
        info = self._finalizer.peek() if self._finalizer is not None else None
        if info is not None and info[2][1] == os.getpid():
            self._finalizer()
            self._finalizer = None
