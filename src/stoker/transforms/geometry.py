"""Geometric ops: resize, crops, flip, rotate, shear, scale-and-translate, sine warp.

Every op takes a uint8 (or float32) HW or HWC array and keeps its channels. Random ops draw
their parameters with ``params(hw, rng)`` (public, so the draws can be inspected) and apply
them with cv2; the affine ones hand a precomputed 2×3 matrix to ``cv2.warpAffine``.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.transforms._util import (
    border_value,
    check_fill,
    check_image,
    check_interp,
    cv2,
    cv_input,
    cv_interp,
    float_range,
    image_spec_dims,
    restore_channels,
    size_pair,
    with_hw,
)
from stoker.transforms.base import Transform

__all__ = [
    "CenterCrop",
    "HorizontalFlip",
    "RandomCrop",
    "RandomResizedCrop",
    "Resize",
    "Rotate",
    "ScaleTranslate",
    "Shear",
    "SineWarp",
]


def _resize(img: np.ndarray, h: int, w: int, interpolation: str) -> np.ndarray:
    src_h, src_w = img.shape[0], img.shape[1]
    if src_h == h and src_w == w:
        return img
    if interpolation == "auto":
        # Area averaging costs 4x bilinear at non-integer factors; below 2x bilinear already
        # reads every input pixel (its two taps per output pixel are < 2 pixels apart).
        interpolation = "area" if src_h >= 2 * h or src_w >= 2 * w else "bilinear"
    out = cv2().resize(cv_input(img), (w, h), interpolation=cv_interp(interpolation))
    return restore_channels(out, img)


def _too_small(owner: str, what: str, need: tuple[int, int], got: tuple[int, int]) -> SpecError:
    return SpecError(
        f"{owner}: input {got[0]}x{got[1]} (HxW) is smaller than the {what} {need[0]}x{need[1]}; "
        "put a Resize before it"
    )


@dataclass(frozen=True)
class Resize(Transform):
    """Resize to ``size``: an ``(h, w)`` pair, or one int meaning a square ``size×size``.

    With ``shorter_side=True`` an int ``size`` sets the shorter side and keeps the aspect ratio
    (torchvision's ``Resize(int)``: the longer side becomes ``int(size * long / short)``).
    ``interpolation``: ``"bilinear"`` (cv2 ``INTER_LINEAR``, the default, as in the seed's
    ``cv2.resize``), ``"area"`` (use it to shrink by more than 2×), ``"auto"`` (area when a side
    shrinks 2× or more, else bilinear: antialiased where it matters, at bilinear's cost
    elsewhere), ``"nearest"``, ``"bicubic"``, ``"lanczos"``. As a chain's first op it gives a
    decode hint (its own output size).
    """

    size: int | tuple[int, int]
    _: KW_ONLY
    shorter_side: bool = False
    interpolation: str = "bilinear"

    _builtin = True

    def __post_init__(self) -> None:
        check_interp(self.interpolation, "Resize")
        if self.shorter_side:
            if not isinstance(self.size, (int, np.integer)) or isinstance(self.size, bool):
                raise TypeError(f"Resize: shorter_side=True needs one int size, got {self.size!r}")
            size_pair(self.size, "Resize")
            object.__setattr__(self, "size", int(self.size))
        else:
            object.__setattr__(self, "size", size_pair(self.size, "Resize"))

    def target(self, hw: tuple[int, int]) -> tuple[int, int]:
        """The output (h, w) for an input of ``hw``."""
        if not self.shorter_side:
            return self.size  # type: ignore[return-value]
        s = int(self.size)  # type: ignore[arg-type]
        h, w = int(hw[0]), int(hw[1])
        if h <= w:
            return s, int(s * w / h)
        return int(s * h / w), s

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "Resize")
        th, tw = self.target(img.shape[:2])
        return _resize(img, th, tw, self.interpolation)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "Resize")
        if not self.shorter_side:
            th, tw = self.size  # type: ignore[misc]
            return with_hw(in_spec, th, tw)
        if h is None or w is None:
            return with_hw(in_spec, None, None)
        return with_hw(in_spec, *self.target((h, w)))

    def decode_hint(self, full_hw: tuple[int, int]) -> tuple[int, int] | None:
        th, tw = self.target(full_hw)
        if th >= full_hw[0] or tw >= full_hw[1]:
            return None
        return th, tw


@dataclass(frozen=True)
class RandomCrop(Transform):
    """Crop ``size`` (int or (h, w)) at a uniformly random position, every position possible.

    ``padding`` pixels of ``fill`` are added on every side first (the CIFAR recipe). The result
    is a view of the input (or of the padded copy).
    """

    size: int | tuple[int, int]
    _: KW_ONLY
    padding: int = 0
    fill: float | tuple[float, ...] = 0

    _builtin = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "RandomCrop"))
        if not isinstance(self.padding, (int, np.integer)) or self.padding < 0:
            raise ValueError(f"RandomCrop: padding must be an int >= 0, got {self.padding!r}")
        object.__setattr__(self, "fill", check_fill(self.fill, "RandomCrop"))

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> tuple[int, int]:
        """(top, left) of the crop in the (padded) image."""
        th, tw = self.size  # type: ignore[misc]
        h, w = hw[0] + 2 * self.padding, hw[1] + 2 * self.padding
        if h < th or w < tw:
            raise _too_small("RandomCrop", "crop", (th, tw), (h, w))
        top = int(rng.integers(0, h - th + 1))
        left = int(rng.integers(0, w - tw + 1))
        return top, left

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "RandomCrop")
        top, left = self.params(img.shape[:2], rng)
        if self.padding:
            p = self.padding
            padded = cv2().copyMakeBorder(
                cv_input(img), p, p, p, p, cv2().BORDER_CONSTANT, value=border_value(self.fill, img)
            )
            img = restore_channels(padded, img)
        th, tw = self.size  # type: ignore[misc]
        return img[top : top + th, left : left + tw]

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "RandomCrop")
        th, tw = self.size  # type: ignore[misc]
        p2 = 2 * self.padding
        if h is not None and w is not None and (h + p2 < th or w + p2 < tw):
            raise _too_small("RandomCrop", "crop", (th, tw), (h + p2, w + p2))
        return with_hw(in_spec, th, tw)


@dataclass(frozen=True)
class CenterCrop(Transform):
    """Crop ``size`` (int or (h, w)) from the centre (torchvision's rounding). Returns a view."""

    size: int | tuple[int, int]

    _builtin = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "CenterCrop"))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "CenterCrop")
        th, tw = self.size  # type: ignore[misc]
        h, w = img.shape[:2]
        if h < th or w < tw:
            raise _too_small("CenterCrop", "crop", (th, tw), (h, w))
        top = int(round((h - th) / 2.0))
        left = int(round((w - tw) / 2.0))
        return img[top : top + th, left : left + tw]

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "CenterCrop")
        th, tw = self.size  # type: ignore[misc]
        if h is not None and w is not None and (h < th or w < tw):
            raise _too_small("CenterCrop", "crop", (th, tw), (h, w))
        return with_hw(in_spec, th, tw)


