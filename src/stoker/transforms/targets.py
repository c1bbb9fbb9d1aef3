"""What moves with an image through the geometric ops: boxes, points and masks.

A :class:`Targets` holds one sample's geometric fields in the frame of its current image:

- ``boxes[name]``: float64 ``(n, 4)`` ``x1, y1, x2, y2``, continuous pixel coordinates (pixel
  ``(r, c)`` covers ``[c, c+1) x [r, r+1)``), always clipped to the frame, plus
  ``visible[name]``: float64 ``(n,)``, the fraction of each box's area that the clips so far
  have kept (1.0 at the start);
- ``points[name]``: float64 ``(n, ..., d)``, the last axis ``x, y[, visibility, ...]`` in the
  same coordinates; a point that leaves the frame keeps its coordinates and, when ``d >= 3``,
  gets visibility 0;
- ``masks[name]``: uint8 or uint16 ``(h, w)`` label maps the size of the image.

An op that moves geometry describes its move as a forward 2x3 affine matrix in continuous
coordinates (input -> output) and calls :meth:`Targets.affine`; masks follow with the same
matrix and nearest-neighbour interpolation (a crop may slice them instead: the same pixels).
At the end, :meth:`Targets.keep` says which boxes survived (clipped side >= ``MIN_BOX_SIZE``
pixels and visible fraction >= ``min_visibility``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MIN_BOX_SIZE", "MIN_VISIBILITY", "Targets", "to_index_matrix"]

#: A box whose clipped width or height is below this many pixels is dropped.
MIN_BOX_SIZE = 1.0
#: Default: a box of which less than this fraction of its area is left in the frame is dropped.
MIN_VISIBILITY = 0.1


def to_index_matrix(m: np.ndarray) -> np.ndarray:
    """A continuous-coordinate forward matrix as the pixel-index matrix cv2 expects
    (index ``i`` is continuous ``i + 0.5``): ``x_idx' = A (x_idx + .5) + t - .5``."""
    out = np.array(m, dtype=np.float64, copy=True)
    out[:, 2] = m[:, :2] @ np.array([0.5, 0.5]) + m[:, 2] - 0.5
    return out


def from_index_matrix(m: np.ndarray) -> np.ndarray:
    """The inverse of :func:`to_index_matrix`."""
    out = np.array(m, dtype=np.float64, copy=True)
    out[:, 2] = m[:, 2] + 0.5 - m[:, :2] @ np.array([0.5, 0.5])
    return out


def _apply(m: np.ndarray, xy: np.ndarray) -> np.ndarray:
    return xy @ m[:, :2].T + m[:, 2]


