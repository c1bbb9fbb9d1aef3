"""Check one image file and turn it into the bytes stored in a record.

Every image is checked before it is packed:

1. **Content sniffed by magic bytes**, not by extension (a PNG named ``.JPEG`` is packed as
   the PNG it is). Zero bytes → ``empty``; unknown magic → ``not_an_image``.
2. **Pixel limit from the header**, before any pixel is decoded: ``width * height >
   max_pixels`` → ``bomb``. Pillow's ``Image.open`` reads only the header.
3. **Full decode.** JPEG through libjpeg-turbo (simplejpeg) in strict mode, so libjpeg's
   warnings are errors: a cut file → ``truncated``, damaged entropy data → ``corrupt``.
   Progressive JPEGs with more than ``MAX_JPEG_SCANS`` scans → ``too_many_scans``. Other
   formats through Pillow with ``LOAD_TRUNCATED_IMAGES`` left False (truncated →
   ``truncated``) and its text-chunk limits (oversized zTXt/iCCP → ``oversized_chunk``).

What is stored (the normalisation policy):

- A JPEG in YCbCr, RGB or grayscale without an EXIF rotation is stored **as is** (its original
  bytes: lossless, fastest). Likewise an 8-bit RGB or grayscale PNG.
- Otherwise the decoded pixels are normalised and re-encoded:
  CMYK/YCCK → RGB; palette → RGB (RGBA when it has a transparent colour); RGBA/LA → RGB by
  compositing on **white** (transparent areas of icons and scans are usually meant as paper,
  and black would invent edges); 16-bit → 8-bit by keeping the high byte (``v >> 8``, what
  Pillow does for 16-bit RGB); 1-bit → grayscale; EXIF orientation applied (as
  ``ImageOps.exif_transpose`` does), so every decoder sees the upright image.
- Re-encoding keeps lossy sources lossy and lossless sources lossless: JPEG (and lossy WebP)
  sources become JPEG at ``quality`` (95 unless given); PNG, BMP, TIFF, GIF, PNM (PPM/PGM)
  and lossless WebP become PNG, so packing never silently adds compression loss to a lossless set.
- ``resize`` (shorter side, ``cv2.INTER_AREA`` when shrinking, ``INTER_CUBIC`` when growing) or
  an explicit ``quality`` re-encode every image as JPEG at that quality.
- Grayscale stays single-channel in the stored bytes; stoker's decoders return 3 channels.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

# the one default pixel limit (Pillow's decompression-bomb limit), shared with the decoders
from stoker.codecs import DEFAULT_MAX_PIXELS

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_QUALITY",
    "MAX_JPEG_SCANS",
    "CheckedImage",
    "Reject",
    "check_image",
    "sniff_format",
]

DEFAULT_QUALITY = 95
MAX_JPEG_SCANS = 256  # nvImageCodec's limit; real progressive JPEGs use about 10

_LOSSLESS = {"PNG", "BMP", "TIFF", "GIF", "PNM", "WEBP-LOSSLESS"}
_PNM_SPACE = b" \t\n\r\x0b\x0c"  # what may follow a netpbm magic number


class Reject(Exception):  # noqa: N818 - a verdict, not a failure of the code
    """This file is not packed: ``reason`` is a short token, ``detail`` says why."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)

    def __reduce__(self):
        return (Reject, (self.reason, self.detail))


@dataclass(frozen=True)
class CheckedImage:
    """The bytes to store and what was learned about the source."""

    payload: bytes
    source_format: str  # JPEG, PNG, BMP, TIFF, GIF, WEBP, PNM (the true one, by magic bytes)
    height: int  # of the stored image
    width: int
    passthrough: bool  # the original bytes are stored unchanged
    rotated: bool = False  # an EXIF orientation other than 1 was applied


