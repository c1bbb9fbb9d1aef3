"""Colour ops: ColorJitter (brightness, contrast, saturation), Grayscale, Normalize."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.transforms._util import (
    check_image,
    cv2,
    cv_input,
    image_spec_dims,
    restore_channels,
    scratch,
)
from stoker.transforms.base import Transform, _SameSpec

__all__ = [
    "ColorJitter",
    "Grayscale",
    "Normalize",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_saturation",
]


def _channels(img: np.ndarray) -> int:
    return 1 if img.ndim == 2 else img.shape[2]


def _gray(img: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma (PIL's ``convert('L')`` weights), HW uint8."""
    if _channels(img) == 1:
        return img.reshape(img.shape[:2])
    return cv2().cvtColor(cv_input(img), cv2().COLOR_RGB2GRAY)


def adjust_brightness(img: np.ndarray, factor: float) -> np.ndarray:
    """``img · factor``, rounded and clipped (PIL ``ImageEnhance.Brightness``)."""
    out = cv2().convertScaleAbs(cv_input(img), alpha=float(factor), beta=0.0)
    return restore_channels(out, img)


def adjust_contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """Blend with the mean grey level (PIL ``ImageEnhance.Contrast``)."""
    mean = int(float(_gray(img).mean()) + 0.5)
    src = cv_input(img)
    out = cv2().addWeighted(src, float(factor), src, 0.0, (1.0 - float(factor)) * mean)
    return restore_channels(out, img)


def adjust_saturation(img: np.ndarray, factor: float) -> np.ndarray:
    """Blend with the greyscale image (PIL ``ImageEnhance.Color``); grey images are unchanged."""
    if _channels(img) != 3:
        return img
    c = cv2()
    src = cv_input(img)
    gray = c.cvtColor(c.cvtColor(src, c.COLOR_RGB2GRAY), c.COLOR_GRAY2RGB)
    return c.addWeighted(src, float(factor), gray, 1.0 - float(factor), 0.0)


def _factor_range(v: float | Sequence[float], what: str) -> tuple[float, float]:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        if v < 0:
            raise ValueError(f"ColorJitter: {what} must be >= 0, got {v!r}")
        return (max(0.0, 1.0 - float(v)), 1.0 + float(v))
    try:
        lo, hi = (float(x) for x in v)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise TypeError(f"ColorJitter: {what} must be a number or a (low, high) pair") from None
    if not 0 <= lo <= hi:
        raise ValueError(f"ColorJitter: {what} must be a pair 0 <= low <= high, got {v!r}")
    return (lo, hi)


_ADJUST = (adjust_brightness, adjust_contrast, adjust_saturation)


@dataclass(frozen=True)
class ColorJitter(_SameSpec):
    """torchvision's ColorJitter without hue: each of ``brightness``, ``contrast``,
    ``saturation`` is a number ``b`` (factor uniform in ``[max(0, 1-b), 1+b]``) or a
    ``(low, high)`` factor range; the enabled adjustments run in a random order.
    uint8 in, uint8 out; saturation leaves grey images alone."""

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0

    _builtin = True
    moves_geometry = False  # a colour op leaves boxes, points and masks where they are
    _uint8 = True

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _factor_range(getattr(self, name), name))

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> list[tuple[int, float]]:
        """[(which, factor), ...] in the order applied; 0 brightness, 1 contrast, 2 saturation."""
        ranges = (self.brightness, self.contrast, self.saturation)
        out = []
        for i in rng.permutation(3):
            lo, hi = ranges[i]  # type: ignore[misc]
            if (lo, hi) != (1.0, 1.0):
                out.append((int(i), float(rng.uniform(lo, hi))))
        return out

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self._check_input(img)
        for which, factor in self.params(img.shape[:2], rng):
            img = _ADJUST[which](img, factor)
        return img


