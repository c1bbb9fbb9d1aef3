"""Filters: Gaussian blur and PIL's 3×3 SHARPEN and SMOOTH kernels, through cv2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from stoker.transforms._util import (
    check_image,
    cv2,
    cv_input,
    float_range,
    restore_channels,
)
from stoker.transforms.base import _SameSpec

__all__ = ["GaussianBlur", "Sharpen", "Smooth"]

# PIL's ImageFilter.SHARPEN and SMOOTH: 3×3 kernels with their scale.
_SHARPEN = np.array([[-2, -2, -2], [-2, 32, -2], [-2, -2, -2]], np.float32) / 16.0
_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13.0


@dataclass(frozen=True)
class GaussianBlur(_SameSpec):
    """Gaussian blur with a radius drawn uniformly from ``radius`` (PIL's ``GaussianBlur``
    meaning: the radius is the standard deviation); edges repeat the border pixels."""

    radius: float | tuple[float, float] = (0.5, 1.2)

    _builtin = True
    moves_geometry = False  # a filter leaves boxes, points and masks where they are

    def __post_init__(self) -> None:
        r = float_range(self.radius, "GaussianBlur", "radius", symmetric=False)
        if r[0] < 0:
            raise ValueError(f"GaussianBlur: radius must be >= 0, got {self.radius!r}")
        object.__setattr__(self, "radius", r)

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> float:
        """The radius (sigma) in pixels."""
        lo, hi = self.radius  # type: ignore[misc]
        return float(rng.uniform(lo, hi))

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "GaussianBlur")
        sigma = self.params(img.shape[:2], rng)
        if sigma <= 0:
            return img
        c = cv2()
        out = c.GaussianBlur(cv_input(img), (0, 0), sigmaX=sigma, borderType=c.BORDER_REPLICATE)
        return restore_channels(out, img)


def _filter3x3(img: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """PIL's 3×3 ``ImageFilter.Kernel``: the one-pixel frame is copied from the input."""
    c = cv2()
    src = cv_input(img)
    out = restore_channels(c.filter2D(src, -1, kernel, borderType=c.BORDER_REPLICATE), img)
    if img.shape[0] > 2 and img.shape[1] > 2:
        out[0] = img[0]
        out[-1] = img[-1]
        out[:, 0] = img[:, 0]
        out[:, -1] = img[:, -1]
    else:
        out[...] = img
    return out


class _Kernel(_SameSpec):
    """One of PIL's 3×3 filters (same kernel, same frame handling, within 1 LSB)."""

    _builtin = True
    moves_geometry = False  # a filter leaves boxes, points and masks where they are
    _kernel: ClassVar[np.ndarray]

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, type(self).__name__)
        return _filter3x3(img, self._kernel)


@dataclass(frozen=True)
class Sharpen(_Kernel):
    """PIL's ``ImageFilter.SHARPEN`` (same kernel, same frame handling, within 1 LSB)."""

    _kernel = _SHARPEN


@dataclass(frozen=True)
class Smooth(_Kernel):
    """PIL's ``ImageFilter.SMOOTH`` (same kernel, same frame handling, within 1 LSB)."""

    _kernel = _SMOOTH
