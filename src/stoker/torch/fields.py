"""A batch's fields as a model takes them: a dict of tensors, or detection targets per image;
and the ``DataLoader`` collate for :class:`~stoker.torch.RecordDataset` samples with fields.

``field_tensors`` and ``detection_targets`` accept a :class:`~stoker.torch.TensorBatch` (from
``CudaPrefetcher`` or :func:`~stoker.torch.as_tensors`) or a stoker ``Batch`` straight from the
loader (its arrays are then viewed as tensors without a copy, valid like the batch until the
next one is asked for).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

from stoker._core.schema import Schema
from stoker.torch.tensors import tensor_batch

__all__ = ["FieldCollate", "collate_fields", "detection_targets", "field_tensors"]

RAGGED = ("list", "padded")


def field_tensors(
    batch: Any, names: Sequence[str] | None = None, *, ragged: str = "list"
) -> dict[str, Any]:
    """``{name: value}`` for the image, the label and every field of ``batch`` (or ``names``).

    Values: the images and labels tensors under the schema's names (``"images"`` and
    ``"labels"`` for a batch without a schema); numeric, mask and size fields as tensors;
    ragged fields as a list of ``(n_i, *shape)`` tensors (``ragged="list"``, what a per-image
    loss loops over) or as the tuple ``(values, lengths)`` (``ragged="padded"``: the
    zero-padded ``(B, max_len, *shape)`` column and int32 ``(B,)`` lengths, what a batched loss
    such as ``ctc_loss`` takes); text as a list of ``str`` and bytes as a list of ``bytes``
    (they stay on the host either way).
    """
    if ragged not in RAGGED:
        raise ValueError(f"ragged must be one of {RAGGED}, got {ragged!r}")
    tb = tensor_batch(batch)
    schema = tb.schema
    image_name = schema.image_name if schema is not None else "images"
    label_name = schema.header_name if schema is not None else "labels"
    if names is None:
        names = [image_name] + ([label_name] if label_name and tb.labels is not None else [])
        names += list(tb.fields)
    out: dict[str, Any] = {}
    for name in names:
        if name == image_name:
            out[name] = tb.images
        elif name == label_name:
            out[name] = tb.labels
        elif ragged == "padded" and name in tb.fields and tb.kind(name) == "ragged":
            out[name] = tb.padded(name)
        else:
            out[name] = tb[name]
    return out


def detection_targets(
    batch: Any,
    *,
    boxes: str | None = None,
    labels: str | None = None,
    extra: Sequence[str] | Mapping[str, str] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """One dict per image in torchvision's detection style:
    ``{"boxes": float32 (n_i, 4), "labels": int64 (n_i,), ...}``, on the batch's device.

    ``boxes``: the boxes field (default: the schema's one field with ``geometry="boxes"``).
    ``labels``: the field that holds each box's class (default: the one non-geometric ragged
    field that ``follows`` the boxes; name it when there are several, or none). ``extra``:
    more entries per image, by field name or as ``{key: field}`` (default: the other fields
    that follow the boxes, such as keypoints, under their own names); a ragged field gives
    image ``i``'s rows, text its string, any other field its row ``i`` (a mask, the size).
    """
    tb = tensor_batch(batch)
    schema = tb.schema
    if schema is None:
        raise ValueError("this batch carries no fields; load with Loader(..., fields=[...])")
    if boxes is None:
        found = [n for n in tb.fields if schema[n].geometry == "boxes"]
        if len(found) != 1:
            raise ValueError(
                f"detection_targets needs boxes=: the batch has {len(found)} boxes fields "
                f"{found} (fields: {list(tb.fields)})"
            )
        boxes = found[0]
    elif boxes not in tb.fields or schema[boxes].geometry != "boxes":
        raise ValueError(f"{boxes!r} is not a boxes field of this batch: {list(tb.fields)}")
    followers = [n for n in tb.fields if n in schema and schema[n].follows == boxes]
    if labels is None:
        plain = [n for n in followers if schema[n].geometry is None]
        if len(plain) != 1:
            raise ValueError(
                f"detection_targets needs labels=: {len(plain)} non-geometric fields follow "
                f"{boxes!r} ({plain})"
            )
        labels = plain[0]
    if extra is None:
        extra = [n for n in followers if n != labels]
    pairs = list(extra.items()) if isinstance(extra, Mapping) else [(n, n) for n in extra]
    for name in [labels, *(f for _, f in pairs)]:
        if name not in tb:
            raise KeyError(f"this batch has no field {name!r}; it has {list(tb.fields)}")
    n_boxes = tb.host_lengths[boxes]
    if tb.kind(labels) != "ragged" or (tb.host_lengths[labels] != n_boxes).any():
        raise ValueError(f"labels {labels!r} must be a ragged field with one row per box")
    box_rows, label_rows = tb[boxes], tb[labels]
    per_field = {key: tb[name] for key, name in pairs}
    out = []
    for i in range(len(tb)):
        d = {"boxes": box_rows[i].to(torch.float32), "labels": label_rows[i].to(torch.int64)}
        d.update((key, rows[i]) for key, rows in per_field.items())
        out.append(d)
    return out


@dataclass(frozen=True)
class FieldCollate:
    """The collate of :func:`collate_fields` (a picklable callable: ``DataLoader`` workers
    receive it)."""

    schema: Schema
    ragged: str = "list"

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ValueError("collate_fields got no samples")
        out: dict[str, Any] = {}
        for name in samples[0]:
            values = [s[name] for s in samples]
            kind = self.schema[name].kind if name in self.schema else "numeric"
            if kind in ("text", "bytes"):
                out[name] = values
            elif kind == "ragged":
                out[name] = values if self.ragged == "list" else _pad(values)
            elif kind in ("image", "mask", "size", "numeric") and isinstance(
                values[0], torch.Tensor
            ):
                shapes = {tuple(v.shape) for v in values}
                if len(shapes) > 1:
                    raise ValueError(
                        f"field {name!r} ({kind}) has several shapes in one batch "
                        f"{sorted(shapes)}: end the transforms in a fixed size (Resize, "
                        "RandomCrop, RandomResizedCrop) to stack them"
                    )
                out[name] = torch.stack(values)
            else:  # the label as the classification path collates it
                out[name] = default_collate(values)
        return out


def _pad(values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(v) for v in values], dtype=torch.int32)
    first = values[0]
    padded = first.new_zeros((len(values), int(lengths.max()), *first.shape[1:]))
    for r, v in enumerate(values):
        padded[r, : len(v)] = v
    return padded, lengths


def collate_fields(schema: Schema, *, ragged: str = "list") -> FieldCollate:
    """A ``collate_fn`` for dict samples of ``schema`` (what ``RecordDataset`` gives for a set
    with fields): images, numeric fields, masks and sizes stacked; the label collated as for
    classification; ragged fields as a list of tensors (``ragged="list"``) or as
    ``(values, lengths)`` zero-padded to the batch's longest (``ragged="padded"``); text and
    bytes as lists. The result has the layout of :func:`field_tensors` on a loader batch.

    >>> loader = DataLoader(ds, batch_size=32, num_workers=4, collate_fn=ds.collate_fn())
    """
    if ragged not in RAGGED:
        raise ValueError(f"ragged must be one of {RAGGED}, got {ragged!r}")
    return FieldCollate(schema, ragged)