@dataclass(frozen=True)
class Grayscale(Transform):
    """RGB to grey (PIL ``convert('L')`` weights), returned with ``channels`` (1 or 3) equal
    channels; an HW input stays HW when ``channels=1``."""

    channels: int = 3

    _builtin = True
    moves_geometry = False  # a colour op leaves boxes, points and masks where they are

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"Grayscale: channels must be 1 or 3, got {self.channels!r}")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "Grayscale")
        if _channels(img) not in (1, 3):
            raise ValueError(f"Grayscale: expects 1 or 3 channels, got shape {img.shape}")
        g = _gray(img)
        if self.channels == 3:
            return cv2().cvtColor(np.ascontiguousarray(g), cv2().COLOR_GRAY2RGB)
        return g if img.ndim == 2 else g[:, :, None]

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, c = image_spec_dims(in_spec, "Grayscale")
        if c is not None and c not in (1, 3):
            raise SpecError(f"Grayscale: expects 1 or 3 channels, got {in_spec.describe()}")
        if c is None and self.channels == 1 and len(in_spec.shape) == 2:
            return in_spec
        return ArraySpec((h, w, self.channels), in_spec.dtype)


def _scratch_planes(h: int, w: int, c: int) -> list[np.ndarray]:
    """Reused uint8 planes for ``cv2.split`` (one set per thread and size): a fresh list of
    arrays per call costs a third of a 112×112 Normalize."""
    return scratch("planes", (h, w, c), _skewed_planes, h, w, c)


_SKEW = 4  # bytes between the planes' offsets from a 64-byte boundary


