"""Batch structures seen at the torch edge, and how to take one apart and put it back.

A batch from a loader is a stoker ``Batch`` (``.images``, ``.labels``, ``.keys`` ... and the
``retain``/``release`` slot protocol), a ``TensorBatch``, a tensor or array, or a tuple, list,
named tuple or dict of those (nested). ``flatten`` lists its array leaves and marks the image
entries; ``Tree.rebuild`` puts new leaves back in the same structure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["TensorBatch", "Tree", "flatten", "follows_slot_protocol", "is_batch"]


@dataclass(frozen=True, eq=False)
class TensorBatch:
    """A batch of tensors with the loader's bookkeeping; unpacks as ``images, labels``.

    ``keys`` and ``indices`` (record keys and global positions) stay NumPy arrays on the host.
    ``retain()``/``release()`` pass through to the loader's batch when there is one (a batch
    from :func:`stoker.torch.as_tensors` still lives in the loader's shared-memory slot).
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    keys: np.ndarray | None = None
    indices: np.ndarray | None = None
    epoch: int = 0
    number: int = 0
    source: Any = None  # the loader's batch whose slot ``images`` may view

    def __iter__(self) -> Iterator[Any]:
        yield self.images
        yield self.labels

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __repr__(self) -> str:
        labels = None if self.labels is None else tuple(self.labels.shape)
        return (
            f"TensorBatch(epoch={self.epoch}, number={self.number}, images="
            f"{tuple(self.images.shape)} {self.images.dtype} on {self.images.device}, "
            f"labels={labels})"
        )

    def retain(self) -> TensorBatch:
        """Keep the loader's slot past the next batch request (until ``release()``)."""
        if follows_slot_protocol(self.source):
            self.source.retain()
        return self

    def release(self) -> None:
        """Give the loader's slot back after ``retain()``."""
        if follows_slot_protocol(self.source):
            self.source.release()


def follows_slot_protocol(item: object) -> bool:
    """True for objects with callable ``retain`` and ``release`` (stoker batches)."""
    return callable(getattr(item, "retain", None)) and callable(getattr(item, "release", None))


def is_batch(item: object) -> bool:
    """True for a stoker ``Batch`` or a :class:`TensorBatch`."""
    return hasattr(item, "images") and hasattr(item, "labels") and follows_slot_protocol(item)


def _host_copy(a: Any) -> np.ndarray | None:
    return None if a is None else np.array(a, copy=True)


@dataclass
class Tree:
    """How to rebuild a batch from new leaves. ``targets[i]`` marks leaf ``i`` as images."""

    rebuild_fn: Callable[[list[Any]], Any]
    leaves: list[Any]
    targets: list[bool]

    def rebuild(self, new_leaves: Sequence[Any]) -> Any:
        if len(new_leaves) != len(self.targets):
            raise ValueError(f"expected {len(self.targets)} leaves, got {len(new_leaves)}")
        return self.rebuild_fn(list(new_leaves))


def _is_leaf(x: object) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray))


def flatten(item: Any, target_keys: Sequence[str | int]) -> Tree:
    """Split ``item`` into array leaves and a rebuild function.

    Image targets: a bare tensor/array is the image; in a stoker batch ``.images``; at the top
    level of a dict the entries whose key is in ``target_keys``, of a tuple/list the positions
    in ``target_keys``. Non-array leaves (strings, numbers, None) are kept as they are.
    """
    leaves: list[Any] = []
    targets: list[bool] = []

    def walk(x: Any, is_target: bool) -> Callable[[list[Any]], Any]:
        if _is_leaf(x):
            i = len(leaves)
            leaves.append(x)
            targets.append(is_target)
            return lambda new: new[i]
        if isinstance(x, dict):
            parts = [(k, walk(v, False)) for k, v in x.items()]
            kind = type(x)

            def rebuild_dict(new: list[Any]) -> Any:
                d = {k: f(new) for k, f in parts}
                return d if kind is dict else kind(d)

            return rebuild_dict
        if isinstance(x, (tuple, list)):
            fns = [walk(v, False) for v in x]
            if isinstance(x, tuple) and hasattr(x, "_fields"):  # named tuple
                nt = type(x)
                return lambda new: nt(*(f(new) for f in fns))
            seq = type(x) if type(x) in (tuple, list) else list
            return lambda new: seq(f(new) for f in fns)
        return lambda new: x

    if _is_leaf(item):
        fn = walk(item, True)
    elif is_batch(item):
        images_fn = walk(item.images, True)
        labels_fn = walk(item.labels, False) if item.labels is not None else (lambda new: None)
        keys = _host_copy(getattr(item, "keys", None))
        indices = _host_copy(getattr(item, "indices", None))
        epoch = int(getattr(item, "epoch", 0))
        number = int(getattr(item, "number", 0))

        def fn(new: list[Any]) -> TensorBatch:
            return TensorBatch(
                images=images_fn(new),
                labels=labels_fn(new),
                keys=keys,
                indices=indices,
                epoch=epoch,
                number=number,
            )

    elif isinstance(item, dict):
        parts = [(k, walk(v, isinstance(k, str) and k in target_keys)) for k, v in item.items()]
        kind = type(item)

        def fn(new: list[Any]) -> Any:
            d = {k: f(new) for k, f in parts}
            return d if kind is dict else kind(d)

    elif isinstance(item, (tuple, list)):
        fns = [
            walk(
                v,
                any(isinstance(t, int) and not isinstance(t, bool) and t == i for t in target_keys),
            )
            for i, v in enumerate(item)
        ]
        if isinstance(item, tuple) and hasattr(item, "_fields"):
            nt = type(item)

            def fn(new: list[Any]) -> Any:
                return nt(*(f(new) for f in fns))

        else:
            seq = type(item) if type(item) in (tuple, list) else list

            def fn(new: list[Any]) -> Any:
                return seq(f(new) for f in fns)

    else:
        raise TypeError(
            f"cannot move a batch of type {type(item).__name__} to the device: expected a stoker "
            "Batch, a tensor or array, or a tuple/list/dict of them"
        )
    return Tree(rebuild_fn=fn, leaves=leaves, targets=targets)
