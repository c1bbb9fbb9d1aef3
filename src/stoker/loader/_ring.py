"""Byte layout of the batch ring (one shared-memory segment); see the NOTE in ``_feed.py``.

::

    offset 0            control block (C = control_bytes, a multiple of 64): int64 generation
                        (the live iteration), then one int64 per worker: the global index
                        it is processing (-1: none), so a death names the sample that caused it
    offset C + s*S      slot s (S = slot_bytes, a multiple of 64), for s in range(slots):
        +0              images   rows x row_bytes(max frame)   (dtype, layout of the pipeline)
        +img_bytes      labels   rows x label item             (label dtype)
        +...            keys     rows x int64
        +...            indices  rows x int64                  (global positions)
        +...            then, only when the batches carry fields, for each carried field in
                        schema order (``_fields.py``):
                        values   rows x item(max frame)        (the field's dtype)
                        lengths  rows x int32                  (ragged, text, bytes only)

Every region starts on a 64-byte boundary. An item is ``shape`` (numeric; ``size``: 2 int32),
``max_len x shape`` (ragged), ``max_len`` bytes (text, bytes) or ``H x W`` (mask, at the
batch's sample size). The largest frame is the pipeline's own size, or the widest (and, with
aspect-ratio buckets, tallest) batch of the epoch. A batch of frame ``f`` and ``n`` rows views
the first ``n * row_bytes(f)`` bytes of the images region as a C-contiguous
``(n, *row_shape(f))`` array, and a mask column likewise as ``(n, H_f, W_f)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stoker.loader._fields import FieldPlan, FieldViews
from stoker.pipeline import Pipeline

__all__ = ["RingLayout"]


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class RingLayout:
    pipeline: Pipeline
    rows: int
    max_width: int | None  # None: the pipeline's own fixed width
    label_shape: tuple[int, ...]
    label_dtype: str
    slots: int
    workers: int = 0
    max_height: int | None = None  # None: the pipeline's own fixed height
    fields: FieldPlan | None = None

    @property
    def control_bytes(self) -> int:
        return _align(8 * (1 + self.workers))

    def row_shape(self, width: int | None, height: int | None = None) -> tuple[int, ...]:
        return self.pipeline.row_shape(width, height)

    def row_bytes(self, width: int | None, height: int | None = None) -> int:
        got = self._row_bytes.get((width, height))
        if got is None:
            shape = self.row_shape(width, height)
            got = int(np.prod(shape)) * np.dtype(self.pipeline.dtype).itemsize
            self._row_bytes[(width, height)] = got
        return got

    @cached_property
    def _row_bytes(self) -> dict[tuple[int | None, int | None], int]:
        # per frame: views() runs for every batch in main and every chunk in a worker
        return {}

    @cached_property
    def label_item_bytes(self) -> int:
        return int(np.prod(self.label_shape, dtype=np.int64)) * np.dtype(self.label_dtype).itemsize

    @cached_property
    def image_bytes(self) -> int:
        return _align(self.rows * self.row_bytes(self.max_width, self.max_height))

    @cached_property
    def max_frame(self) -> tuple[int, int]:
        return self.pipeline.frame(self.max_width, self.max_height)

    @cached_property
    def field_bytes(self) -> int:
        f = self.fields
        return 0 if f is None else f.slot_bytes(self.rows, self.max_frame)

    @cached_property
    def label_bytes(self) -> int:
        return _align(self.rows * self.label_item_bytes)

    @cached_property
    def slot_bytes(self) -> int:
        return self.image_bytes + self.label_bytes + 2 * _align(self.rows * 8) + self.field_bytes

    @property
    def total_bytes(self) -> int:
        return self.control_bytes + self.slots * self.slot_bytes

    def slot_offset(self, slot: int) -> int:
        """Byte offset of slot ``slot`` in the segment."""
        return self.control_bytes + slot * self.slot_bytes

    def control(self, mem: np.ndarray) -> np.ndarray:
        """int64 ``[generation, in-progress index of worker 0, of worker 1, ...]``."""
        return mem[: 8 * (1 + self.workers)].view(np.int64)

    def views(
        self, mem: np.ndarray, slot: int, width: int | None, rows: int, height: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(images, labels, keys, indices) of ``slot`` for ``rows`` rows at ``width``
        (and ``height``)."""
        base = self.slot_offset(slot)
        rb = self.row_bytes(width, height)
        images = mem[base : base + rows * rb].view(self.pipeline.dtype)
        images = images.reshape((rows, *self.row_shape(width, height)))
        lb = base + self.image_bytes
        labels = mem[lb : lb + rows * self.label_item_bytes].view(self.label_dtype)
        labels = labels.reshape((rows, *self.label_shape))
        kb = lb + self.label_bytes
        keys = mem[kb : kb + rows * 8].view(np.int64)
        ib = kb + _align(self.rows * 8)
        indices = mem[ib : ib + rows * 8].view(np.int64)
        return images, labels, keys, indices

    def field_views(
        self, mem: np.ndarray, slot: int, width: int | None, rows: int, height: int | None = None
    ) -> FieldViews | None:
        """The field columns of ``slot`` for ``rows`` rows at ``width`` and ``height``; ``None``
        when the batches carry no fields."""
        if self.fields is None:
            return None
        base = self.slot_offset(slot) + self.slot_bytes - self.field_bytes
        frame = self.pipeline.frame(width, height)
        return self.fields.views(mem, base, self.rows, frame, rows, self.max_frame)
