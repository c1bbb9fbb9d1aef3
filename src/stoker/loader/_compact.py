"""Rows of skipped samples dropped from a delivered batch (``on_error="skip"``), in place and
in order, for the ring's views and the workers=0 path alike."""

from __future__ import annotations

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.loader._fields import FieldViews

__all__ = ["compact", "compact_fields", "dims"]


def compact_fields(fields: FieldViews | None, bad: list) -> FieldViews | None:
    """``compact`` for the field columns (no ``pair_with`` with fields: no halves)."""
    if fields is None or not bad:
        return fields
    bad_rows = {row for row, *_ in bad}
    rows = len(next(iter(fields.columns.values())))
    order = [r for r in range(rows) if r not in bad_rows]
    k = len(order)

    def squeeze(v: np.ndarray) -> np.ndarray:
        v[:k] = v[order]
        return v[:k]

    cols = {n: squeeze(v) for n, v in fields.columns.items()}
    lens = {n: squeeze(v) for n, v in fields.lengths.items()}
    return FieldViews(fields.plan, cols, lens)


def dims(spec: ArraySpec) -> tuple[int, ...]:
    return tuple(int(d) for d in spec.shape if d is not None)


def compact(
    views: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], bad: list, half: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Drop the rows of skipped samples, keeping order (and the pair_with halves aligned)."""
    if not bad:
        return views
    bad_rows = {row for row, *_ in bad}
    good = [r for r in range(len(views[0]) - half) if r not in bad_rows]
    order = good + [r + half for r in good] if half else good
    k = len(order)
    out = []
    for v in views:
        v[:k] = v[order]
        out.append(v[:k])
    return out[0], out[1], out[2], out[3]
