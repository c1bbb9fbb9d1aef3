"""The ops of the augmentation policies on uint8 images, through OpenCV, as PIL computes them
(``ImageOps``, ``ImageEnhance``, ``Image.transform``/``rotate``: what torchvision's PIL backend
and timm call). An op is a kernel ``kind`` and one ``value``: an enhance factor, bits kept, a
threshold, a shear factor, the content's displacement in pixels, an angle counter-clockwise.
Truncating PIL blends become OpenCV passes offset by just under half a level; PIL's
``equalize`` formula is kept (not ``cv2.equalizeHist``'s); geometric ops sample where PIL does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stoker.transforms._geom import warp
from stoker.transforms._util import border_value, cv2, cv_input, cv_interp, restore_channels
from stoker.transforms.filters import _SMOOTH, _filter3x3
from stoker.transforms.targets import Targets

__all__ = ["GEOMETRIC", "apply_op", "move_targets"]

GEOMETRIC = frozenset({"shear_x", "shear_y", "translate_x", "translate_y", "rotate"})
_BLENDS = frozenset({"brightness", "contrast", "color", "sharpness"})
_TRUNCATE = -0.499  # cv2 rounds to nearest; PIL's blend and autocontrast truncate
_L_WEIGHTS = np.array([19595, 38470, 7471]) / 65536  # PIL's convert('L')
_FIXED = 65536.0  # PIL's nearest affine runs in 16.16 fixed point


def _flat(img: np.ndarray) -> np.ndarray:
    """The image as one 2-D plane of its rows' values, for ops alike on every channel."""
    src = cv_input(img)
    return src.reshape(src.shape[0], -1)


def _linear(img: np.ndarray, gains: list[float], biases: list[float]) -> np.ndarray:
    """``gain · v + bias`` per channel (one gain: every channel), truncated, saturated."""
    c = cv2()
    if len(gains) == 1:
        m = np.array([[gains[0], biases[0] + _TRUNCATE]])
        return c.transform(_flat(img)[..., None], m).reshape(img.shape)
    n = len(gains)
    m = np.zeros((n, n + 1))
    m[range(n), range(n)] = gains
    m[:, n] = np.asarray(biases) + _TRUNCATE
    return restore_channels(c.transform(cv_input(img), m), img)


def _planes(img: np.ndarray) -> list[np.ndarray]:
    src = cv_input(img)
    return list(cv2().split(src)) if src.ndim == 3 else [src]


def _autocontrast(img: np.ndarray) -> np.ndarray:
    """``ImageOps.autocontrast`` (no cutoff): each channel's lowest to highest level stretched
    onto 0..255, ``int(i * scale + offset)``."""
    gains, biases = [], []
    for plane in _planes(img):
        lo, hi = cv2().minMaxLoc(plane)[:2]
        scale = 255.0 / (hi - lo) if hi > lo else 1.0
        gains.append(scale)
        biases.append(-lo * scale if hi > lo else 0.0)
    return _linear(img, gains, biases)


