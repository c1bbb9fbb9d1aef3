"""One record with fields as :class:`~stoker.torch.RecordDataset` gives it.

The steps are the loader's for one sample (``docs/contracts.md``): the boxes, points and masks
are in stored-image pixels, so a reduced-scale decode rescales them first; the transforms'
``apply_targets`` moves them with the image (the same draws and the same image as calling the
transforms); boxes below the visibility floor are dropped together with the rows of the
fields that follow them. ``size`` is the stored (height, width).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stoker._core.errors import SpecError
from stoker._core.schema import SIZE_FIELD, Field, Schema
from stoker.transforms.targets import Targets

__all__ = ["geometry_kinds", "sample_fields"]


def geometry_kinds(schema: Schema) -> frozenset[str]:
    """What the transforms must be able to move: ``"boxes"``, ``"points"``, ``"mask"``."""
    kinds = {"mask" for f in schema.extra.values() if f.kind == "mask"}
    kinds |= {f.geometry for f in schema.extra.values() if f.geometry is not None}
    return frozenset(kinds)


def _mask(buf: Any, f: Field, name: str, where: str) -> np.ndarray:
    from stoker.codecs import decode_mask

    m = decode_mask(buf)
    if m.dtype != f.dtype:
        if m.size and int(m.max()) > np.iinfo(f.dtype).max:
            raise SpecError(f"{where}, field {name!r}: a {m.dtype} mask holds {int(m.max())}")
        m = m.astype(f.dtype)
    return m


def _tensor(value: Any, f: Field) -> Any:
    if f.kind in ("text", "bytes"):
        return value
    return torch.from_numpy(np.ascontiguousarray(value, dtype=f.dtype))


def sample_fields(
    schema: Schema,
    img: np.ndarray,
    stored: tuple[int, int],
    vals: dict[str, Any],
    transforms: Any,
    rng: np.random.Generator,
    where: str,
) -> tuple[np.ndarray, dict[str, Any]]:
    """``(image, fields)``: ``img`` (decoded, maybe at reduced scale) through ``transforms``
    with the geometric fields of ``vals`` (as ``Field.check`` gives them; masks as bytes)
    moved along; each carried field as a tensor of its dtype (text ``str``, bytes ``bytes``)."""
    extra = schema.extra
    if geometry_kinds(schema):
        masks = {n: _mask(vals[n], f, n, where) for n, f in extra.items() if f.kind == "mask"}
        for n, m in masks.items():
            if m.shape[:2] != stored:
                raise SpecError(f"{where}, field {n!r}: mask is {m.shape[:2]}, the image {stored}")
        t = Targets.make(
            stored,
            boxes={n: vals[n] for n, f in extra.items() if f.geometry == "boxes"},
            points={n: vals[n] for n, f in extra.items() if f.geometry == "points"},
            masks=masks,
        )
        if img.shape[:2] != t.hw:
            t.rescale((int(img.shape[0]), int(img.shape[1])))
        if transforms is not None:
            img = transforms.apply_targets(img, t, rng)
        vals = dict(vals)
        kept = {n: t.keep(n) for n in t.boxes}
        vals.update({n: t.boxes[n][kept[n]] for n in t.boxes})
        vals.update(t.points)
        vals.update(t.masks)
        for n, f in extra.items():
            if f.follows is not None:
                vals[n] = np.asarray(vals[n])[kept[f.follows]]
    elif transforms is not None:
        img = transforms(img, rng)
    out: dict[str, Any] = {}
    for n, f in extra.items():
        value = np.array(stored, np.int32) if n == SIZE_FIELD else vals[n]
        out[n] = _tensor(value, f)
    return img, out
