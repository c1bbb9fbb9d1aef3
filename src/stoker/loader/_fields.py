"""A batch's fields beyond images and labels: their columns, and one sample written into them.

Every carried field has a column of fixed size per row, so the workers that fill the rows of
one slot at once need no coordination (no arena, no offsets handed out):

- numeric: ``(rows, *shape)`` of its dtype; ``size``: int32 ``(rows, 2)``, the stored
  (height, width) of each image before any transform;
- ragged: ``(rows, max_len, *shape)``; text and bytes: uint8 ``(rows, max_len)`` (text as
  UTF-8); each with an int32 ``(rows,)`` lengths column. Rows past a sample's length are zero,
  so a batch's bytes are the same whoever made it;
- mask: ``(rows, H, W)`` at the batch's sample size, in the field's dtype (uint8: a decoded
  uint16 mask must hold values below 256), zero where the image is padded.

``max_len`` comes from the schema (``stoker pack`` records the largest of the set); a field
without it is refused before any data flows, since a guessed bound either wastes memory in
every slot or fails mid-epoch. A sample over it is an error naming its key and the field.

The per-sample job (:func:`fill_sample`): read the image and the fields, decode the image
(scale-on-decode may shrink it; the boxes, points and masks, in stored-image pixels, are
rescaled to match), move them with the chain's ``apply_targets``, drop the boxes below the
visibility floor together with the rows of fields that follow them, write every column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.schema import SIZE_FIELD, Field, Schema
from stoker.codecs import image_size
from stoker.formats.base import is_encoded
from stoker.pipeline import Pipeline
from stoker.transforms.targets import Targets

__all__ = ["FieldPlan", "FieldViews", "fill_sample", "plan_fields"]

_ALIGN = 64


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class FieldPlan:
    """What a loader's batches carry beyond images and labels (picklable: it goes to workers).

    ``schema``: the batches' schema (image, header label, carried fields); ``stored``: the
    fields read from the source (all carried ones but ``size``)."""

    schema: Schema
    columns: tuple[tuple[str, Field], ...] = field(init=False)
    stored: tuple[str, ...] = field(init=False)
    geometry: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        cols = tuple(self.schema.extra.items())
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "stored", tuple(n for n, f in cols if f.kind != "size"))
        kinds = set()
        for _n, f in cols:
            if f.kind == "mask":
                kinds.add("mask")
            elif f.geometry is not None:
                kinds.add(f.geometry)
        object.__setattr__(self, "geometry", frozenset(kinds))

    def shape(self, f: Field, frame: tuple[int, int]) -> tuple[int, ...]:
        """One row of ``f``'s column at sample size ``frame``."""
        if f.kind == "mask":
            return frame
        if f.variable:
            return (int(f.max_len or 0), *f.shape)
        return f.shape

    def row_bytes(self, f: Field, frame: tuple[int, int]) -> int:
        return int(np.prod(self.shape(f, frame), dtype=np.int64)) * np.dtype(f.dtype).itemsize

    def slot_bytes(self, rows: int, frame: tuple[int, int]) -> int:
        """Bytes the columns take in a slot of ``rows`` rows at the largest ``frame``."""
        total = 0
        for _n, f in self.columns:
            total += _align(rows * self.row_bytes(f, frame))
            if f.variable:
                total += _align(rows * 4)
        return total

    def views(
        self,
        mem: np.ndarray,
        base: int,
        capacity: int,
        frame: tuple[int, int],
        rows: int,
        max_frame: tuple[int, int],
    ) -> FieldViews:
        """The columns of the ``rows`` first rows, laid out from byte ``base`` of ``mem`` for
        ``capacity`` rows at ``max_frame`` (see ``_ring.py``)."""
        cols: dict[str, np.ndarray] = {}
        lens: dict[str, np.ndarray] = {}
        at = base
        for name, f in self.columns:
            shape = self.shape(f, frame)
            nb = rows * self.row_bytes(f, frame)
            cols[name] = mem[at : at + nb].view(f.dtype).reshape((rows, *shape))
            at += _align(capacity * self.row_bytes(f, max_frame))
            if f.variable:
                lens[name] = mem[at : at + 4 * rows].view(np.int32)
                at += _align(capacity * 4)
        return FieldViews(self, cols, lens)

    def arrays(self, rows: int, frame: tuple[int, int]) -> FieldViews:
        """Fresh columns (``workers=0``)."""
        cols = {n: np.zeros((rows, *self.shape(f, frame)), f.dtype) for n, f in self.columns}
        lens = {n: np.zeros(rows, np.int32) for n, f in self.columns if f.variable}
        return FieldViews(self, cols, lens)


class FieldViews(NamedTuple):
    """A slot's (or a fresh batch's) field columns, with their plan."""

    plan: FieldPlan
    columns: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]


def plan_fields(
    schema: Schema, fields: list[str] | tuple[str, ...] | None, *, size: bool = False
) -> FieldPlan | None:
    """The fields a loader carries: every field of ``schema`` (``fields=None``) or the named
    ones (``Schema.select``), plus ``size`` when asked; ``None`` when that is image and label
    only (the classification path). A variable field without ``max_len`` is a ``SpecError``."""
    if fields is not None:
        if isinstance(fields, str) or not all(isinstance(n, str) for n in fields):
            raise TypeError(f"fields must be a list of field names or None, got {fields!r}")
        want = list(fields)
    else:
        want = list(schema.extra)
    if size and SIZE_FIELD not in want:
        want.append(SIZE_FIELD)
    carried = schema.select(want)
    if not carried.extra:
        return None
    for name, f in carried.extra.items():
        if f.variable and f.max_len is None:
            raise SpecError(
                f"field {name!r} ({f.kind}) has no max_len: the loader sizes its batch columns "
                "from it. stoker pack records it; a hand-made schema sets it "
                f"(Field.{f.kind if f.kind != 'bytes' else 'bytes_'}(..., max_len=N))"
            )
    return FieldPlan(carried)


