"""Loader doubles whose batches carry fields (re-exported by ``torch_doubles``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker._core.schema import Field, Schema
from stoker.loader import Batch
from stoker.loader.batch import SlotLease

__all__ = ["FIELD_SCHEMA", "FieldRing", "field_batch"]

SCRIBBLE = 0xEE  # what a freed slot's arrays are overwritten with, byte by byte


def _images(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


#: The fields of :func:`field_batch`: a detection-style sample with a caption and its size.
FIELD_SCHEMA = Schema(
    {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
        "boxes": Field.boxes(max_len=5),
        "classes": Field.ragged((), "int64", follows="boxes", max_len=5),
        "caption": Field.text(max_len=24),
        "scores": Field.numeric((3,), "float32"),
        "size": Field.size(),
    }
)


def field_batch(rows: int, seed: int = 0, hw: tuple[int, int] = (16, 20)) -> Batch:
    """A stoker ``Batch`` of :data:`FIELD_SCHEMA` laid out as the loader lays one out (padded
    columns, int32 lengths), its content a function of ``seed``; some rows have no boxes."""
    rng = np.random.default_rng(seed)
    h, w = hw
    n = rng.integers(0, 6, size=rows).astype(np.int32)
    n[0] = 0 if rows > 1 else n[0]
    boxes = np.zeros((rows, 5, 4), np.float32)
    classes = np.zeros((rows, 5), np.int64)
    for r, k in enumerate(n):
        xy = rng.uniform(0, min(h, w) / 2, size=(k, 2))
        boxes[r, :k] = np.concatenate([xy, xy + rng.uniform(1, min(h, w) / 2, size=(k, 2))], 1)
        classes[r, :k] = rng.integers(1, 9, size=k)
    words = ["a cat", "two dogs", "ein Bär", "日本", ""]
    texts = [words[(seed + r) % len(words)] for r in range(rows)]
    caption = np.zeros((rows, 24), np.uint8)
    for r, t in enumerate(texts):
        b = t.encode("utf-8")
        caption[r, : len(b)] = np.frombuffer(b, np.uint8)
    fields: dict[str, np.ndarray] = {
        "boxes": boxes,
        "classes": classes,
        "caption": caption,
        "scores": rng.random((rows, 3), dtype=np.float32),
        "size": np.tile(np.array([[h * 2, w * 2]], np.int32), (rows, 1)),
    }
    lengths = {
        "boxes": n,
        "classes": n.copy(),
        "caption": np.array([len(t.encode("utf-8")) for t in texts], np.int32),
    }
    return Batch(
        _images((rows, h, w, 3), seed),
        rng.integers(0, 5, size=rows).astype(np.int64),
        np.arange(rows, dtype=np.int64) + 100 * seed,
        np.arange(rows, dtype=np.int64),
        0,
        seed,
        schema=FIELD_SCHEMA,
        fields=fields,
        lengths=lengths,
    )


class FieldRing:
    """A loader double with stoker's slot protocol whose batches carry fields.

    Batch ``i`` is a stoker ``Batch`` holding a copy of ``batches[i]`` (images, labels, every
    field column and length) in one of ``slots`` slots. As with :class:`SlotRing`, a slot is
    freed when the next batch is requested unless the batch was retained, or on ``release()``,
    and every array in it is scribbled over at once, so a copy that reads a field late gets
    garbage. ``freed`` counts the slots freed.
    """

    def __init__(self, batches: Sequence[Batch], *, slots: int = 3) -> None:
        self.batches = list(batches)
        self.free = list(range(slots))
        self.live: dict[int, list[np.ndarray]] = {}
        self.freed = 0
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches)

    def _free_slot(self, slot: tuple[int, int]) -> None:
        for a in self.live.pop(slot[1]):
            a.view(np.uint8).fill(SCRIBBLE)
        self.free.append(slot[1])
        self.freed += 1

    def _fill(self, slot: int, src: Batch, number: int) -> Batch:
        arrays: list[np.ndarray] = []

        def own(a: np.ndarray) -> np.ndarray:
            arrays.append(np.array(a, copy=True))
            return arrays[-1]

        fields = {k: own(v) for k, v in src.fields.items()}
        lengths = {k: own(v) for k, v in src.lengths.items()}
        images, labels = own(src.images), own(src.labels)
        self.live[slot] = arrays
        return Batch(
            images,
            labels,
            src.keys.copy(),
            src.indices.copy(),
            self.epoch,
            number,
            SlotLease(self._free_slot, (0, slot)),
            schema=src.schema,
            fields=fields,
            lengths=lengths,
        )

    def __iter__(self) -> Any:
        prev: Batch | None = None
        try:
            for i, src in enumerate(self.batches):
                if prev is not None and not prev._retained:
                    prev.release()
                if not self.free:
                    raise RuntimeError("no free batch slot: every slot is retained")
                prev = self._fill(self.free.pop(0), src, i)
                yield prev
            self.epoch += 1
        finally:  # as the loader does when its iteration ends or is closed
            if prev is not None and not prev._retained:
                prev.release()
