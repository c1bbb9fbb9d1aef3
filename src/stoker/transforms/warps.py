"""Geometric warps: rotate, shear, scale-and-translate, sine warp.

Each moves a sample's boxes, points and masks too (``apply_targets``): the affine ones by the
forward matrix of the image's warp in continuous coordinates (masks by the same warp, nearest
neighbour); the sine warp, which is not affine, moves points and masks and refuses boxes.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.transforms._geom import (
    check_affine_interp,
    check_frame,
    resize,
    scale_matrix,
    too_small,
    warp,
)
from stoker.transforms._util import (
    border_value,
    check_fill,
    check_image,
    check_interp,
    cv2,
    cv_input,
    float_range,
    image_spec_dims,
    restore_channels,
)
from stoker.transforms.base import Transform, _SameSpec
from stoker.transforms.targets import from_index_matrix

if TYPE_CHECKING:
    from stoker.transforms.targets import Targets

__all__ = ["Rotate", "ScaleTranslate", "Shear", "SineWarp"]


@dataclass(frozen=True)
class Rotate(_SameSpec):
    """Rotate counter-clockwise by an angle drawn uniformly from ``degrees`` (a number ``d``
    means ``(-d, d)``) about the image centre, same size, corners filled with ``fill``.

    PIL's ``Image.rotate(angle)`` semantics; ``interpolation="nearest"`` is PIL's default.
    """

    degrees: float | tuple[float, float]
    _: KW_ONLY
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", float_range(self.degrees, "Rotate", "degrees"))
        object.__setattr__(self, "fill", check_fill(self.fill, "Rotate"))
        check_affine_interp(self.interpolation, "Rotate")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> float:
        """The angle in degrees (counter-clockwise)."""
        lo, hi = self.degrees  # type: ignore[misc]
        return float(rng.uniform(lo, hi))

    @staticmethod
    def matrix(hw: tuple[int, int], angle: float) -> np.ndarray:
        """Forward 2×3 matrix (input -> output pixel coordinates), as cv2.getRotationMatrix2D."""
        cy, cx = (hw[0] - 1) / 2.0, (hw[1] - 1) / 2.0
        a = math.cos(math.radians(angle))
        b = math.sin(math.radians(angle))
        return np.array(
            [[a, b, (1 - a) * cx - b * cy], [-b, a, b * cx + (1 - a) * cy]], dtype=np.float64
        )

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "Rotate")
        angle = self.params(img.shape[:2], rng)
        m = self.matrix(img.shape[:2], angle)
        return warp(img, m, self.interpolation, self.fill, inverse=False)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "Rotate")
        angle = self.params(img.shape[:2], rng)
        m = self.matrix(img.shape[:2], angle)
        targets.affine(from_index_matrix(m), img.shape[:2])
        return warp(img, m, self.interpolation, self.fill, inverse=False)


@dataclass(frozen=True)
class Shear(_SameSpec):
    """Shear by factors drawn uniformly from ``x`` and ``y`` (a number ``s`` means ``(-s, s)``).

    PIL semantics as in the seed's ``img.transform(size, AFFINE, (1, sx, 0, sy, 1, 0))``: the
    output pixel at (x, y) takes the input at (x + sx·y, sy·x + y), so the shear pivots on
    the top-left corner. ``center=True`` pivots on the image centre instead.
    """

    x: float | tuple[float, float] = 0.2
    y: float | tuple[float, float] = 0.2
    _: KW_ONLY
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"
    center: bool = False

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", float_range(self.x, "Shear", "x"))
        object.__setattr__(self, "y", float_range(self.y, "Shear", "y"))
        object.__setattr__(self, "fill", check_fill(self.fill, "Shear"))
        check_affine_interp(self.interpolation, "Shear")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> tuple[float, float]:
        """(sx, sy), the shear factors."""
        sx = float(rng.uniform(*self.x))  # type: ignore[misc]
        sy = float(rng.uniform(*self.y))  # type: ignore[misc]
        return sx, sy

    def matrix(self, hw: tuple[int, int], sx: float, sy: float) -> np.ndarray:
        """Inverse 2×3 matrix (output -> input pixel-index coordinates)."""
        if self.center:
            cy, cx = (hw[0] - 1) / 2.0, (hw[1] - 1) / 2.0
            tx = cx - (cx + sx * cy)
            ty = cy - (sy * cx + cy)
        else:  # PIL samples at pixel centres (i + 0.5); in index coordinates that adds s/2
            tx, ty = 0.5 * sx, 0.5 * sy
        return np.array([[1.0, sx, tx], [sy, 1.0, ty]], dtype=np.float64)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "Shear")
        sx, sy = self.params(img.shape[:2], rng)
        m = self.matrix(img.shape[:2], sx, sy)
        return warp(img, m, self.interpolation, self.fill, inverse=True)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "Shear")
        sx, sy = self.params(img.shape[:2], rng)
        m = self.matrix(img.shape[:2], sx, sy)
        a = m[:, :2]
        if abs(np.linalg.det(a)) < 1e-9:
            raise SpecError(
                f"Shear: factors sx={sx:g}, sy={sy:g} (sx*sy = 1) fold the image onto a line; "
                "boxes, points and masks cannot follow (keep |sx*sy| < 1)"
            )
        inv = np.linalg.inv(a)
        forward = np.concatenate([inv, -(inv @ m[:, 2:])], axis=1)
        targets.affine(from_index_matrix(forward), img.shape[:2])
        return warp(img, m, self.interpolation, self.fill, inverse=True)


@dataclass(frozen=True)
class ScaleTranslate(Transform):
    """Shrink to a random size and paste at a random offset on a ``fill`` canvas of the input's
    size (the seed-002 "scale" distortion).

    Height and width are drawn independently like ``random.randrange(min_size, max_size)``
    (``max_size`` excluded, capped at the image side + 1); every offset that keeps the
    shrunk image inside the canvas is possible. ``interpolation="auto"`` averages areas when a
    side shrinks 2× or more and is bilinear otherwise (see ``Resize``).
    """

    min_size: int
    max_size: int
    _: KW_ONLY
    fill: float | tuple[float, ...] = 0
    interpolation: str = "auto"

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        for v in (self.min_size, self.max_size):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"ScaleTranslate: sizes must be ints, got {v!r}")
        if not 1 <= self.min_size < self.max_size:
            raise ValueError(
                "ScaleTranslate: need 1 <= min_size < max_size, got "
                f"min_size={self.min_size}, max_size={self.max_size}"
            )
        object.__setattr__(self, "fill", check_fill(self.fill, "ScaleTranslate"))
        check_interp(self.interpolation, "ScaleTranslate")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the shrunk image on the canvas."""
        height, width = int(hw[0]), int(hw[1])
        if min(height, width) < self.min_size:
            raise too_small("ScaleTranslate", "min_size", (self.min_size,) * 2, (height, width))
        w = int(rng.integers(self.min_size, min(self.max_size, width + 1)))
        h = int(rng.integers(self.min_size, min(self.max_size, height + 1)))
        left = int(rng.integers(0, width - w + 1))
        top = int(rng.integers(0, height - h + 1))
        return top, left, h, w

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "ScaleTranslate")
        if isinstance(self.fill, tuple) and img.ndim == 2:
            raise ValueError("ScaleTranslate: a per-channel fill needs an HWC image")
        top, left, h, w = self.params(img.shape[:2], rng)
        return self._paste(img, top, left, h, w, self.fill, self.interpolation)

    @staticmethod
    def _paste(
        img: np.ndarray, top: int, left: int, h: int, w: int, fill: object, interpolation: str
    ) -> np.ndarray:
        small = cv_input(resize(img, h, w, interpolation))
        height, width = img.shape[:2]
        c = cv2()
        # One pass over the output: the border is written around the shrunk image.
        out = c.copyMakeBorder(
            small,
            top,
            height - h - top,
            left,
            width - w - left,
            c.BORDER_CONSTANT,
            value=border_value(fill, img),  # type: ignore[arg-type]
        )
        return restore_channels(out, img)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "ScaleTranslate")
        if isinstance(self.fill, tuple) and img.ndim == 2:
            raise ValueError("ScaleTranslate: a per-channel fill needs an HWC image")
        top, left, h, w = self.params(img.shape[:2], rng)
        out = self._paste(img, top, left, h, w, self.fill, self.interpolation)
        height, width = img.shape[:2]
        targets.affine(scale_matrix(w / width, h / height, left, top), (height, width), masks=False)
        for name, mask in targets.masks.items():  # nearest neighbour, on a 0 ("no object") canvas
            targets.masks[name] = self._paste(mask, top, left, h, w, 0, "nearest")
        return out

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "ScaleTranslate")
        if h is not None and w is not None and min(h, w) < self.min_size:
            raise too_small("ScaleTranslate", "min_size", (self.min_size,) * 2, (h, w))
        return in_spec