@dataclass(frozen=True)
class RandomResizedCrop(Transform):
    """torchvision's RandomResizedCrop: a crop of random area fraction ``scale`` and aspect
    ratio ``ratio`` (log-uniform), resized to ``size``; after 10 failed draws, a centre crop
    clamped to ``ratio``.

    Decode hint: the smallest decode at which even the smallest possible crop still has at
    least ``size`` pixels per side, so a reduced-scale decode never costs detail.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    _: KW_ONLY
    interpolation: str = "bilinear"

    _builtin = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "RandomResizedCrop"))
        scale = float_range(self.scale, "RandomResizedCrop", "scale", symmetric=False)
        ratio = float_range(self.ratio, "RandomResizedCrop", "ratio", symmetric=False)
        if scale[0] <= 0 or scale[1] > 1:
            raise ValueError(f"RandomResizedCrop: scale must lie in (0, 1], got {self.scale!r}")
        if ratio[0] <= 0:
            raise ValueError(f"RandomResizedCrop: ratio must be positive, got {self.ratio!r}")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        check_interp(self.interpolation, "RandomResizedCrop")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the crop."""
        height, width = int(hw[0]), int(hw[1])
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w = width
            h = int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h = height
            w = int(round(h * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "RandomResizedCrop")
        top, left, h, w = self.params(img.shape[:2], rng)
        th, tw = self.size  # type: ignore[misc]
        return _resize(img[top : top + h, left : left + w], th, tw, self.interpolation)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        image_spec_dims(in_spec, "RandomResizedCrop")
        th, tw = self.size  # type: ignore[misc]
        return with_hw(in_spec, th, tw)

    def decode_hint(self, full_hw: tuple[int, int]) -> tuple[int, int] | None:
        height, width = full_hw
        area = height * width * self.scale[0]
        min_h = math.sqrt(area / self.ratio[1])  # the shortest crop allowed
        min_w = math.sqrt(area * self.ratio[0])  # the narrowest crop allowed
        th, tw = self.size  # type: ignore[misc]
        s = max(th / min_h, tw / min_w)
        if s >= 1:
            return None
        return min(height, math.ceil(height * s)), min(width, math.ceil(width * s))


@dataclass(frozen=True)
class HorizontalFlip(Transform):
    """Mirror left-right with probability ``p`` (``p=1`` always and ``p=0`` never, without
    drawing from ``rng``).

    The mirror is a new contiguous array (``cv2.flip``), not a reversed view: NumPy copies a
    view with a negative stride pixel by pixel, so the copy into the batch (or the next op's)
    would cost 20× the flip itself.
    """

    p: float = 0.5

    _builtin = True

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"HorizontalFlip: p must lie in [0, 1], got {self.p!r}")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "HorizontalFlip")
        p = self.p
        if p < 1.0 and (p <= 0.0 or rng.random() >= p):  # p=1 and p=0 need no draw
            return img
        return restore_channels(cv2().flip(cv_input(img), 1), img)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        image_spec_dims(in_spec, "HorizontalFlip")
        return in_spec


