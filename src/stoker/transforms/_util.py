"""Shared pieces of the ops: lazy cv2, argument checks, spec arithmetic."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec

_CV2: Any = None

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "area", "lanczos", "auto")


def cv2() -> Any:
    """Import OpenCV on first use, so that ``import stoker.transforms`` does not."""
    global _CV2
    if _CV2 is None:
        import cv2 as _m

        _CV2 = _m
    return _CV2


_INTERP_FLAGS: dict[str, int] = {}


def cv_interp(name: str) -> int:
    """The cv2 flag for an interpolation name (``"auto"`` is resolved by the resize itself)."""
    flags = _INTERP_FLAGS
    if not flags:
        m = cv2()
        flags.update(
            nearest=m.INTER_NEAREST,
            bilinear=m.INTER_LINEAR,
            bicubic=m.INTER_CUBIC,
            area=m.INTER_AREA,
            lanczos=m.INTER_LANCZOS4,
        )
    return flags[name]


def check_interp(name: str, owner: str) -> None:
    if name not in INTERPOLATIONS:
        raise ValueError(f"{owner}: interpolation must be one of {INTERPOLATIONS}, got {name!r}")


def size_pair(size: int | Sequence[int], owner: str) -> tuple[int, int]:
    """``128`` -> ``(128, 128)``; ``(h, w)`` -> ``(h, w)``; both must be positive ints."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    else:
        try:
            h, w = size  # type: ignore[misc]
        except (TypeError, ValueError):
            raise TypeError(
                f"{owner}: size must be an int or an (h, w) pair, got {size!r}"
            ) from None
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (h, w)):
            raise TypeError(f"{owner}: size must hold ints, got {size!r}")
        pair = (int(h), int(w))
    if min(pair) <= 0:
        raise ValueError(f"{owner}: size must be positive, got {size!r}")
    return pair


def float_range(
    value: float | Sequence[float], owner: str, what: str, *, symmetric: bool = True
) -> tuple[float, float]:
    """``d`` -> ``(-d, d)`` (or ``(d, d)`` when not symmetric); ``(lo, hi)`` kept, checked."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        v = float(value)
        if symmetric:
            if v < 0:
                raise ValueError(f"{owner}: {what} must be >= 0 when given as one number, got {v}")
            return (-v, v)
        return (v, v)
    try:
        lo, hi = value  # type: ignore[misc]
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        raise TypeError(
            f"{owner}: {what} must be a number or a (low, high) pair, got {value!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(
            f"{owner}: {what} must be a finite (low, high) pair with low <= high, got {value!r}"
        )
    return (lo, hi)


def image_spec_dims(in_spec: ArraySpec, owner: str) -> tuple[int | None, int | None, int | None]:
    """(H, W, C) of an HW or HWC spec; C is ``None`` for HW. Raises SpecError otherwise."""
    if not isinstance(in_spec, ArraySpec):
        raise TypeError(f"{owner}.output_spec: expected an ArraySpec, got {type(in_spec).__name__}")
    if len(in_spec.shape) == 2:
        h, w = in_spec.shape
        return h, w, None
    if len(in_spec.shape) == 3:
        h, w, c = in_spec.shape
        return h, w, c
    raise SpecError(f"{owner}: expects an HW or HWC image, got {in_spec.describe()}")


def with_hw(in_spec: ArraySpec, h: int | None, w: int | None) -> ArraySpec:
    """``in_spec`` with its two leading dimensions replaced (channels, rank and dtype kept)."""
    return ArraySpec((h, w, *in_spec.shape[2:]), in_spec.dtype)


def check_image(img: np.ndarray, owner: str) -> None:
    if not isinstance(img, np.ndarray):
        raise TypeError(f"{owner}: expects a NumPy array, got {type(img).__name__}")
    if img.ndim not in (2, 3):
        raise ValueError(f"{owner}: expects an HW or HWC image, got shape {img.shape}")


def restore_channels(out: np.ndarray, like: np.ndarray) -> np.ndarray:
    """OpenCV drops a trailing channel axis of 1; put it back so HWC stays HWC."""
    if like.ndim == 3 and out.ndim == 2:
        return out[:, :, None]
    return out


def cv_input(img: np.ndarray) -> np.ndarray:
    """An array OpenCV accepts: positive strides with contiguous pixels (views of crops are fine)."""
    if img.flags.c_contiguous:
        return img
    st = img.strides
    packed = st[-1] == img.itemsize and (img.ndim == 2 or st[1] == img.itemsize * img.shape[2])
    if not packed or st[0] < 0:
        return np.ascontiguousarray(img)
    return img


def border_value(fill: float | Sequence[float], img: np.ndarray) -> tuple[float, ...]:
    if isinstance(fill, (int, float, np.integer, np.floating)):
        return (float(fill),) * 4
    vals = tuple(float(v) for v in fill)
    channels = img.shape[2] if img.ndim == 3 else 1
    if len(vals) != channels:
        raise ValueError(f"fill has {len(vals)} values for an image with {channels} channels")
    return vals + (0.0,) * (4 - len(vals))


def check_fill(fill: Any, owner: str) -> float | tuple[float, ...]:
    if isinstance(fill, (int, float, np.integer, np.floating)) and not isinstance(fill, bool):
        return float(fill) if isinstance(fill, (float, np.floating)) else int(fill)
    try:
        vals = tuple(float(v) for v in fill)
    except TypeError:
        raise TypeError(
            f"{owner}: fill must be a number or a per-channel sequence, got {fill!r}"
        ) from None
    if not 1 <= len(vals) <= 4:
        raise ValueError(f"{owner}: fill must have 1 to 4 values, got {fill!r}")
    return vals


_T = TypeVar("_T")
_SCRATCH = threading.local()


def scratch(kind: str, key: Hashable, make: Callable[..., _T], *args: Any) -> _T:
    """A buffer reused between calls: one per thread, ``kind`` and ``key`` (a shape, say),
    made by ``make(*args)`` on first use. At most 8 keys are kept per kind (all dropped when
    a ninth comes), so a stream of varying sizes cannot grow them without bound. The caller
    must be done with it before the next call of the same kind on its thread."""
    cache: dict[Hashable, Any] | None = getattr(_SCRATCH, kind, None)
    if cache is None:
        cache = {}
        setattr(_SCRATCH, kind, cache)
    buf = cache.get(key)
    if buf is None:
        if len(cache) >= 8:
            cache.clear()
        buf = cache[key] = make(*args)
    return buf
