"""Layer 1: encoded image bytes -> uint8 HWC RGB arrays.

``decode(buf)`` sniffs the bytes and picks a backend:

- JPEG (``FF D8``): simplejpeg (libjpeg-turbo), with DCT scale-on-decode when ``min_size`` says
  a downscale follows; CMYK/YCCK JPEGs, which libjpeg-turbo cannot turn into RGB, go to Pillow;
- PNG, BMP, TIFF, WebP...: OpenCV (imported on first use), BGR turned into RGB;
- anything OpenCV cannot read: Pillow, the last resort.

The result always has 3 channels (grey is replicated, alpha dropped) and ignores EXIF
orientation (pixels come out in stored order, whichever backend decodes them). Every failure is
an :class:`~stoker._core.errors.ImageDecodeError` that names the cause.

``decode_mask(buf)`` reads a PNG label map (a segmentation mask) as its stored values: one
channel, the palette indices of a palette PNG (not its colours), the values of a grey one.

Decompression bombs: before any pixel is decoded, the size the image's own header declares is
checked against ``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS`, Pillow's limit, the one
``stoker pack`` applies); over it, :class:`~stoker._core.errors.ImageTooLargeError`. The header
is the JPEG one simplejpeg reads anyway, the PNG IHDR, or Pillow's ``Image.open`` (header only)
for the rest; an image whose header Pillow cannot read is checked on its decoded size instead.
The hot-loop :func:`decoder` finds a common JPEG's frame header by walking the segments before
it, as libjpeg-turbo does (anything unusual goes to simplejpeg's header read).
"""

from __future__ import annotations

import collections
import importlib
import io
import itertools
import re
import struct
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import ImageDecodeError, ImageTooLargeError, without_reprs
from stoker._core.specs import ArraySpec
from stoker.codecs.headers import bmp_size, radiance_size, riff_webp_size, tiff_size
from stoker.codecs.jpeg import jpeg_frame
from stoker.codecs.png import PNG_MAGIC as _PNG_MAGIC
from stoker.codecs.png import encode_png

try:  # the region decoder (a C extension), where it was built: it needs libjpeg-turbo's headers
    REGION = importlib.import_module("stoker.codecs._region").region
except ImportError:  # pragma: no cover - a build without it decodes whole images
    REGION = None

__all__ = [
    "DECODED_SPEC",
    "DEFAULT_MAX_PIXELS",
    "REGION",
    "JpegImage",
    "MinSize",
    "check_max_pixels",
    "decode",
    "decode_mask",
    "decoder",
    "encode_png",
    "image_size",
    "sniff",
    "sniff_counts",
]

#: ``decode``'s default header pixel limit: Pillow's own decompression-bomb limit, the one
#: ``stoker pack`` applies (about 9459 x 9459).
DEFAULT_MAX_PIXELS = 89_478_485

#: What ``decode`` returns: any height and width, 3 channels, uint8.
DECODED_SPEC = ArraySpec((None, None, 3), "uint8")


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


