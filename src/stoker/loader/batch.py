"""What a loader yields: one batch, as views of a shared-memory slot (or of its own arrays)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from stoker.loader._feed import RingFeed

__all__ = ["Batch"]


class Batch:
    """One batch: ``images`` (a view of a shared-memory slot), ``labels``, ``keys``
    (record keys), ``indices`` (global positions), ``epoch``, ``number``.

    Unpacks as ``images, labels``. The views are valid until the next batch is requested,
    unless ``retain()`` was called; then until ``release()``.
    """

    __slots__ = (
        "epoch",
        "images",
        "indices",
        "keys",
        "labels",
        "number",
        "_owner",
        "_slot",
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
        owner: RingFeed | None = None,  # the loader whose ring slot the views are
        slot: tuple[int, int] | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.keys = keys
        self.indices = indices
        self.epoch = epoch
        self.number = number
        self._owner = owner
        self._slot = slot  # (ring id, slot): a slot of a ring since rebuilt is not freed
        self._retained = False

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
        owner, slot = self._owner, self._slot
        self._owner = self._slot = None
        self._retained = False
        if owner is not None and slot is not None:
            owner._free_slot(slot)