def _equalize_table(h: np.ndarray) -> np.ndarray:
    """``ImageOps.equalize`` of one channel: ``step`` is the count of every used level but the
    last over 255, and level ``i`` maps to ``(step // 2 + count below i) // step``."""
    counts = h.ravel().astype(np.int64)
    used = counts[counts > 0]
    step = (int(used.sum()) - int(used[-1])) // 255 if len(used) > 1 else 0
    if not step:
        return np.arange(256, dtype=np.uint8)
    below = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.minimum((step // 2 + below) // step, 255).astype(np.uint8)


def _equalize(img: np.ndarray) -> np.ndarray:
    c = cv2()
    out = []
    for p in _planes(img):
        out.append(c.LUT(p, _equalize_table(c.calcHist([p], [0], None, [256], [0, 256]))))
    return restore_channels(c.merge(out) if img.ndim == 3 else out[0], img)


def _blend(img: np.ndarray, kind: str, factor: float) -> np.ndarray:
    """PIL's ``ImageEnhance``: ``degenerate + factor · (img - degenerate)``, truncated."""
    c = cv2()
    src = cv_input(img)
    if kind == "brightness":  # with black
        return _linear(img, [factor], [0.0])
    if kind == "contrast":  # with the mean grey level (PIL's 'L' weights), rounded
        means = c.mean(src)
        gray = means[0] if src.ndim == 2 or img.shape[2] == 1 else np.dot(_L_WEIGHTS, means[:3])
        return _linear(img, [factor], [(1.0 - factor) * int(gray + 0.5)])
    if kind == "color":  # with the grey image; a grey image stays as it is
        if img.ndim == 2 or img.shape[2] != 3:
            return img
        other = c.cvtColor(c.cvtColor(src, c.COLOR_RGB2GRAY), c.COLOR_GRAY2RGB)
    else:  # sharpness: with the 3x3-smoothed image, its frame copied (ImageFilter.SMOOTH)
        other = cv_input(_filter3x3(img, _SMOOTH))
    out = c.addWeighted(src, float(factor), other, 1.0 - float(factor), _TRUNCATE)
    return restore_channels(out, img)


def _solarize(img: np.ndarray, kind: str, value: float) -> np.ndarray:
    """``solarize``: the levels at or above ``value`` inverted (XOR with a thresholded mask);
    ``solarize_add``: the levels below 128 raised by ``value``, at most to 255."""
    c = cv2()
    src = _flat(img)
    if kind == "solarize":
        mask = c.threshold(src, math.ceil(value) - 1, 255, c.THRESH_BINARY)[1]
        return c.bitwise_xor(src, mask).reshape(img.shape)
    mask = c.threshold(src, 127, 255, c.THRESH_BINARY_INV)[1]
    return c.add(src, int(value), dst=src.copy(), mask=mask).reshape(img.shape)


def pil_matrix(kind: str, value: float, hw: tuple[int, int]) -> tuple[float, ...]:
    """The 6 coefficients PIL's ``Image.transform(AFFINE, ...)`` (or ``Image.rotate``) takes
    for the op: output to input, continuous coordinates (pixel ``(r, c)`` covers ``[c, c+1)
    × [r, r+1)``)."""
    v = float(value)
    if kind == "shear_x":
        return (1.0, v, 0.0, 0.0, 1.0, 0.0)
    if kind == "shear_y":
        return (1.0, 0.0, 0.0, v, 1.0, 0.0)
    if kind == "translate_x":
        return (1.0, 0.0, -v, 0.0, 1.0, 0.0)
    if kind == "translate_y":
        return (1.0, 0.0, 0.0, 0.0, 1.0, -v)
    # rotate: counter-clockwise about the centre (w/2, h/2), cosine and sine to 15 places
    cy, cx = hw[0] / 2.0, hw[1] / 2.0
    a, b = round(math.cos(math.radians(-v)), 15), round(math.sin(math.radians(-v)), 15)
    return (a, b, cx - a * cx - b * cy, -b, a, cy + b * cx - a * cy)


def _sampling(m: tuple[float, ...], interpolation: str) -> np.ndarray:
    """``cv2.warpAffine``'s inverse map (pixel indices) that samples where PIL does. PIL takes
    each output pixel's centre ``(x + 0.5, y + 0.5)`` through the matrix; nearest runs in
    16.16 fixed point (each coefficient and the centre's offset rounded to 1/65536) and takes
    the pixel under the result (floor), where cv2 rounds the index half up: in indices, the
    same coefficients and the offset less half a pixel give PIL's pixels, ties included."""
    a, b, c, d, e, f = m
    x0, y0 = c + 0.5 * (a + b), f + 0.5 * (d + e)
    if interpolation == "nearest":

        def fix(t: float) -> float:
            return math.floor(t * _FIXED + 0.5) / _FIXED

        a, b, d, e, x0, y0 = fix(a), fix(b), fix(d), fix(e), fix(x0), fix(y0)
    return np.array([[a, b, x0 - 0.5], [d, e, y0 - 0.5]])


def _filtered(img: np.ndarray, m: np.ndarray, interpolation: str, fill: Any) -> np.ndarray:
    """PIL's filtered affine: ``fill`` where an output pixel's centre maps outside the image
    (a hard edge), elsewhere the filter over the image with its edge pixels repeated; cv2's
    constant border would blend the fill into the edge instead."""
    c = cv2()
    h, w = img.shape[:2]
    flags = c.WARP_INVERSE_MAP
    out = c.warpAffine(
        cv_input(img),
        m,
        (w, h),
        flags=cv_interp(interpolation) | flags,
        borderMode=c.BORDER_REPLICATE,
    )
    inside = c.warpAffine(np.full((h, w), 1, np.uint8), m, (w, h), flags=c.INTER_NEAREST | flags)
    out = restore_channels(out, img)
    out[inside == 0] = border_value(fill, img)[: 1 if img.ndim == 2 else img.shape[2]]
    return out


def _shift(img: np.ndarray, kind: str, d: int, fill: Any) -> np.ndarray:
    """A whole-pixel translation by ``d``: the kept part with a border of ``fill``."""
    h, w = img.shape[:2]
    along_x = kind == "translate_x"
    if abs(d) >= (w if along_x else h):  # nothing kept
        return warp(
            img, _sampling(pil_matrix(kind, d, (h, w)), "nearest"), "nearest", fill, inverse=True
        )
    kept = img[:, max(0, -d) : w - max(0, d)] if along_x else img[max(0, -d) : h - max(0, d)]
    pads = (0, 0, max(0, d), max(0, -d)) if along_x else (max(0, d), max(0, -d), 0, 0)
    c = cv2()
    out = c.copyMakeBorder(cv_input(kept), *pads, c.BORDER_CONSTANT, value=border_value(fill, img))
    return restore_channels(out, img)


def apply_op(
    img: np.ndarray, kind: str, value: float, *, interpolation: str, fill: Any
) -> np.ndarray:
    """Op ``kind`` at ``value`` on uint8 ``img`` (HW or HWC); a new array or ``img`` itself."""
    if kind == "identity":
        return img
    if kind in GEOMETRIC:
        if value == 0:
            return img
        if kind.startswith("translate") and float(value).is_integer():
            return _shift(img, kind, int(value), fill)
        m = _sampling(pil_matrix(kind, value, img.shape[:2]), interpolation)
        if interpolation == "nearest":
            return warp(img, m, interpolation, fill, inverse=True)
        return _filtered(img, m, interpolation, fill)
    if kind in _BLENDS:
        return img if value == 1 else _blend(img, kind, value)
    if kind == "posterize":  # keep the value's top bits
        bits = int(value)
        if bits >= 8:
            return img
        return cv2().bitwise_and(_flat(img), (0xFF << (8 - bits)) & 0xFF).reshape(img.shape)
    if kind == "invert":
        return cv2().bitwise_not(_flat(img)).reshape(img.shape)
    if kind == "auto_contrast":
        return _autocontrast(img)
    if kind == "equalize":
        return _equalize(img)
    return _solarize(img, kind, value)


def move_targets(targets: Targets, kind: str, value: float, hw: tuple[int, int]) -> None:
    """Move boxes, points and masks as geometric op ``kind`` at ``value`` moves the image
    (colour ops leave them alone)."""
    if kind not in GEOMETRIC or value == 0:
        return
    inverse = np.array(pil_matrix(kind, value, hw)).reshape(2, 3)
    targets.affine(cv2().invertAffineTransform(inverse), hw)
