"""What a loader yields: one batch, as views of a shared-memory slot (or of its own arrays).

The slot is lent to the batch as a :class:`SlotLease`: the loader hands in the function that
frees its slots, so a batch gives its slot back without knowing the loader that made it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stoker._core.schema import Schema
    from stoker.loader._fields import FieldViews

__all__ = ["Batch", "SlotLease", "make_batch"]


class SlotLease:
    """A ring slot lent to a batch: ``slot`` is ``(ring id, slot number)`` and ``free`` the
    lender's function that takes it back (a slot of a ring rebuilt since is left alone there).
    :meth:`release` calls it once; later calls do nothing."""

    __slots__ = ("_free", "slot")

    def __init__(self, free: Callable[[tuple[int, int]], None], slot: tuple[int, int]) -> None:
        self._free: Callable[[tuple[int, int]], None] | None = free
        self.slot = slot

    def release(self) -> None:
        free, self._free = self._free, None
        if free is not None:
            free(self.slot)


class Batch:
    """One batch: ``images`` (a view of a shared-memory slot), ``labels``, ``keys``
    (record keys), ``indices`` (global positions), ``epoch``, ``number``.

    Unpacks as ``images, labels``. The views are valid until the next batch is requested,
    unless ``retain()`` was called; then until ``release()``.

    A batch of a set with fields (``docs/contracts.md``) also has ``schema`` (the
    :class:`~stoker._core.schema.Schema` of what it carries), ``fields`` (name -> the raw
    column: ``(rows, *shape)`` for numeric, ``(rows, max_len, *shape)`` padded rows for ragged,
    ``(rows, max_len)`` uint8 for text and bytes, ``(rows, H, W)`` for masks, ``(rows, 2)`` int32
    for ``size``) and ``lengths`` (name -> int32 ``(rows,)`` for ragged, text and bytes).
    ``batch[name]`` gives a field as a user wants it: numeric, mask and size columns as arrays,
    ragged fields as a list of ``(n_i, *shape)`` arrays, text as a list of str, bytes as a
    list of bytes; the schema's image and label names give ``images`` and ``labels``.
    ``batch.padded(name)`` gives ``(values, lengths)`` of a variable field.

    A batch of a mixture of sets (``Loader([A, B], weights=...)``) has ``source``: int64
    ``(rows,)``, each row's set; its ``indices`` are draw ids (``docs/mixing.md``). ``None``
    for a batch of one set.
    """

    __slots__ = (
        "epoch",
        "images",
        "indices",
        "keys",
        "labels",
        "number",
        "fields",
        "lengths",
        "schema",
        "source",
        "_lease",
        "_retained",
        "__weakref__",
    )

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        keys: np.ndarray,
        indices: np.ndarray,
        epoch: int,
        number: int,
        lease: SlotLease | None = None,  # the ring slot the views are in
        *,
        schema: Schema | None = None,
        fields: dict[str, np.ndarray] | None = None,
        lengths: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.keys = keys
        self.indices = indices
        self.epoch = epoch
        self.number = number
        self._lease = lease
        self._retained = False
        self.schema = schema
        self.fields = fields if fields is not None else {}
        self.lengths = lengths if lengths is not None else {}
        self.source: np.ndarray | None = None  # a mixture's: each row's set

    def __getitem__(self, name: str) -> Any:
        schema = self.schema
        image, label = (schema.image_name, schema.header_name) if schema else ("images", "labels")
        if name == image:
            return self.images
        if name == label:
            return self.labels
        if name not in self.fields:
            have = list(schema) if schema is not None else ["images", "labels"]
            raise KeyError(f"this batch has no field {name!r}; it has {have}")
        col = self.fields[name]
        kind = schema[name].kind if schema is not None and name in schema else "numeric"
        if kind in ("ragged", "text", "bytes"):
            n = self.lengths[name].tolist()
            if kind == "ragged":
                return [col[r, :k] for r, k in enumerate(n)]
            if kind == "text":
                return [col[r, :k].tobytes().decode("utf-8") for r, k in enumerate(n)]
            return [col[r, :k].tobytes() for r, k in enumerate(n)]
        return col

    def __contains__(self, name: object) -> bool:
        schema = self.schema
        image, label = (schema.image_name, schema.header_name) if schema else ("images", "labels")
        return name in (image, label) or name in self.fields

    def padded(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(values, lengths)`` of a ragged, text or bytes field: the padded column (zeros
        past each row's length) and int32 ``(rows,)`` lengths."""
        if name not in self.lengths:
            raise KeyError(f"{name!r} is not a variable-length field of this batch")
        return self.fields[name], self.lengths[name]

    def __iter__(self):
        yield self.images
        yield self.labels

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        return (
            f"Batch(epoch={self.epoch}, number={self.number}, images={self.images.shape} "
            f"{self.images.dtype}, labels={self.labels.shape} {self.labels.dtype})"
        )

    def retain(self) -> Batch:
        """Keep this batch's slot out of the ring until ``release()``."""
        self._retained = True
        return self

    def release(self) -> None:
        """Give the slot back to the ring (idempotent)."""
        lease, self._lease = self._lease, None
        self._retained = False
        if lease is not None:
            lease.release()


def make_batch(
    views: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    fields: FieldViews | None,
    epoch: int,
    number: int,
    *,
    lease: SlotLease | None = None,
) -> Batch:
    """A :class:`Batch` of ``views`` and, when the batch carries them, its field columns."""
    if fields is None:
        return Batch(*views, epoch=epoch, number=number, lease=lease)
    return Batch(
        *views,
        epoch=epoch,
        number=number,
        lease=lease,
        schema=fields.plan.schema,
        fields=fields.columns,
        lengths=fields.lengths,
    )
