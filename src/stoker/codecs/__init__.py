"""Layer 1: encoded image bytes -> uint8 HWC RGB arrays.

``decode(buf)`` sniffs the bytes and picks a backend:

- JPEG (``FF D8``): simplejpeg (libjpeg-turbo), with DCT scale-on-decode when ``min_size`` says
  a downscale follows; CMYK/YCCK JPEGs, which libjpeg-turbo cannot turn into RGB, go to Pillow;
- PNG, BMP, TIFF, WebP...: OpenCV (imported on first use), BGR turned into RGB;
- anything OpenCV cannot read: Pillow, the last resort.

The result always has 3 channels (grey is replicated, alpha dropped) and ignores EXIF
orientation (pixels come out in stored order, whichever backend decodes them). Every failure is
an :class:`~stoker._core.errors.ImageDecodeError` that names the cause.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import ImageDecodeError
from stoker._core.specs import ArraySpec

__all__ = ["DECODED_SPEC", "MinSize", "decode", "image_size", "sniff"]

#: What ``decode`` returns: any height and width, 3 channels, uint8.
DECODED_SPEC = ArraySpec((None, None, 3), "uint8")

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: ``min_size`` for :func:`decode`: a size, or a function of the stored (h, w) giving one.
MinSize = tuple[int, int] | Callable[[tuple[int, int]], tuple[int, int] | None] | None


def sniff(buf: Any) -> str:
    """``"jpeg"``, ``"png"`` or ``"other"`` from the first bytes."""
    head = bytes(memoryview(buf)[:8])
    if head[:2] == b"\xff\xd8":
        return "jpeg"
    if head == _PNG_MAGIC:
        return "png"
    return "other"


def _as_bytes_view(buf: Any) -> memoryview:
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"decode needs a bytes-like object, got {type(buf).__name__}") from None
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


def decode(
    buf: Any,
    *,
    out: np.ndarray | None = None,
    min_size: MinSize = None,
    fast: bool = False,
) -> np.ndarray:
    """Decode ``buf`` (bytes, bytearray, memoryview, uint8 array) to a uint8 (H, W, 3) RGB array.

    ``min_size=(h, w)``: a JPEG may be decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT
    scaling; much cheaper; other scales are slower than a full decode and are not used) as
    long as the result is still at least ``h`` x ``w``; use it when a resize to that size
    follows; or a function of the stored ``(h, w)`` returning such a size or ``None`` (a
    transform chain's ``decode_hint``), called with the size from the header this function
    reads anyway. ``fast=True`` trades a little accuracy for speed (fast DCT and
    upsampling). ``out``: a C-contiguous uint8 array of exactly the decoded shape to write into.
    """
    mv = _as_bytes_view(buf)
    if len(mv) == 0:
        raise ImageDecodeError("empty buffer: 0 bytes is not an image")
    if min_size is not None and not callable(min_size):
        min_size = _check_min_size(min_size)
    if out is not None and (
        not isinstance(out, np.ndarray) or out.dtype != np.uint8 or not out.flags.c_contiguous
    ):
        raise TypeError("out must be a C-contiguous uint8 numpy array")
    kind = sniff(mv)
    img: np.ndarray | None = None
    jpeg_error: Exception | None = None
    if kind == "jpeg":
        try:
            img = _decode_jpeg(mv, out=out, min_size=min_size, fast=fast)
            if out is not None and img is out:
                return out
        except _NotRGBJpeg:
            img = None  # CMYK/YCCK: Pillow converts these
        except _CallerError as e:
            raise e.error from None
        except ValueError as e:
            jpeg_error = e
    if img is None and kind != "jpeg":
        img = _decode_cv2(mv)
    if img is None:
        try:
            img = _decode_pillow(mv)
        except ImageDecodeError as e:
            if jpeg_error is not None:
                raise ImageDecodeError(
                    f"corrupt JPEG ({len(mv)} bytes): {jpeg_error}"
                ) from jpeg_error
            raise e
    if out is not None:
        if out.shape != img.shape:
            raise ValueError(f"out has shape {out.shape}, the decoded image is {img.shape}")
        np.copyto(out, img)
        return out
    return img


def _check_min_size(min_size: Any) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in min_size)
    except (TypeError, ValueError):
        raise TypeError(f"min_size must be (height, width), got {min_size!r}") from None
    if h < 0 or w < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size!r}")
    return h, w


class _NotRGBJpeg(Exception):
    pass


class _CallerError(Exception):
    """An error raised by a ``min_size`` function: re-raised as it is, never a decode failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _decode_jpeg(
    mv: memoryview,
    *,
    out: np.ndarray | None,
    min_size: MinSize,
    fast: bool,
) -> np.ndarray:
    import simplejpeg

    h, w, colorspace, _ = simplejpeg.decode_jpeg_header(mv)
    if colorspace in ("CMYK", "YCCK"):
        raise _NotRGBJpeg(colorspace)
    if callable(min_size):
        try:
            wanted = min_size((int(h), int(w)))
            min_size = None if wanted is None else _check_min_size(wanted)
        except Exception as e:  # noqa: BLE001 - the caller's error, not a decode failure
            raise _CallerError(e) from e
    min_h = min_w = 0  # 0: full size
    if min_size is not None:
        # Only 1/2, 1/4 and 1/8 are fast in libjpeg-turbo; 3/4, 5/8... are slower than a full
        # decode. Take the smallest of them that still covers min_size.
        for k in (8, 4, 2):
            sh, sw = -(-h // k), -(-w // k)
            if sh >= min_size[0] and sw >= min_size[1]:
                h, w, min_h, min_w = sh, sw, sh, sw
                break
    buffer = None
    if out is not None and out.shape == (h, w, 3):
        buffer = out
    img = simplejpeg.decode_jpeg(
        mv,
        colorspace="RGB",
        fastdct=fast,
        fastupsample=fast,
        min_height=min_h,
        min_width=min_w,
        buffer=buffer,
    )
    if buffer is not None:
        return buffer
    return np.asarray(img)


def _decode_cv2(mv: memoryview) -> np.ndarray | None:
    import cv2

    arr = np.frombuffer(mv, dtype=np.uint8)
    img = cv2.imdecode(arr, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if img is None or img.ndim != 3 or img.shape[2] != 3:
        return None
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _decode_pillow(mv: memoryview) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(mv)) as im:
            im.load()
            if im.mode not in ("RGB", "L"):
                if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                    arr = np.asarray(im, dtype=np.float64)
                    peak = 65535.0 if im.mode.startswith("I;16") else max(float(arr.max()), 1.0)
                    im2 = Image.fromarray(
                        np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8)
                    )
                    return np.ascontiguousarray(np.repeat(np.asarray(im2)[:, :, None], 3, axis=2))
                arr = np.asarray(im.convert("RGB"))
            else:
                arr = np.asarray(im)
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad input
        kind = sniff(mv)
        what = {"jpeg": "JPEG", "png": "PNG"}.get(kind, "image (unrecognised format)")
        head = bytes(mv[:8]).hex(" ")
        raise ImageDecodeError(
            f"cannot decode {what}, {len(mv)} bytes starting {head}: {type(e).__name__}: {e}"
        ) from e
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    return np.ascontiguousarray(arr)


def image_size(buf: Any) -> tuple[int, int]:
    """(height, width) read from the header alone (JPEG, PNG; Pillow for the rest)."""
    mv = _as_bytes_view(buf)
    kind = sniff(mv)
    if kind == "jpeg":
        import simplejpeg

        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(mv)
            return int(h), int(w)
        except ValueError:
            pass  # fall through to Pillow, which may know better
    elif kind == "png" and len(mv) >= 24 and bytes(mv[12:16]) == b"IHDR":
        w, h = struct.unpack(">II", bytes(mv[16:24]))
        return int(h), int(w)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(mv)) as im:
            w, h = im.size
    except Exception as e:  # noqa: BLE001
        raise ImageDecodeError(
            f"cannot read the image size from {len(mv)} bytes: {type(e).__name__}: {e}"
        ) from e
    return int(h), int(w)
