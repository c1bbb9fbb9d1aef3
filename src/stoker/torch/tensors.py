"""``as_tensors``: a loader's batches as torch tensors, without a copy."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from stoker.torch._batch import TensorBatch, flatten, follows_slot_protocol

__all__ = ["TensorBatch", "as_tensors", "tensor_batch"]


class _AsTensors:
    """Iterable view of ``loader`` whose arrays are tensors (see :func:`as_tensors`)."""

    def __init__(self, loader: Iterable[Any], *, pin_memory: bool) -> None:
        self.loader = loader
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for item in self.loader:
            yield _to_tensors(item, self.pin_memory)


def _to_tensors(item: Any, pin_memory: bool) -> Any:
    tree = flatten(item, ())
    leaves = []
    for leaf in tree.leaves:
        t = torch.from_numpy(leaf) if isinstance(leaf, np.ndarray) else leaf
        if pin_memory and t.device.type == "cpu" and not t.is_pinned():
            # torch's caching host allocator: a pinned block is reused only after the
            # non_blocking copies that read it have finished, so the slot can recycle.
            t = t.pin_memory()
        leaves.append(t)
    out = tree.rebuild(leaves)
    if isinstance(out, TensorBatch) and follows_slot_protocol(item):
        out = dataclasses.replace(out, source=item)
    return out


def tensor_batch(batch: Any) -> TensorBatch:
    """``batch`` as a :class:`TensorBatch`: itself if it is one, else a stoker ``Batch``'s
    arrays viewed as tensors without a copy (as :func:`as_tensors` does)."""
    if isinstance(batch, TensorBatch):
        return batch
    out = _to_tensors(batch, False)
    if not isinstance(out, TensorBatch):
        raise TypeError(f"expected a stoker Batch or a TensorBatch, got {type(batch).__name__}")
    return out


def as_tensors(loader: Iterable[Any], *, pin_memory: bool = False) -> _AsTensors:
    """Iterate ``loader`` with its NumPy arrays turned into torch tensors.

    Without ``pin_memory`` nothing is copied: each tensor is ``torch.from_numpy`` of the
    loader's shared-memory view, so, like the batch itself, it is valid only until the next
    batch is requested, unless ``batch.retain()`` is called (then until ``batch.release()``).
    Clone what you keep. A stoker batch comes out as a :class:`TensorBatch` (unpacks as
    ``images, labels``; ``keys``/``indices`` stay NumPy); tuples, lists and dicts keep their
    structure.

    ``pin_memory=True`` copies each array into page-locked memory (ready for a
    ``non_blocking`` copy to the GPU; the copy is then the tensor's own). Without CUDA it
    warns once and returns the zero-copy tensors.
    """
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "as_tensors(pin_memory=True): CUDA is not available, so tensors are not pinned",
            UserWarning,
            stacklevel=2,
        )
        pin_memory = False
    return _AsTensors(loader, pin_memory=pin_memory)