def _fail(key: int, gi: int, name: str, reason: str) -> SpecError:
    return SpecError(f"key {key} (position {gi}), field {name!r}: {reason}")


def _decode_mask(
    buf: Any, dtype: str, max_pixels: int | None, key: int, gi: int, name: str
) -> np.ndarray:
    from stoker.codecs import decode_mask

    m = decode_mask(buf, max_pixels=max_pixels)
    if m.dtype != dtype:
        if m.size and int(m.max()) > np.iinfo(dtype).max:
            raise _fail(key, gi, name, f"a {m.dtype} mask holds {int(m.max())}, over {dtype}")
        m = m.astype(dtype)
    return m


def _targets(
    plan: FieldPlan,
    vals: dict[str, Any],
    stored: tuple[int, int],
    max_pixels: int | None,
    key: int,
    gi: int,
) -> Targets:
    boxes, points, masks = {}, {}, {}
    for name, f in plan.columns:
        if f.kind == "mask":
            masks[name] = _decode_mask(vals[name], f.dtype, max_pixels, key, gi, name)
            if masks[name].shape[:2] != stored:
                raise _fail(key, gi, name, f"mask is {masks[name].shape[:2]}, the image {stored}")
        elif f.geometry == "boxes":
            boxes[name] = vals[name]
        elif f.geometry == "points":
            points[name] = vals[name]
    return Targets.make(stored, boxes=boxes, points=points, masks=masks)


def _moved(plan: FieldPlan, t: Targets, vals: dict[str, Any]) -> dict[str, Any]:
    """The geometric fields after the moves, boxes below the floor dropped with the rows of
    the fields that follow them."""
    out: dict[str, Any] = {}
    kept: dict[str, np.ndarray] = {}
    for name, f in plan.columns:
        if f.geometry == "boxes":
            keep = t.keep(name)
            kept[name] = keep
            out[name] = t.boxes[name][keep]
    for name, f in plan.columns:
        if f.kind == "mask":
            out[name] = t.masks[name]
        elif f.geometry == "points":
            out[name] = t.points[name]
        if f.follows is not None:
            out[name] = (out[name] if name in out else vals[name])[kept[f.follows]]
    return out


def _write(
    f: Field,
    name: str,
    value: Any,
    col: np.ndarray,
    lens: dict[str, np.ndarray],
    row: int,
    key: int,
    gi: int,
) -> None:
    """Write one sample's ``value`` into row ``row`` of ``col`` (zeros past its length)."""
    dest = col[row]
    if f.kind == "mask":
        h, w = value.shape[:2]
        dest[:h, :w] = value
        if (h, w) != dest.shape:
            dest[h:] = 0
            dest[:h, w:] = 0
        return
    if not f.variable:
        arr = np.asarray(value)
        if arr.shape != dest.shape:
            raise _fail(key, gi, name, f"expects shape {dest.shape}, got {arr.shape}")
        dest[...] = arr
        return
    if f.kind == "ragged":
        arr = np.asarray(value)
        if arr.shape[1:] != f.shape:
            raise _fail(key, gi, name, f"expects rows of shape {f.shape}, got {arr.shape}")
    else:
        data = value.encode("utf-8") if f.kind == "text" else value
        arr = np.frombuffer(data, dtype=np.uint8)
    n = len(arr)
    if n > len(dest):
        what = "rows" if f.kind == "ragged" else "bytes"
        raise _fail(key, gi, name, f"{n} {what}, over the set's max_len {len(dest)}")
    dest[:n] = arr
    dest[n:] = 0
    lens[name][row] = n


def fill_sample(
    plan: FieldPlan,
    pipeline: Pipeline,
    payload: Any,
    vals: dict[str, Any],
    rng: np.random.Generator,
    row: int,
    images: np.ndarray,
    fields: FieldViews,
    width: int | None,
    height: int | None,
    *,
    encoded: bool | None,
    key: int,
    gi: int,
) -> None:
    """One sample with fields into row ``row`` (see the module docstring); ``encoded`` as the
    source's :attr:`~stoker.formats.Reader.encoded` says."""
    if is_encoded(encoded, payload):
        stored = image_size(payload)
        img = pipeline.decode_image(payload)
    else:
        img = payload
        stored = tuple(np.shape(img)[:2])
    what, args = "key {} (position {})", (key, gi)
    cols, lens = fields.columns, fields.lengths
    for name, f in plan.columns:  # before any work: a sample over a bound is refused as stored
        if f.variable:
            n = f.length(vals[name]) if name in vals else 0
            if n > (f.max_len or 0):
                unit = "rows" if f.kind == "ragged" else "bytes"
                raise _fail(key, gi, name, f"{n} {unit}, over the set's max_len {f.max_len}")
    moved: dict[str, Any] = {}
    if plan.geometry:
        hw = (int(stored[0]), int(stored[1]))
        t = _targets(plan, vals, hw, pipeline.decode.max_pixels, key, gi)
        if img.shape[:2] != t.hw:
            t.rescale((int(img.shape[0]), int(img.shape[1])))
        pipeline.carry_targets(img, t, rng, images[row], width, height, what=what, args=args)
        moved = _moved(plan, t, vals)
    else:
        pipeline.fill_row(img, rng, images[row], width, what=what, args=args, height=height)
    for name, f in plan.columns:
        if f.kind == "size":
            value: Any = stored
        elif name in moved:
            value = moved[name]
        elif name in vals:
            value = vals[name]
        else:
            raise _fail(key, gi, name, "the source did not give it")
        _write(f, name, value, cols[name], lens, row, key, gi)