@dataclass(frozen=True)
class SineWarp(_SameSpec):
    """Roll every column vertically by ``shift(x) = int(a · H/3 · sin(-2πx / (period·W)))``
    with ``a`` drawn from ``amplitude`` (a number means a fixed magnitude) and a random sign:
    the seed-002 sine distortion (``period=0.5``: two waves across the width).
    Pixels leaving at the bottom come back at the top (``np.roll``).
    """

    amplitude: float | tuple[float, float] = (0.15, 0.2)
    _: KW_ONLY
    period: float = 0.5

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        amp = float_range(self.amplitude, "SineWarp", "amplitude", symmetric=False)
        if amp[0] < 0:
            raise ValueError(f"SineWarp: amplitude must be >= 0, got {self.amplitude!r}")
        object.__setattr__(self, "amplitude", amp)
        if not float(self.period) > 0:
            raise ValueError(
                f"SineWarp: period must be > 0 (a fraction of the width), got {self.period!r}"
            )

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> float:
        """The signed amplitude factor ``a``."""
        sign = 1.0 if rng.integers(0, 2) else -1.0
        return sign * float(rng.uniform(*self.amplitude))  # type: ignore[misc]

    def shifts(self, hw: tuple[int, int], a: float) -> np.ndarray:
        """Per-column downward roll, int64 of length W."""
        h, w = hw
        x = np.arange(w, dtype=np.float64)
        return np.trunc(a * (h / 3.0) * np.sin(-2.0 * np.pi * x / (self.period * w))).astype(
            np.int64
        )

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "SineWarp")
        h, w = img.shape[:2]
        s = self.shifts((h, w), self.params((h, w), rng))
        return _roll(img, _roll_map(img, s))

    def check_targets(self, kinds: frozenset[str]) -> None:
        if "boxes" in kinds:
            raise SpecError(
                "SineWarp cannot carry boxes: a sine-warped box is not a box (points and masks "
                "follow it; put the SineWarp where no boxes are carried)"
            )

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "SineWarp")
        self.check_targets(frozenset(["boxes"] if targets.boxes else []))
        h, w = img.shape[:2]
        s = self.shifts((h, w), self.params((h, w), rng))
        xy = _roll_map(img, s)
        out = _roll(img, xy)

        def move(p: np.ndarray) -> np.ndarray:
            # Input (x, y) lands at (x, (y + s[col]) mod h); points off the frame stay put.
            x, y = p[..., 0], p[..., 1]
            inside = (x >= 0) & (x < w) & (y >= 0) & (y < h)
            col = np.clip(np.floor(x), 0, w - 1).astype(np.int64)
            moved = np.mod(y + s[col], h)
            return np.stack([x, np.where(inside, moved, y)], axis=-1)

        targets.move_points(move, (h, w))
        for name, mask in targets.masks.items():
            targets.masks[name] = _roll(mask, xy)
        return out


def _roll_map(img: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The int16 (x, y) source map of a per-column downward roll by ``s``."""
    h, w = img.shape[:2]
    if max(h, w) > 32767:
        raise ValueError(f"SineWarp: images up to 32767 pixels a side, got {img.shape}")
    xy = np.empty((h, w, 2), np.int16)
    xy[..., 0] = np.arange(w, dtype=np.int16)
    xy[..., 1] = np.arange(h, dtype=np.int16)[:, None] - s.astype(np.int16)
    return xy


def _roll(img: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """``cv2.remap`` through ``xy``; BORDER_WRAP makes it ``np.roll`` per column."""
    c = cv2()
    out = c.remap(cv_input(img), xy, None, c.INTER_NEAREST, borderMode=c.BORDER_WRAP)
    return restore_channels(out, img)
