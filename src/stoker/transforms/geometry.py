"""Geometric ops: resize, crops, flip, rotate, shear, scale-and-translate, sine warp.

Every op takes a uint8 (or float32) HW or HWC array and keeps its channels. Random ops draw
their parameters with ``params(hw, rng)`` (public, so the draws can be inspected) and apply
them with cv2; the affine ones hand a precomputed 2×3 matrix to ``cv2.warpAffine``.

Every op also moves a sample's boxes, points and masks (``apply_targets``): the same draws,
the same image, and a forward matrix in continuous coordinates for the targets. The warps
(rotate, shear, scale-and-translate, sine) live in :mod:`stoker.transforms.warps`.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.transforms._geom import (
    check_frame,
    resize,
    resize_masks,
    scale_matrix,
    slice_masks,
    too_small,
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
    size_pair,
    with_hw,
)
from stoker.transforms.base import Transform, _SameSpec
from stoker.transforms.warps import Rotate, ScaleTranslate, Shear, SineWarp

if TYPE_CHECKING:
    from stoker.transforms.targets import Targets

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
    moves_geometry = True

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
        return resize(img, th, tw, self.interpolation)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "Resize")
        h, w = img.shape[:2]
        th, tw = self.target((h, w))
        out = resize(img, th, tw, self.interpolation)
        # cv2.resize maps pixel centres onto pixel centres: in continuous coordinates a scale.
        targets.affine(scale_matrix(tw / w, th / h), (th, tw), masks=False)
        resize_masks(targets, th, tw)
        return out

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
    moves_geometry = True

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
            raise too_small("RandomCrop", "crop", (th, tw), (h, w))
        # one uniform per axis, from one call (two bounded-integer calls cost twice as much)
        u = rng.random(2)
        return int(u[0] * (h - th + 1)), int(u[1] * (w - tw + 1))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "RandomCrop")
        top, left = self.params(img.shape[:2], rng)
        return self._crop(img, top, left, self.fill)

    def _crop(
        self, img: np.ndarray, top: int, left: int, fill: float | tuple[float, ...]
    ) -> np.ndarray:
        if self.padding:
            p = self.padding
            padded = cv2().copyMakeBorder(
                cv_input(img), p, p, p, p, cv2().BORDER_CONSTANT, value=border_value(fill, img)
            )
            img = restore_channels(padded, img)
        th, tw = self.size  # type: ignore[misc]
        return img[top : top + th, left : left + tw]

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "RandomCrop")
        top, left = self.params(img.shape[:2], rng)
        out = self._crop(img, top, left, self.fill)
        p = self.padding
        th, tw = self.size  # type: ignore[misc]
        targets.affine(scale_matrix(1.0, 1.0, p - left, p - top), (th, tw), masks=False)
        for name, mask in targets.masks.items():  # padded with 0 ("no object"), whatever the fill
            targets.masks[name] = self._crop(mask, top, left, 0)
        return out

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "RandomCrop")
        th, tw = self.size  # type: ignore[misc]
        p2 = 2 * self.padding
        if h is not None and w is not None and (h + p2 < th or w + p2 < tw):
            raise too_small("RandomCrop", "crop", (th, tw), (h + p2, w + p2))
        return with_hw(in_spec, th, tw)


@dataclass(frozen=True)
class CenterCrop(Transform):
    """Crop ``size`` (int or (h, w)) from the centre (torchvision's rounding). Returns a view."""

    size: int | tuple[int, int]

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "CenterCrop"))

    def params(self, hw: tuple[int, int]) -> tuple[int, int]:
        """(top, left) of the crop (no draws)."""
        th, tw = self.size  # type: ignore[misc]
        h, w = hw
        if h < th or w < tw:
            raise too_small("CenterCrop", "crop", (th, tw), (h, w))
        return int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "CenterCrop")
        top, left = self.params(img.shape[:2])
        th, tw = self.size  # type: ignore[misc]
        return img[top : top + th, left : left + tw]

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "CenterCrop")
        top, left = self.params(img.shape[:2])
        th, tw = self.size  # type: ignore[misc]
        targets.affine(scale_matrix(1.0, 1.0, -left, -top), (th, tw), masks=False)
        slice_masks(targets, top, left, th, tw)
        return img[top : top + th, left : left + tw]

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, _c = image_spec_dims(in_spec, "CenterCrop")
        th, tw = self.size  # type: ignore[misc]
        if h is not None and w is not None and (h < th or w < tw):
            raise too_small("CenterCrop", "crop", (th, tw), (h, w))
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
    moves_geometry = True

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
        return resize(img[top : top + h, left : left + w], th, tw, self.interpolation)

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "RandomResizedCrop")
        top, left, h, w = self.params(img.shape[:2], rng)
        th, tw = self.size  # type: ignore[misc]
        out = resize(img[top : top + h, left : left + w], th, tw, self.interpolation)
        sx, sy = tw / w, th / h  # the crop (top, left, h, w) resized to (th, tw)
        targets.affine(scale_matrix(sx, sy, -left * sx, -top * sy), (th, tw), masks=False)
        slice_masks(targets, top, left, h, w)
        resize_masks(targets, th, tw)
        return out

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
class HorizontalFlip(_SameSpec):
    """Mirror left-right with probability ``p`` (``p=1`` always and ``p=0`` never, without
    drawing from ``rng``).

    The mirror is a new contiguous array (``cv2.flip``), not a reversed view: NumPy copies a
    view with a negative stride pixel by pixel, so the copy into the batch (or the next op's)
    would cost 20× the flip itself.
    """

    p: float = 0.5

    _builtin = True
    moves_geometry = True

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"HorizontalFlip: p must lie in [0, 1], got {self.p!r}")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "HorizontalFlip")
        if not self.params(rng):
            return img
        return restore_channels(cv2().flip(cv_input(img), 1), img)

    def params(self, rng: np.random.Generator) -> bool:
        """Whether to flip."""
        p = self.p
        return not (p < 1.0 and (p <= 0.0 or rng.random() >= p))  # p=1 and p=0 need no draw

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        check_frame(img, targets, "HorizontalFlip")
        if not self.params(rng):
            return img
        h, w = img.shape[:2]
        targets.affine(scale_matrix(-1.0, 1.0, w), (h, w), masks=False)
        c = cv2()
        for name, mask in targets.masks.items():
            targets.masks[name] = c.flip(cv_input(mask), 1)
        return restore_channels(c.flip(cv_input(img), 1), img)