def _skewed_planes(h: int, w: int, c: int) -> list[np.ndarray]:
    """``c`` uint8 ``(h, w)`` planes whose first bytes lie at different offsets from a 64-byte
    boundary (4, 8, 12, ... bytes past one).

    ``cv2.split`` writes the rows of planes that share their offset modulo its vector size
    with a much slower kind of store. Separate ``np.empty`` planes share it or not by the
    luck of the heap, which would make ``Normalize``'s cost differ from one process to the
    next; one buffer with the planes placed on purpose takes the luck out. Row ``r`` of every
    plane moves all of them by the same ``r * w`` bytes, so their rows never line up either.
    The measured cost of each case is in docs/transforms.md."""
    stride = -(-h * w // 64) * 64 + 64
    buf = np.empty(c * stride + 64, np.uint8)
    base = -buf.ctypes.data % 64
    out = []
    for k in range(c):
        start = base + k * stride + _SKEW * (k + 1)
        out.append(buf[start : start + h * w].reshape(h, w))
    return out


def _affine_into(cv: Any, src: np.ndarray, gain: float, bias: float, dest: np.ndarray) -> None:
    """``src * gain + bias`` for a 2-D uint8 ``src``, written into float32 ``dest`` of its
    shape in one vectorised pass (``cv2.addWeighted`` with ``src`` once weighted 0): each
    value rounded once from the exact product and sum, as a fused multiply-add gives it."""
    out = cv.addWeighted(src, gain, src, 0.0, bias, dst=dest, dtype=cv.CV_32F)
    if out is not dest:
        np.copyto(dest, out.reshape(dest.shape), casting="no")


def _per_channel(v: float | Sequence[float], what: str) -> tuple[float, ...]:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return (float(v),)
    vals = tuple(float(x) for x in v)  # type: ignore[union-attr]
    if not vals:
        raise ValueError(f"Normalize: {what} must not be empty")
    return vals


@dataclass(frozen=True)
class Normalize(Transform):
    """``(img / scale - mean) / std`` as float32 (or ``dtype``), per channel, in ``layout``
    ``"HWC"`` or ``"CHW"``: the seed-000 ``(x/255 - 0.5)/0.5`` for users who normalise on the
    CPU. (On a GPU, keep uint8 batches and normalise there: 4× less to copy.)

    ``mean``/``std``: one number for all channels or one per channel. uint8 input becomes
    ``x * gain + bias`` per channel (``gain = 1 / (scale * std)`` rounded to float32 toward
    zero, ``bias = -mean / std`` in float32), each value rounded once, in one vectorised OpenCV
    pass per plane (``write``); other dtypes go through float arithmetic.
    """

    mean: float | tuple[float, ...] = 0.5
    std: float | tuple[float, ...] = 0.5
    _: KW_ONLY
    scale: float = 255.0
    layout: str = "HWC"
    dtype: str = "float32"
    _gain: tuple[float, ...] = field(init=False, repr=False, compare=False, hash=False)
    _bias: tuple[float, ...] = field(init=False, repr=False, compare=False, hash=False)
    _matrix: np.ndarray = field(init=False, repr=False, compare=False, hash=False)

    _builtin = True
    moves_geometry = False  # a colour op leaves boxes, points and masks where they are

    def __post_init__(self) -> None:
        mean = _per_channel(self.mean, "mean")
        std = _per_channel(self.std, "std")
        if any(s == 0 for s in std):
            raise ValueError(f"Normalize: std must not contain 0, got {self.std!r}")
        if len(mean) != len(std) and 1 not in (len(mean), len(std)):
            raise ValueError(f"Normalize: mean has {len(mean)} values, std {len(std)}")
        if self.layout not in ("HWC", "CHW"):
            raise ValueError(f"Normalize: layout must be 'HWC' or 'CHW', got {self.layout!r}")
        if float(self.scale) <= 0:
            raise ValueError(f"Normalize: scale must be > 0, got {self.scale!r}")
        if float(self.scale) == 255.0 and any(abs(v) > 1.0 for v in (*mean, *std)):
            raise ValueError(
                f"Normalize: mean={self.mean!r}, std={self.std!r} look like pixel units; they are "
                "in 0-1 units, (img / scale - mean) / std with scale=255 (ImageNet: "
                "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)); divide them by 255, or "
                "pass scale=1 to give them in pixel units"
            )
        dt = np.dtype(self.dtype)
        if dt.kind != "f":
            raise ValueError(f"Normalize: dtype must be a float type, got {self.dtype!r}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "dtype", dt.name)
        n = max(len(mean), len(std))
        m = np.broadcast_to(np.asarray(mean, np.float64), (n,))
        s = np.broadcast_to(np.asarray(std, np.float64), (n,))
        exact = 1.0 / (float(self.scale) * s)
        gain = exact.astype(np.float32)
        # rounded toward zero: the brightest level never lands past the formula's own range
        # (255 * float32(1 / 127.5) - 1 would be 1.0000001, not 1)
        over = np.abs(gain.astype(np.float64)) > np.abs(exact)
        gain[over] = np.nextafter(gain[over], np.float32(0))
        bias = (-m / s).astype(np.float32)
        object.__setattr__(self, "_gain", tuple(float(g) for g in gain))
        object.__setattr__(self, "_bias", tuple(float(b) for b in bias))
        # cv2.transform's per-pixel matrix for HWC: a diagonal of gains, the biases last
        matrix = np.zeros((n, n + 1), np.float32)
        matrix[np.arange(n), np.arange(n)] = gain
        matrix[:, n] = bias
        object.__setattr__(self, "_matrix", matrix)

    @property
    def channels(self) -> int:
        """Channels the statistics are given for (1: the same for every channel)."""
        return len(self._gain)

    def _check_channels(self, c: int, where: str) -> None:
        if self.channels != 1 and c != self.channels:
            raise SpecError(
                f"Normalize: mean/std have {self.channels} values, {where} has {c} channels"
            )

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        check_image(img, "Normalize")
        c = _channels(img)
        self._check_channels(c, f"image {img.shape}")
        h, w = img.shape[:2]
        chw = self.layout == "CHW"
        out: np.ndarray
        if img.dtype == np.uint8:
            if chw:
                out = np.empty((c, h, w), np.float32)
            else:
                out = np.empty(img.shape, np.float32)
            self.write(img, out, chw=chw)
        else:
            m = np.asarray(self.mean, np.float32)
            s = np.asarray(self.std, np.float32)
            x = img.astype(np.float32) / np.float32(self.scale)
            out = (x.reshape(h, w, c) - m) / s
            if chw:
                out = np.ascontiguousarray(out.transpose(2, 0, 1))
            elif img.ndim == 2:
                out = out.reshape(h, w)
        if out.dtype != np.dtype(self.dtype):
            out = out.astype(self.dtype)
        return out

    def write(self, img: np.ndarray, dest: np.ndarray, *, chw: bool) -> None:
        """Normalise uint8 ``img`` (HW or HWC) into float32 ``dest``: ``(C, H, W)`` planes when
        ``chw``, else the image's own shape, straight into place (the loader hands a batch row
        here, so no intermediate float array is made). CHW: the image is split into uint8
        scratch planes, then each plane is converted, scaled and shifted in one
        ``cv2.addWeighted`` pass into its plane of ``dest``; HWC: the values are converted
        into ``dest``, then scaled and shifted there in one ``cv2.transform`` pass. Both give
        ``x * gain + bias`` rounded once, so the result is the same bits whichever layout, and
        the same as calling the op."""
        if img.dtype != np.uint8 or dest.dtype != np.float32:
            raise TypeError(
                f"Normalize.write: needs uint8 in and float32 out, got {img.dtype}, {dest.dtype}"
            )
        if not dest.flags.c_contiguous:
            tmp = np.empty(dest.shape, np.float32)
            self.write(img, tmp, chw=chw)
            np.copyto(dest, tmp, casting="no")
            return
        c = _channels(img)
        h, w = img.shape[:2]
        cv = cv2()
        src = cv_input(img)
        gain, bias = self._gain, self._bias
        if chw:
            if dest.shape != (c, h, w):
                raise ValueError(f"Normalize.write: dest {dest.shape} for CHW of {img.shape}")
            if c == 1:
                _affine_into(cv, src.reshape(h, w), gain[0], bias[0], dest[0])
                return
            self.planes_writer(c)(src, dest)
            return
        if dest.shape != img.shape:
            raise ValueError(f"Normalize.write: dest {dest.shape} for HWC of {img.shape}")
        if c == 1 or self.channels == 1:  # one gain and bias for every value: one plane
            _affine_into(cv, src.reshape(h, -1), gain[0], bias[0], dest.reshape(h, -1))
            return
        flat = dest.reshape(h, w, c)
        np.copyto(flat, src.reshape(h, w, c), casting="unsafe")  # exact: uint8 fits float32
        if c <= 4:  # what cv2.transform takes
            out = cv.transform(flat, self._matrix, dst=flat)
            if out is not flat:
                np.copyto(flat, out.reshape(flat.shape), casting="no")
            return
        # more channels than OpenCV's transform takes: the same once-rounded values by way
        # of float64, where the product and the sum are exact
        exact = flat * np.asarray(gain, np.float64) + np.asarray(bias, np.float64)
        np.copyto(flat, exact, casting="same_kind")

    def planes_writer(self, c: int) -> Callable[[np.ndarray, np.ndarray], None]:
        """``f(img, dest)``: :meth:`write` of a uint8 ``(H, W, c)`` image (``c`` > 1, pixels
        packed, rows at any stride: a crop's view will do) into a C-contiguous float32
        ``(c, H, W)`` ``dest``, checked by the caller: one ``cv2.split`` into this thread's
        scratch planes, then one ``cv2.addWeighted`` per plane into ``dest``, with the gains,
        biases and OpenCV's functions looked up once (a loader's row writer makes one per
        process).

        Each ``cv2.addWeighted`` takes the uint8 plane as it is and writes the float plane
        once: it converts its input in cache-sized blocks itself. Converting the plane into
        ``dest`` first and running ``cv2.addWeighted`` there in place gives the same bits (for
        any plane of a multiple of 64 values, where OpenCV's vector code covers it whole) but
        writes each float plane twice and reads it once: 26-33 against 36-45 µs per 112-px
        image on rows out of cache, 92-99 against 118-129 at 224 px (docs/transforms.md).
        """
        self._check_channels(c, f"an image of {c} channels")
        cv = cv2()
        split, weighted, f32, copyto = cv.split, cv.addWeighted, cv.CV_32F, np.copyto
        one = self.channels == 1
        coefs = [(self._gain[0 if one else k], self._bias[0 if one else k]) for k in range(c)]

        def write(img: np.ndarray, dest: np.ndarray) -> None:
            h, w = img.shape[0], img.shape[1]
            planes = _scratch_planes(h, w, c)
            split(img, planes)
            for plane, (g, b), row in zip(planes, coefs, dest):
                out = weighted(plane, g, plane, 0.0, b, dst=row, dtype=f32)
                if out is not row:  # OpenCV made an array of its own
                    copyto(row, out.reshape(row.shape), casting="no")

        return write

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        h, w, c = image_spec_dims(in_spec, "Normalize")
        if c is not None:
            self._check_channels(c, f"input {in_spec.describe()}")
        if self.layout == "CHW":
            return ArraySpec((1 if len(in_spec.shape) == 2 else c, h, w), self.dtype)
        return ArraySpec(in_spec.shape, self.dtype)