def sniff_format(data: bytes) -> str | None:
    """The image format named by the first bytes, or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:2] == b"BM":
        return "BMP"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if len(data) >= 3 and data[0] == 0x50 and 0x31 <= data[1] <= 0x36 and data[2] in _PNM_SPACE:
        return "PNM"  # netpbm P1..P6: PBM, PGM, PPM, plain or raw
    return None


def _looks_cut(data: bytes, fmt: str) -> bool:
    """True when the file lacks its end marker (JPEG EOI, PNG IEND)."""
    if fmt == "JPEG":
        return not data.rstrip(b"\x00").endswith(b"\xff\xd9")
    if fmt == "PNG":
        return b"IEND" not in data[-12:]
    return False


def _check_png_crcs(data: bytes) -> None:
    """Reject a PNG whose chunk CRCs do not match (Pillow checks none of the image data's).

    A pass-through PNG is stored with its CRCs, which strict readers (libpng) check; a bad one
    means damaged bytes even when zlib still inflates them."""
    import zlib

    mv = memoryview(data)
    pos, n = 8, len(data)
    while pos + 12 <= n:
        length = int.from_bytes(mv[pos : pos + 4], "big")
        end = pos + 8 + length
        if end + 4 > n:
            return  # cut short: the decoder has judged it already
        crc = zlib.crc32(mv[pos + 4 : end])
        if crc != int.from_bytes(mv[end : end + 4], "big"):
            kind = bytes(mv[pos + 4 : pos + 8]).decode("latin-1")
            raise Reject("corrupt", f"PNG {kind} chunk at byte {pos}: CRC mismatch")
        if mv[pos + 4 : pos + 8] == b"IEND":
            return
        pos = end + 4


def _open_header(data: bytes, fmt: str, max_pixels: int):
    """Pillow image with only the header read; rejects bombs before any pixel is decoded."""
    from PIL import Image

    with warnings.catch_warnings():
        # our own max_pixels check below replaces Pillow's warning
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:
            raise Reject("bomb", str(e)) from None
        except ValueError as e:
            reason = "oversized_chunk" if "too large" in str(e).lower() else "undecodable"
            raise Reject(reason, f"{type(e).__name__}: {e}") from None
        except (OSError, SyntaxError, EOFError) as e:
            reason = "truncated" if _looks_cut(data, fmt) else "undecodable"
            raise Reject(reason, f"header unreadable: {type(e).__name__}: {e}") from None
    w, h = im.size
    _check_size(w, h, max_pixels)
    return im


def _check_size(w: int, h: int, max_pixels: int) -> None:
    """Reject a header size that is empty, or over ``max_pixels`` (a decompression bomb)."""
    if w <= 0 or h <= 0:
        raise Reject("undecodable", f"header gives size {w}x{h}")
    if w * h > max_pixels:
        raise Reject("bomb", f"header gives {w}x{h} = {w * h} pixels > max_pixels {max_pixels}")


def _orientation(im) -> int:
    try:
        value = im.getexif().get(0x0112)
    except Exception:  # noqa: BLE001 - a damaged EXIF block is no reason to drop the image
        return 1
    return int(value) if isinstance(value, int) and 1 <= value <= 8 else 1


def jpeg_orientation(data: bytes) -> int:
    """EXIF orientation (1..8) from a JPEG's APP1 segment, 1 when absent or unreadable.

    Walks the marker segments before the first scan; every offset is bounds-checked.
    """
    n = len(data)
    i = 2
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image: no more headers
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            break
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\x00\x00":
            return _tiff_orientation(data[i + 10 : i + 2 + length])
        i += 2 + length
    return 1


def _tiff_orientation(t: bytes) -> int:
    if len(t) < 8 or t[:2] not in (b"II", b"MM"):
        return 1
    order: Literal["little", "big"] = "little" if t[:2] == b"II" else "big"
    ifd = int.from_bytes(t[4:8], order)
    if ifd + 2 > len(t):
        return 1
    count = int.from_bytes(t[ifd : ifd + 2], order)
    for k in range(min(count, 512)):
        e = ifd + 2 + 12 * k
        if e + 12 > len(t):
            break
        if int.from_bytes(t[e : e + 2], order) == 0x0112:
            kind = int.from_bytes(t[e + 2 : e + 4], order)
            if kind != 3:  # SHORT
                return 1
            value = int.from_bytes(t[e + 8 : e + 10], order)
            return value if 1 <= value <= 8 else 1
    return 1


def apply_orientation(arr: np.ndarray, orientation: int) -> np.ndarray:
    """Rotate/flip ``arr`` (H, W[, C]) so that EXIF ``orientation`` becomes 1."""
    if orientation == 2:
        arr = arr[:, ::-1]
    elif orientation == 3:
        arr = arr[::-1, ::-1]
    elif orientation == 4:
        arr = arr[::-1]
    elif orientation == 5:
        arr = arr.swapaxes(0, 1)
    elif orientation == 6:
        arr = arr.swapaxes(0, 1)[:, ::-1]
    elif orientation == 7:
        arr = arr.swapaxes(0, 1)[::-1, ::-1]
    elif orientation == 8:
        arr = arr.swapaxes(0, 1)[::-1]
    return np.ascontiguousarray(arr)


def _decode_jpeg(data: bytes, colorspace: str, *, scaled: bool = False) -> np.ndarray:
    import simplejpeg

    if data.count(b"\xff\xda") > MAX_JPEG_SCANS:
        raise Reject("too_many_scans", f"more than {MAX_JPEG_SCANS} JPEG scans")
    target = "GRAY" if colorspace == "Gray" else "RGB"
    small = {"min_height": 1, "min_width": 1} if scaled else {}
    try:
        return simplejpeg.decode_jpeg(data, colorspace=target, strict=True, **small)
    except ValueError as e:
        msg = str(e)
        if "Premature end" in msg or "truncated" in msg.lower():
            raise Reject("truncated", msg) from None
        raise Reject("corrupt", msg) from None


def _pillow_to_array(im) -> np.ndarray:
    """Decode fully with Pillow and normalise the mode to uint8 L or RGB."""
    from PIL import Image

    try:
        im.load()
    except OSError as e:
        msg = str(e)
        reason = "truncated" if "truncated" in msg or "broken data stream" in msg else "corrupt"
        raise Reject(reason, msg) from None
    except ValueError as e:
        msg = str(e)
        reason = "oversized_chunk" if "too large" in msg.lower() else "corrupt"
        raise Reject(reason, msg) from None
    except (SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise Reject("corrupt", f"{type(e).__name__}: {e}") from None
    mode = im.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        arr = np.asarray(im)
        return (np.clip(arr.astype(np.int64), 0, 65535) >> 8).astype(np.uint8)
    if mode == "F":
        raise Reject("unsupported_mode", "32-bit float images have no defined 8-bit scaling")
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif mode == "PA":
        im = im.convert("RGBA")
    elif mode == "1":
        im = im.convert("L")
    elif mode in ("La", "RGBa"):
        im = im.convert(mode.upper())
    elif mode not in ("L", "RGB", "RGBA", "LA"):
        im = im.convert("RGB")
    arr = np.asarray(im)
    if im.mode in ("RGBA", "LA"):
        arr = _composite_on_white(arr)
    return arr


def _composite_on_white(arr: np.ndarray) -> np.ndarray:
    color = arr[..., :-1].astype(np.uint32)
    alpha = arr[..., -1:].astype(np.uint32)
    out = (color * alpha + 255 * (255 - alpha) + 127) // 255
    out = out.astype(np.uint8)
    return out[..., 0] if out.shape[-1] == 1 else out


def _resize_shorter(arr: np.ndarray, size: int) -> np.ndarray:
    import cv2

    h, w = arr.shape[:2]
    if h <= w:
        nh, nw = size, max(1, w * size // h)
    else:
        nh, nw = max(1, h * size // w), size
    if (nh, nw) == (h, w):
        return arr
    interp = cv2.INTER_AREA if nh < h else cv2.INTER_CUBIC
    return cv2.resize(arr, (nw, nh), interpolation=interp)


def _encode(arr: np.ndarray, kind: str, quality: int) -> bytes:
    if kind == "JPEG":
        import simplejpeg

        if arr.ndim == 2:
            return simplejpeg.encode_jpeg(arr[:, :, None], quality, colorspace="GRAY")
        return simplejpeg.encode_jpeg(
            np.ascontiguousarray(arr), quality, colorspace="RGB", colorsubsampling="420"
        )
    import cv2

    bgr = arr if arr.ndim == 2 else np.ascontiguousarray(arr[:, :, ::-1])
    ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:  # pragma: no cover - cv2 encodes any uint8 L/RGB array
        raise Reject("encode_failed", "OpenCV could not encode the image as PNG")
    return buf.tobytes()


def check_image(
    data: bytes,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    resize: int | None = None,
    quality: int | None = None,
) -> CheckedImage:
    """Check ``data`` fully and return what to store; raise :class:`Reject` when it is bad.

    ``quality=None`` keeps pass-through where the policy allows and uses
    ``DEFAULT_QUALITY`` for what must be re-encoded; an int (or ``resize``) re-encodes all.
    """
    if not data:
        raise Reject("empty", "0 bytes")
    fmt = sniff_format(data)
    if fmt is None:
        raise Reject("not_an_image", f"unknown magic bytes {data[:8].hex()}")
    force = resize is not None or quality is not None
    q = DEFAULT_QUALITY if quality is None else quality
    if fmt == "JPEG":
        import simplejpeg

        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError as e:
            reason = "truncated" if _looks_cut(data, fmt) else "corrupt"
            raise Reject(reason, f"header unreadable: {e}") from None
        _check_size(w, h, max_pixels)
        orientation = jpeg_orientation(data)
        if not force and orientation == 1 and colorspace in ("YCbCr", "Gray", "RGB"):
            # stored as is: decode every scan in full (entropy data), but only the luma plane
            # at 1/8 scale, which is all a check needs
            _decode_jpeg(data, "Gray", scaled=True)
            return CheckedImage(data, fmt, h, w, True)
        arr = _decode_jpeg(data, colorspace)
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        target = "JPEG"
    else:
        im = _open_header(data, fmt, max_pixels)
        orientation = _orientation(im)
        arr = _pillow_to_array(im)
        if fmt == "PNG":
            _check_png_crcs(data)
        if fmt == "WEBP":
            lossless = data[12:16] == b"VP8L" or (data[12:16] == b"VP8X" and b"VP8L" in data[:4096])
            fmt_kind = "WEBP-LOSSLESS" if lossless else "WEBP"
        else:
            fmt_kind = fmt
        if (
            not force
            and fmt == "PNG"
            and orientation == 1
            and data[24:26] in (b"\x08\x00", b"\x08\x02")  # IHDR: 8-bit gray or RGB
        ):
            return CheckedImage(data, fmt, arr.shape[0], arr.shape[1], True)
        target = "PNG" if fmt_kind in _LOSSLESS else "JPEG"
    arr = apply_orientation(arr, orientation)
    if resize is not None:
        arr = _resize_shorter(arr, resize)
    if force:
        target = "JPEG"
    payload = _encode(arr, target, q)
    return CheckedImage(payload, fmt, arr.shape[0], arr.shape[1], False, orientation != 1)