@dataclass
class Targets:
    """See the module docstring. ``hw`` is the current frame's (height, width)."""

    hw: tuple[int, int]
    boxes: dict[str, np.ndarray] = field(default_factory=dict)
    visible: dict[str, np.ndarray] = field(default_factory=dict)
    points: dict[str, np.ndarray] = field(default_factory=dict)
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        hw: tuple[int, int],
        *,
        boxes: dict[str, np.ndarray] | None = None,
        points: dict[str, np.ndarray] | None = None,
        masks: dict[str, np.ndarray] | None = None,
    ) -> Targets:
        """Targets in frame ``hw``: boxes are clipped at once (their visible fraction counts
        from the box as given), points marked, masks checked to be ``hw``."""
        t = cls((int(hw[0]), int(hw[1])))
        for name, b in (boxes or {}).items():
            b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
            lo, hi = np.minimum(b[:, :2], b[:, 2:]), np.maximum(b[:, :2], b[:, 2:])
            t.boxes[name] = np.concatenate([lo, hi], axis=1)  # x1 <= x2, y1 <= y2
            t.visible[name] = np.ones(len(b))
            t._clip(name)
        for name, p in (points or {}).items():
            t.points[name] = np.array(p, dtype=np.float64)
            t._mark(name)
        for name, m in (masks or {}).items():
            if m.shape[:2] != t.hw:
                raise ValueError(f"mask {name!r} is {m.shape[:2]}, the image {t.hw}")
            t.masks[name] = m
        return t

    @property
    def empty(self) -> bool:
        return not (self.boxes or self.points or self.masks)

    # ------------------------------------------------------------------ moves
    def affine(self, m: np.ndarray, out_hw: tuple[int, int], *, masks: bool = True) -> None:
        """Move everything by forward continuous-coordinate matrix ``m`` (2x3) into a frame of
        ``out_hw``. ``masks=False``: the caller has moved the masks itself."""
        m = np.asarray(m, dtype=np.float64)
        self.hw = (int(out_hw[0]), int(out_hw[1]))
        for name, b in self.boxes.items():
            if len(b):
                corners = np.stack(
                    [b[:, [0, 1]], b[:, [2, 1]], b[:, [0, 3]], b[:, [2, 3]]], axis=1
                )  # (n, 4 corners, 2)
                moved = _apply(m, corners)
                lo, hi = moved.min(axis=1), moved.max(axis=1)
                self.boxes[name] = np.concatenate([lo, hi], axis=1)
            self._clip(name)
        self.move_points(functools.partial(_apply, m), self.hw)
        if masks and self.masks:
            from stoker.transforms._util import cv2

            c = cv2()
            mi = to_index_matrix(m)
            h, w = self.hw
            for name, mask in self.masks.items():
                self.masks[name] = c.warpAffine(
                    np.ascontiguousarray(mask),
                    mi,
                    (w, h),
                    flags=c.INTER_NEAREST,
                    borderMode=c.BORDER_CONSTANT,
                    borderValue=0,
                )

    def move_points(self, fn: object, out_hw: tuple[int, int]) -> None:
        """Move points by ``fn(xy) -> xy`` (an ``(..., 2)`` array, continuous coordinates),
        for warps that are not affine. Boxes are refused by such ops before data flows."""
        self.hw = (int(out_hw[0]), int(out_hw[1]))
        for name, p in self.points.items():
            if p.size:
                p = p.copy()
                p[..., :2] = fn(p[..., :2])  # type: ignore[operator]
                self.points[name] = p
            self._mark(name)

    def rescale(self, out_hw: tuple[int, int]) -> None:
        """Scale to a frame of ``out_hw`` (a reduced-scale decode of the stored image)."""
        h, w = self.hw
        oh, ow = out_hw
        if (h, w) == (oh, ow):
            return
        m = np.array([[ow / w, 0.0, 0.0], [0.0, oh / h, 0.0]])
        self.affine(m, out_hw, masks=False)
        if self.masks:
            from stoker.transforms._util import cv2

            c = cv2()
            for name, mask in self.masks.items():
                self.masks[name] = c.resize(mask, (ow, oh), interpolation=c.INTER_NEAREST_EXACT)

    # ------------------------------------------------------------------ bookkeeping
    def _clip(self, name: str) -> None:
        b = self.boxes[name]
        if not len(b):
            return
        h, w = self.hw
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        c = np.empty_like(b)
        c[:, [0, 2]] = np.clip(b[:, [0, 2]], 0, w)
        c[:, [1, 3]] = np.clip(b[:, [1, 3]], 0, h)
        kept = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(area > 0, kept / np.where(area > 0, area, 1), 1.0)
        self.visible[name] = self.visible[name] * frac
        self.boxes[name] = c

    def _mark(self, name: str) -> None:
        p = self.points[name]
        if p.shape[-1] < 3 or not p.size:
            return
        h, w = self.hw
        x, y = p[..., 0], p[..., 1]
        out = (x < 0) | (x >= w) | (y < 0) | (y >= h)
        if out.any():
            p[..., 2] = np.where(out, 0, p[..., 2])

    def keep(self, name: str, min_visibility: float = MIN_VISIBILITY) -> np.ndarray:
        """Bool ``(n,)``: the boxes of ``name`` that survive (see the module docstring)."""
        b = self.boxes[name]
        if not len(b):
            return np.zeros(0, dtype=bool)
        sides = np.minimum(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1])
        return (sides >= MIN_BOX_SIZE) & (self.visible[name] >= min_visibility)
