"""Pieces shared by the geometric ops: resizes and warps of images and masks, the forward
matrices their targets move by, and the checks they share.

Matrices here are forward 2x3 in continuous pixel coordinates (pixel ``(r, c)`` covers
``[c, c+1) x [r, r+1)``), the convention of :class:`~stoker.transforms.targets.Targets`.
"""

from __future__ import annotations

import numpy as np

from stoker._core.errors import SpecError
from stoker.transforms._util import (
    border_value,
    check_image,
    check_interp,
    cv2,
    cv_input,
    cv_interp,
    restore_channels,
)
from stoker.transforms.targets import Targets


def resize(img: np.ndarray, h: int, w: int, interpolation: str) -> np.ndarray:
    src_h, src_w = img.shape[0], img.shape[1]
    if src_h == h and src_w == w:
        return img
    if interpolation == "auto":
        # Area averaging costs 4x bilinear at non-integer factors; below 2x bilinear already
        # reads every input pixel (its two taps per output pixel are < 2 pixels apart).
        interpolation = "area" if src_h >= 2 * h or src_w >= 2 * w else "bilinear"
    c = cv2()
    # cv2's INTER_NEAREST resize samples input pixel floor(j * scale), drifting up to half an
    # input pixel from where the image's content lands (and where boxes and masks go);
    # INTER_NEAREST_EXACT samples at pixel centres, as PIL's nearest does.
    flag = c.INTER_NEAREST_EXACT if interpolation == "nearest" else cv_interp(interpolation)
    out = c.resize(cv_input(img), (w, h), interpolation=flag)
    return restore_channels(out, img)


def resize_masks(targets: Targets, h: int, w: int) -> None:
    """Masks to ``(h, w)`` by nearest neighbour at pixel centres (cv2's half-pixel
    ``INTER_NEAREST_EXACT``, the convention ``cv2.resize`` uses for the image)."""
    c = cv2()
    for name, mask in targets.masks.items():
        if mask.shape[:2] != (h, w):
            targets.masks[name] = c.resize(
                cv_input(mask), (w, h), interpolation=c.INTER_NEAREST_EXACT
            )


def slice_masks(targets: Targets, top: int, left: int, h: int, w: int) -> None:
    """Crop every mask: the same pixels a nearest-neighbour warp would give, for less."""
    for name, mask in targets.masks.items():
        targets.masks[name] = mask[top : top + h, left : left + w]


def scale_matrix(sx: float, sy: float, tx: float = 0.0, ty: float = 0.0) -> np.ndarray:
    """``x' = sx * x + tx``, ``y' = sy * y + ty``: resizes, crops and pastes."""
    return np.array([[sx, 0.0, tx], [0.0, sy, ty]], dtype=np.float64)


def check_frame(img: np.ndarray, targets: Targets, owner: str) -> None:
    """``img`` must be an HW or HWC array (``check_image``) and the targets in its frame, or
    every move would land them wrong."""
    check_image(img, owner)
    if targets.hw != img.shape[:2]:
        raise ValueError(
            f"{owner}: the boxes, points and masks are in a {targets.hw[0]}x{targets.hw[1]} frame "
            f"but the image is {img.shape[0]}x{img.shape[1]}"
        )


def too_small(owner: str, what: str, need: tuple[int, int], got: tuple[int, int]) -> SpecError:
    return SpecError(
        f"{owner}: input {got[0]}x{got[1]} (HxW) is smaller than the {what} {need[0]}x{need[1]}; "
        "put a Resize before it"
    )


def warp(
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


def check_affine_interp(interpolation: str, owner: str) -> None:
    check_interp(interpolation, owner)
    if interpolation in ("area", "lanczos", "auto"):
        raise ValueError(f"{owner}: interpolation must be nearest, bilinear or bicubic")
