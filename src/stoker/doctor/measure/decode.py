"""Decoding the sampled payloads: each installed decoder at full or reduced size, the loader's
own decode step, and the payloads re-encoded just large enough for the output."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker.doctor.measure.timing import Stage, time_loop

__all__ = [
    "Decoder",
    "decoders",
    "fallback_decode",
    "measure_decode",
    "pipeline_decoder",
    "resize_payloads",
]

#: payload bytes and, for a decode at reduced size, the ``(height, width)`` it must cover
Decoder = Callable[[bytes, "tuple[int, int] | None"], np.ndarray]


def _is_jpeg(b: bytes) -> bool:
    return b[:3] == b"\xff\xd8\xff"


def _dec_simplejpeg(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    import simplejpeg

    if min_size is None:
        return simplejpeg.decode_jpeg(b, colorspace="RGB")
    return simplejpeg.decode_jpeg(
        b, colorspace="RGB", min_height=min_size[0], min_width=min_size[1]
    )


def _dec_opencv(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    import cv2

    flag = cv2.IMREAD_COLOR
    if min_size is not None:
        h, w = _header_size(b)
        for factor, f in (
            (8, cv2.IMREAD_REDUCED_COLOR_8),
            (4, cv2.IMREAD_REDUCED_COLOR_4),
            (2, cv2.IMREAD_REDUCED_COLOR_2),
        ):
            if h // factor >= min_size[0] and w // factor >= min_size[1]:
                flag = f
                break
    img = cv2.imdecode(np.frombuffer(b, np.uint8), flag)
    if img is None:
        raise ValueError("OpenCV could not decode the payload")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _dec_pillow(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(b)) as im:
        if min_size is not None:
            im.draft("RGB", (min_size[1], min_size[0]))
        return np.asarray(im.convert("RGB"))


def _header_size(b: bytes) -> tuple[int, int]:
    if _is_jpeg(b):
        import simplejpeg

        h, w, _, _ = simplejpeg.decode_jpeg_header(b)
        return int(h), int(w)
    from PIL import Image

    with Image.open(io.BytesIO(b)) as im:
        return im.height, im.width


def fallback_decode(b: bytes, min_size: tuple[int, int] | None = None) -> np.ndarray:
    """simplejpeg for JPEG, OpenCV for the rest (what ``stoker.codecs.decode`` does)."""
    if _is_jpeg(b):
        return _dec_simplejpeg(b, min_size)
    return _dec_opencv(b, min_size)


def decoders() -> dict[str, Decoder]:
    """The decoders importable here, by name."""
    out: dict[str, Decoder] = {}
    for name, mod, fn in (
        ("simplejpeg", "simplejpeg", _dec_simplejpeg),
        ("OpenCV", "cv2", _dec_opencv),
        ("Pillow", "PIL", _dec_pillow),
    ):
        try:
            __import__(mod)
        except ImportError:
            continue
        out[name] = fn
    return out


def pipeline_decoder(t: Any) -> tuple[Decoder, str]:
    """The loader's own decode step (``Pipeline.decode_image``: scale-on-decode when the
    transforms allow it), or the plain decoder with the reason it could not be built."""
    try:
        from stoker.codecs import DECODED_SPEC
        from stoker.pipeline import Pipeline

        pipe = Pipeline(DECODED_SPEC, transforms=t)
    except ImportError as e:
        return _plain, f"stoker.pipeline is not available ({e})"
    except Exception as e:  # noqa: BLE001 - e.g. a chain without a fixed output shape
        return _plain, f"{type(e).__name__}: {e}; timed the plain decoder"
    return (lambda b, _min=None: pipe.decode_image(b)), ""


def _plain(b: bytes, _min: tuple[int, int] | None = None) -> np.ndarray:
    return fallback_decode(b)


def measure_decode(
    name: str,
    fn: Decoder,
    payloads: list[bytes],
    *,
    seconds: float,
    min_size: tuple[int, int] | None = None,
    max_seconds: float | None = None,
) -> Stage | None:
    """Decode the payloads with ``fn``; ``None`` when the decoder takes none of them."""
    usable = payloads
    if name == "simplejpeg":
        usable = [b for b in payloads if _is_jpeg(b)]
    if not usable:
        return None
    nbytes = 0

    def dec(b: bytes) -> None:
        nonlocal nbytes
        fn(b, min_size)
        nbytes += len(b)

    n, wall, cpu, queued, spread = time_loop(
        dec, usable, seconds=seconds, min_items=min(len(usable), 8), max_seconds=max_seconds
    )
    note = f"{len(usable)} of {len(payloads)} payloads" if len(usable) < len(payloads) else ""
    label = f"decode {name}" + (f" at >= {min_size[0]}x{min_size[1]}" if min_size else "")
    return Stage(label, "decode", n, wall, cpu, nbytes, note, queued, spread)


def resize_payloads(
    images: list[np.ndarray], payloads: list[bytes], target: tuple[int, int]
) -> tuple[list[bytes], str]:
    """Re-encode decoded images so that they just cover ``target`` (aspect kept), JPEG q90."""
    import cv2
    import simplejpeg

    out = []
    for img in images:
        h, w = img.shape[:2]
        s = max(target[0] / h, target[1] / w)
        if s >= 1.0:
            small = img
        else:
            small = cv2.resize(
                img,
                (max(target[1], math.ceil(w * s)), max(target[0], math.ceil(h * s))),
                interpolation=cv2.INTER_AREA,
            )
        rgb = np.ascontiguousarray(
            small if small.ndim == 3 else np.repeat(small[..., None], 3, axis=2)
        )
        out.append(simplejpeg.encode_jpeg(rgb, quality=90, colorspace="RGB"))
    a = images[0].shape[:2]
    before = sum(len(b) for b in payloads) / max(1, len(payloads))
    after = sum(len(b) for b in out) / max(1, len(out))
    return (
        out,
        f"{a[0]}x{a[1]} -> about {target[0]}x{target[1]} px, {before / 1e3:.1f} -> {after / 1e3:.1f} kB",
    )