def sniff_counts(bufs: list[bytes]) -> collections.Counter[str]:
    """:func:`sniff` of each of ``bufs``, counted; a JPEG told by one C call over all of
    them (``bytes`` only; any other buffer goes through :func:`sniff`)."""
    try:
        jpeg = list(map(bytes.startswith, bufs, itertools.repeat(b"\xff\xd8")))
    except TypeError:
        return collections.Counter(map(sniff, bufs))
    counts = collections.Counter(map(sniff, itertools.compress(bufs, [not j for j in jpeg])))
    if any(jpeg):
        counts["jpeg"] += sum(jpeg)
    return counts


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
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decode ``buf`` (bytes, bytearray, memoryview, uint8 array) to a uint8 (H, W, 3) RGB array.

    ``min_size=(h, w)``: a JPEG may be decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT
    scaling; much cheaper; other scales are slower than a full decode and are not used) as
    long as the result is still at least ``h`` x ``w``; use it when a resize to that size
    follows; or a function of the stored ``(h, w)`` returning such a size or ``None`` (a
    transform chain's ``decode_hint``), called with the size from the header this function
    reads anyway. ``fast=True`` trades a little accuracy for speed (fast DCT and
    upsampling). ``out``: a C-contiguous uint8 array of exactly the decoded shape to write into.
    ``max_pixels``: an image whose header declares more pixels (width x height) than this is
    refused with ``ImageTooLargeError`` before any pixel is decoded; ``None``: no limit.
    """
    mv = _as_bytes_view(buf)
    if len(mv) == 0:
        raise ImageDecodeError("empty buffer: 0 bytes is not an image")
    if max_pixels is not None and (type(max_pixels) is not int or max_pixels < 1):
        max_pixels = check_max_pixels(max_pixels)
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
            img = _decode_jpeg(mv, out=out, min_size=min_size, fast=fast, max_pixels=max_pixels)
            if out is not None and img is out:
                return out
        except _NotRGBJpeg:
            img = None  # CMYK/YCCK: Pillow converts these
        except _CallerError as e:
            raise e.error from None
        except ImageTooLargeError:
            raise
        except ValueError as e:
            # kept without its traceback: that holds this frame, and a frame holding its own
            # exception is a reference cycle that keeps the caller's frames (and their views
            # of a mapped file) alive until the garbage collector runs
            jpeg_error = e.with_traceback(None)
    elif max_pixels is not None:
        if kind == "png" and len(mv) >= 24 and mv[12:16] == b"IHDR":
            w, h = struct.unpack(">II", mv[16:24])
            _check_pixels(h, w, max_pixels, "the PNG header declares")
        elif kind == "other":
            _check_other_header(mv, max_pixels)
    if img is None and kind != "jpeg":
        img = _decode_cv2(mv)
        if img is not None and max_pixels is not None:
            # only an image whose header neither we nor Pillow read gets here over the limit
            _check_pixels(img.shape[0], img.shape[1], max_pixels, "the decoded image is")
    if img is None:
        try:
            img = _decode_pillow(mv, max_pixels=max_pixels)
        except ImageDecodeError as e:
            if jpeg_error is not None and not isinstance(e, ImageTooLargeError):
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


def decoder(
    *,
    min_size: MinSize = None,
    fast: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    region: bool = False,
) -> Callable[[Any], np.ndarray]:
    """``f(buf)``: ``decode(buf, min_size=..., fast=..., max_pixels=...)`` for a hot loop.
    ``region=True`` (where :data:`REGION` is built): the common record as a :class:`JpegImage`.

    The common record (an RGB or grey JPEG within ``max_pixels`` that no reduced scale fits)
    is decoded with one header read and one decode call; everything else (another format, a
    CMYK JPEG, a reduced scale, an image over the limit, a damaged one) goes to :func:`decode`
    itself, which gives the same pixels and raises the same error. Arguments are checked once,
    here, rather than on every call. A callable ``min_size`` is taken to be a function of the
    size (as ``Transform.decode_hint`` is): it is asked once per image size."""
    import simplejpeg

    max_pixels = check_max_pixels(max_pixels)
    header, decode_jpeg = simplejpeg.decode_jpeg_header, simplejpeg.decode_jpeg
    region = region and REGION is not None

    def general(buf: Any) -> np.ndarray:
        return decode(buf, min_size=min_size, fast=fast, max_pixels=max_pixels)

    if min_size is not None and not callable(min_size):
        _check_min_size(min_size)
        return general  # a fixed size: a reduced scale may fit any image, decode picks it
    hint = min_size
    # the hint's answer per size (a hint is a function of the size): whether a reduced scale
    # may fit, asked once per size instead of once per image
    reduces: dict[tuple[int, int], bool] = {}

    def run(buf: Any) -> np.ndarray:
        got = jpeg_frame(buf)
        if got is None:  # not the common JPEG: simplejpeg's header read says what it is
            try:
                h, w, colorspace, _ = header(buf)
            except (ValueError, TypeError):  # not a JPEG, or not one simplejpeg reads
                return general(buf)
            if colorspace in ("CMYK", "YCCK"):
                return general(buf)
        else:
            h, w = got
        if max_pixels is not None and h * w > max_pixels:
            return general(buf)
        if hint is not None:
            reduce = reduces.get((h, w))
            if reduce is None:
                try:
                    reduce = hint((int(h), int(w))) is not None
                except Exception:  # noqa: BLE001 - decode raises the caller's error as it is
                    return general(buf)
                if len(reduces) >= 4096:
                    reduces.clear()
                reduces[(h, w)] = reduce
            if reduce:
                return general(buf)  # a reduced scale may fit: decode picks it
        if region:
            return JpegImage(buf, (h, w, 3), fast, general)  # type: ignore[return-value]
        try:
            return np.asarray(decode_jpeg(buf, colorspace="RGB", fastdct=fast, fastupsample=fast))
        except ValueError:  # damaged: decode tries Pillow, then names the fault
            return general(buf)

    return run


class JpegImage:
    """A JPEG of the size its header gives, not decoded yet: ``img[rows, columns]`` decodes only
    that box (exactly the whole decode's pixels), ``np.asarray(img)`` all of it. A box libjpeg
    refuses (damage in or above it) is cut from the whole decode, which names the fault."""

    __slots__ = ("buf", "fast", "shape", "whole")
    dtype = np.dtype(np.uint8)

    def __init__(self, buf: Any, shape: tuple[int, int, int], fast: bool, whole: Callable) -> None:
        self.buf, self.shape, self.fast, self.whole = buf, shape, fast, whole

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        (top, bottom, _), (left, right, _) = (s.indices(n) for s, n in zip(key, self.shape))
        out = np.empty((bottom - top, right - left, 3), np.uint8)
        try:
            REGION(self.buf, top, left, bottom - top, right - left, out, self.fast)  # type: ignore[misc]
        except ValueError:
            return self.whole(self.buf)[key]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.whole(self.buf)


def check_max_pixels(max_pixels: Any) -> int | None:
    """``max_pixels`` as an int >= 1, or ``None`` (no limit); ``TypeError``/``ValueError``
    naming the value otherwise."""
    if max_pixels is None:
        return None
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)):
        raise TypeError(
            f"max_pixels must be an int (pixels, width x height) or None, got {max_pixels!r}"
        )
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be >= 1 or None (no limit), got {max_pixels!r}")
    return int(max_pixels)


def _check_pixels(h: int, w: int, max_pixels: int, what: str) -> None:
    """``ImageTooLargeError`` when a ``w`` x ``h`` image is over ``max_pixels``; ``what`` says
    where the size comes from ("the PNG header declares")."""
    if h * w > max_pixels:
        raise _too_large(f"{what} {w}x{h} (width x height) = {h * w:,} pixels", max_pixels)


def _too_large(size: str, max_pixels: int) -> ImageTooLargeError:
    """The error for an image of ``size`` (words ending in "pixels") over ``max_pixels``."""
    return ImageTooLargeError(
        f"{size}, over the limit of {max_pixels:,} (max_pixels, a guard against decompression "
        "bombs); raise it with stoker.pipeline.DecodeOptions(max_pixels=...) for the loader or "
        "decode(..., max_pixels=...), None for no limit"
    )


_BOMB_PIXELS = re.compile(r"\(([0-9]+) pixels\)")


def _check_other_header(mv: memoryview, max_pixels: int) -> None:
    """Check the size a non-JPEG/PNG header declares, before any pixel is decoded: parsed here
    for WebP, BMP, TIFF and Radiance HDR (cheap), read by Pillow (header only) for the rest. A
    header neither reads is left to the decoders (``decode`` checks their result)."""
    for fmt, size in (
        ("WebP", riff_webp_size),
        ("BMP", bmp_size),
        ("TIFF", tiff_size),
        ("HDR", radiance_size),
    ):
        hw = size(mv)
        if hw is not None:
            _check_pixels(hw[0], hw[1], max_pixels, f"the {fmt} header declares")
            return
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # the check below replaces Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(mv)) as im:
                w, h = im.size
                fmt = im.format or "image"
    except Image.DecompressionBombError as e:
        too_large = _pillow_refused(e, max_pixels)
        if too_large is not None:
            raise too_large from None
        return
    except Exception:  # noqa: BLE001 - unreadable header: the decoders say why
        return
    _check_pixels(int(h), int(w), max_pixels, f"the {fmt} header declares")


def _pillow_refused(e: Exception, max_pixels: int | None) -> ImageTooLargeError | None:
    """Pillow's own ``DecompressionBombError`` (a header over twice ``Image.MAX_IMAGE_PIXELS``)
    as an ``ImageTooLargeError`` when the size it names is over ``max_pixels`` too."""
    m = _BOMB_PIXELS.search(str(e))
    if max_pixels is None or m is None or int(m.group(1)) <= max_pixels:
        return None
    return _too_large(f"the image header declares {int(m.group(1)):,} pixels", max_pixels)


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
    max_pixels: int | None,
) -> np.ndarray:
    import simplejpeg

    h, w, colorspace, _ = simplejpeg.decode_jpeg_header(mv)
    if max_pixels is not None and h * w > max_pixels:
        _check_pixels(h, w, max_pixels, "the JPEG header declares")
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


def _decode_pillow(mv: memoryview, *, max_pixels: int | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(mv)) as im:
            if max_pixels is not None:
                w, h = im.size
                _check_pixels(
                    int(h), int(w), max_pixels, f"the {im.format or 'image'} header declares"
                )
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
    except ImageTooLargeError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad input
        too_large = _pillow_refused(e, max_pixels)
        if too_large is not None:
            raise too_large from e
        kind = sniff(mv)
        what = {"jpeg": "JPEG", "png": "PNG"}.get(kind, "image (unrecognised format)")
        head = bytes(mv[:8]).hex(" ")
        raise ImageDecodeError(
            f"cannot decode {what}, {len(mv)} bytes starting {head}: {type(e).__name__}: "
            + without_reprs(str(e))
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


def decode_mask(buf: Any, *, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A PNG label map as a (H, W) array of its stored values: uint8 palette indices for a
    palette PNG (Pillow reads those; OpenCV would expand them to colours), uint8 or uint16
    values for a grey PNG of 8 or 16 bits (1, 2 and 4 bits give their values too, as uint8).
    Anything else (RGB, grey with alpha, not a PNG) is refused with ``ImageDecodeError``:
    a colour image is not a label map, and guessing a colour-to-class table would be wrong.
    ``max_pixels`` as in :func:`decode`, checked on the IHDR before any pixel is decoded."""
    mv = _as_bytes_view(buf)
    if len(mv) == 0:
        raise ImageDecodeError("empty buffer: 0 bytes is not a mask")
    if max_pixels is not None and (type(max_pixels) is not int or max_pixels < 1):
        max_pixels = check_max_pixels(max_pixels)
    if sniff(mv) != "png" or len(mv) < 29 or mv[12:16] != b"IHDR":
        head = bytes(mv[:8]).hex(" ")
        raise ImageDecodeError(
            f"a mask must be a PNG (palette or grey), got {len(mv)} bytes starting {head}"
        )
    w, h, depth, colour = struct.unpack(">IIBB", mv[16:26])
    if max_pixels is not None:
        _check_pixels(h, w, max_pixels, "the mask's PNG header declares")
    if colour not in (0, 3):
        what = {2: "RGB", 4: "grey with alpha", 6: "RGBA"}.get(colour, f"colour type {colour}")
        raise ImageDecodeError(
            f"a mask must be a palette or grey PNG (one value per pixel), got {what} "
            f"({w}x{h}, {depth}-bit); save the label map with mode 'P', 'L' or 'I;16'"
        )
    if colour == 0 and depth in (8, 16):
        import cv2

        arr = cv2.imdecode(np.frombuffer(mv, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if arr is not None and arr.ndim == 2 and arr.shape == (h, w):
            return arr
        raise ImageDecodeError(f"cannot decode the {depth}-bit grey PNG mask ({len(mv)} bytes)")
    return _decode_mask_pillow(mv, depth, colour)


def _decode_mask_pillow(mv: memoryview, depth: int, colour: int) -> np.ndarray:
    """Palette indices, or the values of a 1/2/4-bit grey PNG (Pillow scales those to 0..255,
    which is undone here)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(mv)) as im:
            im.load()
            arr = np.asarray(im)
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad input
        raise ImageDecodeError(
            f"cannot decode the PNG mask ({len(mv)} bytes): {type(e).__name__}: {e}"
        ) from e
    arr = arr.astype(np.uint8) if arr.dtype == bool else arr
    if colour == 0 and depth in (2, 4) and im.mode == "L":
        arr = arr // (255 // ((1 << depth) - 1))
    if arr.ndim != 2 or arr.dtype != np.uint8:
        raise ImageDecodeError(
            f"the PNG mask decoded to {arr.dtype} {arr.shape}, not one uint8 value per pixel"
        )
    return np.ascontiguousarray(arr)