def _warp(
    img: np.ndarray, m: np.ndarray, interpolation: str, fill: object, *, inverse: bool
) -> np.ndarray:
    c = cv2()
    flags = cv_interp(interpolation) | (c.WARP_INVERSE_MAP if inverse else 0)
    h, w = img.shape[:2]
    out = c.warpAffine(
        cv_input(img),
        m,
        (w, h),
        flags=flags,
        borderMode=c.BORDER_CONSTANT,
        borderValue=border_value(fill, img),  # type: ignore[arg-type]
    )
    return restore_channels(out, img)


def _check_affine_interp(interpolation: str, owner: str) -> None:
    check_interp(interpolation, owner)
    if interpolation in ("area", "lanczos", "auto"):
        raise ValueError(f"{owner}: interpolation must be nearest, bilinear or bicubic")


@dataclass(frozen=True)
class Rotate(Transform):
    """Rotate counter-clockwise by an angle drawn uniformly from ``degrees`` (a number ``d``
    means ``(-d, d)``) about the image centre, same size, corners filled with ``fill``.

    PIL's ``Image.rotate(angle)`` semantics; ``interpolation="nearest"`` is PIL's default.
    """

    degrees: float | tuple[float, float]
    _: KW_ONLY
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"

    _builtin = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", float_range(self.degrees, "Rotate", "degrees"))
        object.__setattr__(self, "fill", check_fill(self.fill, "Rotate"))
        _check_affine_interp(self.interpolation, "Rotate")

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
        return _warp(img, m, self.interpolation, self.fill, inverse=False)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        image_spec_dims(in_spec, "Rotate")
        return in_spec


@dataclass(frozen=True)
class Shear(Transform):
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", float_range(self.x, "Shear", "x"))
        object.__setattr__(self, "y", float_range(self.y, "Shear", "y"))
        object.__setattr__(self, "fill", check_fill(self.fill, "Shear"))
        _check_affine_interp(self.interpolation, "Shear")

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
        return _warp(img, m, self.interpolation, self.fill, inverse=True)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        image_spec_dims(in_spec, "Shear")
        return in_spec


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
            raise _too_small("ScaleTranslate", "min_size", (self.min_size,) * 2, (height, width))
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
        small = cv_input(_resize(img, h, w, self.interpolation))
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
            value=border_value(self.fill, img),
        )
        return restore_channels(out, img)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "ScaleTranslate")
        if h is not None and w is not None and min(h, w) < self.min_size:
            raise _too_small("ScaleTranslate", "min_size", (self.min_size,) * 2, (h, w))
        return in_spec


@dataclass(frozen=True)
class SineWarp(Transform):
    """Roll every column vertically by ``shift(x) = int(a · H/3 · sin(-2πx / (period·W)))``
    with ``a`` drawn from ``amplitude`` (a number means a fixed magnitude) and a random sign:
    the seed-002 sine distortion (``period=0.5``: two waves across the width).
    Pixels leaving at the bottom come back at the top (``np.roll``).
    """

    amplitude: float | tuple[float, float] = (0.15, 0.2)
    _: KW_ONLY
    period: float = 0.5

    _builtin = True

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
        if max(h, w) > 32767:
            raise ValueError(f"SineWarp: images up to 32767 pixels a side, got {img.shape}")
        # One int16 (x, y) source map for cv2.remap; BORDER_WRAP makes it np.roll.
        xy = np.empty((h, w, 2), np.int16)
        xy[..., 0] = np.arange(w, dtype=np.int16)
        xy[..., 1] = np.arange(h, dtype=np.int16)[:, None] - s.astype(np.int16)
        c = cv2()
        out = c.remap(cv_input(img), xy, None, c.INTER_NEAREST, borderMode=c.BORDER_WRAP)
        return restore_channels(out, img)

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        image_spec_dims(in_spec, "SineWarp")
        return in_spec
