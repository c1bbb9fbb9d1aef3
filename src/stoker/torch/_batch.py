"""Batch structures seen at the torch edge, and how to take one apart and put it back.

A batch from a loader is a stoker ``Batch`` (``.images``, ``.labels``, ``.keys`` ... and the
``retain``/``release`` slot protocol), a ``TensorBatch``, a tensor or array, or a tuple, list,
named tuple or dict of those (nested). ``flatten`` lists its array leaves and marks the image
entries; ``Tree.rebuild`` puts new leaves back in the same structure.

A batch with fields (``batch.schema``, ``.fields``, ``.lengths``) contributes its numeric,
mask, size and ragged columns and the ragged lengths as leaves, so whatever moves the leaves
(the prefetcher's copy to the device) moves them too. Text and bytes columns are not leaves:
they are copied on the host when the batch is taken apart (a model reads strings on the host,
and the loader reuses the slot they live in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from stoker._core.schema import Schema

__all__ = ["TensorBatch", "Tree", "flatten", "follows_slot_protocol", "is_batch"]


@dataclass(frozen=True, eq=False)
class TensorBatch:
    """A batch of tensors with the loader's bookkeeping; unpacks as ``images, labels``.

    ``keys`` and ``indices`` (record keys and global positions) stay NumPy arrays on the host.
    ``retain()``/``release()`` pass through to the loader's batch when there is one (a batch
    from :func:`stoker.torch.as_tensors` still lives in the loader's shared-memory slot).

    A batch of a set with fields has them as the loader's ``Batch`` has them: ``schema``,
    ``fields`` (name -> column tensor, beside the images: numeric ``(B, *shape)``, mask
    ``(B, H, W)``, size ``(B, 2)`` int32, ragged ``(B, max_len, *shape)`` zero-padded) and
    ``lengths`` (name -> int32 ``(B,)`` rows per sample of a ragged field, beside the column).
    Text and bytes stay on the host: their ``fields`` entry is the uint8 ``(B, max_len)``
    column and their ``lengths`` the byte counts, both CPU tensors. ``host_lengths`` keeps
    every variable field's lengths as a NumPy array, so splitting rows needs no device sync.

    ``batch[name]``: the image and label names of the schema give ``images`` and ``labels``;
    numeric, mask and size fields their tensor; a ragged field a list of ``(n_i, *shape)``
    tensors (views of the padded column); text a list of ``str``; bytes a list of ``bytes``.
    ``batch.padded(name)`` gives ``(values, lengths)`` of a variable field.
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    keys: np.ndarray | None = None
    indices: np.ndarray | None = None
    epoch: int = 0
    number: int = 0
    source: Any = None  # the loader's batch whose slot ``images`` may view
    schema: Schema | None = None
    fields: dict[str, torch.Tensor] = field(default_factory=dict)
    lengths: dict[str, torch.Tensor] = field(default_factory=dict)
    host_lengths: dict[str, np.ndarray] = field(default_factory=dict)

    def kind(self, name: str) -> str:
        """The kind of field ``name`` (``"image"``, ``"numeric"``, ``"ragged"``, ...)."""
        schema = self.schema
        if schema is not None and name in schema:
            return schema[name].kind
        if name in self.fields:
            return "ragged" if name in self.lengths else "numeric"
        raise KeyError(self._missing(name))

    def _missing(self, name: str) -> str:
        have = list(self.schema) if self.schema is not None else ["images", "labels"]
        return f"this batch has no field {name!r}; it has {have}"

    def __getitem__(self, name: str) -> Any:
        schema = self.schema
        if schema is not None and name == schema.image_name:
            return self.images
        if schema is not None and name == schema.header_name:
            return self.labels
        if name not in self.fields:
            raise KeyError(self._missing(name))
        col, kind = self.fields[name], self.kind(name)
        if kind not in ("ragged", "text", "bytes"):
            return col
        n = self.host_lengths[name].tolist()
        if kind == "ragged":
            return [col[r, :k] for r, k in enumerate(n)]
        host = col.numpy()
        rows = [host[r, :k].tobytes() for r, k in enumerate(n)]
        return [b.decode("utf-8") for b in rows] if kind == "text" else rows

    def __contains__(self, name: object) -> bool:
        schema = self.schema
        if schema is not None and name in (schema.image_name, schema.header_name):
            return True
        return name in self.fields

    def padded(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, lengths)`` of a ragged, text or bytes field: the zero-padded column and
        int32 ``(B,)`` lengths (on the device for ragged fields, on the host for text and
        bytes)."""
        if name not in self.lengths:
            raise KeyError(f"{name!r} is not a variable-length field of this batch")
        return self.fields[name], self.lengths[name]

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
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return None if a is None else np.array(a, copy=True)


_Rebuild = Callable[[list[Any]], Any]


def _const(value: Any) -> _Rebuild:
    return lambda new: value


def _walk_fields(
    item: Any, walk: Callable[[Any, bool], _Rebuild]
) -> Callable[[list[Any]], dict[str, Any]]:
    """The field part of a batch: columns and ragged lengths become leaves (through ``walk``),
    text and bytes are copied on the host now; the result rebuilds ``TensorBatch`` keywords."""
    schema = getattr(item, "schema", None)
    columns = getattr(item, "fields", None) or {}
    lengths = getattr(item, "lengths", None) or {}
    if not columns:
        return lambda new: {"schema": schema}
    kept = getattr(item, "host_lengths", None) or {}
    col_fns: dict[str, _Rebuild] = {}
    len_fns: dict[str, _Rebuild] = {}
    host_lengths: dict[str, np.ndarray] = {}
    for name, col in columns.items():
        kind = schema[name].kind if schema is not None and name in schema else None
        if name in lengths:
            held = kept.get(name)
            host_lengths[name] = np.array(held if held is not None else _host_copy(lengths[name]))
        if kind in ("text", "bytes"):  # stays on the host, copied out of the slot
            col_t = torch.from_numpy(_host_copy(col))  # type: ignore[arg-type]
            len_t = torch.from_numpy(np.array(host_lengths[name], dtype=np.int32))
            col_fns[name] = _const(col_t)
            len_fns[name] = _const(len_t)
            continue
        col_fns[name] = walk(col, False)
        if name in lengths:
            len_fns[name] = walk(lengths[name], False)

    def rebuild(new: list[Any]) -> dict[str, Any]:
        return {
            "schema": schema,
            "fields": {k: f(new) for k, f in col_fns.items()},
            "lengths": {k: f(new) for k, f in len_fns.items()},
            "host_lengths": host_lengths,
        }

    return rebuild


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
    positions = {t for t in target_keys if isinstance(t, int) and not isinstance(t, bool)}

    def walk(x: Any, is_target: bool, top: bool = False) -> Callable[[list[Any]], Any]:
        """``top``: ``x`` is the batch itself, whose entries ``target_keys`` names."""
        if _is_leaf(x):
            i = len(leaves)
            leaves.append(x)
            targets.append(is_target)
            return lambda new: new[i]
        if isinstance(x, dict):
            parts = [
                (k, walk(v, top and isinstance(k, str) and k in target_keys)) for k, v in x.items()
            ]
            kind = type(x)

            def rebuild_dict(new: list[Any]) -> Any:
                d = {k: f(new) for k, f in parts}
                return d if kind is dict else kind(d)

            return rebuild_dict
        if isinstance(x, (tuple, list)):
            fns = [walk(v, top and i in positions) for i, v in enumerate(x)]
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
        fields_fn = _walk_fields(item, walk)

        def fn(new: list[Any]) -> TensorBatch:
            return TensorBatch(
                images=images_fn(new),
                labels=labels_fn(new),
                keys=keys,
                indices=indices,
                epoch=epoch,
                number=number,
                **fields_fn(new),
            )

    elif isinstance(item, (dict, tuple, list)):
        fn = walk(item, False, top=True)
    else:
        raise TypeError(
            f"cannot move a batch of type {type(item).__name__} to the device: expected a stoker "
            "Batch, a tensor or array, or a tuple/list/dict of them"
        )
    return Tree(rebuild_fn=fn, leaves=leaves, targets=targets)
