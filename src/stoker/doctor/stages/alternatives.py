"""The alternatives stage: when the transforms shrink the image, time each decoder at reduced
size and the sample re-encoded just large enough (resize at pack time), at :func:`pack_size`."""

from __future__ import annotations

import contextlib

import numpy as np

from stoker.doctor.findings import Alternatives, Findings
from stoker.doctor.measure.augment import measure_transforms
from stoker.doctor.measure.decode import measure_decode, resize_payloads
from stoker.doctor.measure.timing import Stage
from stoker.doctor.stages.augment import SHRINK

__all__ = ["pack_size", "run"]


def run(f: Findings) -> None:
    """Fill ``f.alternatives`` (both empty when the output is not smaller than the input)."""
    target, full = f.augment.target, f.augment.in_shape
    f.alternatives = Alternatives(None, None)
    if target is None or full is None:
        return
    size, trade = pack_size(f.settings.transforms, (full[0], full[1]), target)
    faster = [s for s in (_scaled_decode(f, size), _region_decode(f)) if s is not None]
    best = min(faster, key=lambda s: s.per_sample_s, default=None)
    f.alternatives = Alternatives(best, _resized_at_pack(f, size), trade)


def _region_decode(f: Findings) -> Stage | None:
    """The loader's decode with ``DecodeOptions(region=True)``, each crop box sliced, where it
    applies (its decoder gives a ``JpegImage``: a leading RandomResizedCrop, no reduced scale)."""
    from stoker.codecs import DECODED_SPEC, JpegImage
    from stoker.pipeline import DecodeOptions, Pipeline

    t, rng, q = f.settings.transforms, np.random.default_rng(0), f.settings.quarter
    crop = t.transforms[0] if isinstance(getattr(t, "transforms", None), (list, tuple)) else t
    with contextlib.suppress(Exception):
        dec = Pipeline(DECODED_SPEC, transforms=t, decode=DecodeOptions(region=True)).decoder(True)
        if any(isinstance(dec(b), JpegImage) for b in f.decode.payloads[:8]):

            def box(b: bytes, _min: tuple[int, int] | None = None) -> np.ndarray:
                top, left, h, w = crop.params((img := dec(b)).shape[:2], rng)
                return img[top : top + h, left : left + w]

            st = measure_decode(  # changes.py knows the stage by its name
                "the crop's box only", box, f.decode.payloads, seconds=q, max_seconds=f.settings.cap(q)
            )  # fmt: skip
            return f.add(st) if st is not None else None
    return None


def pack_size(
    t: object, full: tuple[int, int], out: tuple[int, int]
) -> tuple[tuple[int, int], str]:
    """The size to decode or pack images of ``full`` size at: what ``t``'s ``decode_hint``
    allows when it shrinks them, else the output size ``out``, with why that is a trade."""
    from stoker.transforms import decode_hint

    hint = decode_hint(t, full)
    if hint is not None and hint[0] * hint[1] < SHRINK * full[0] * full[1]:
        return hint, ""
    need = decode_hint(t, (10 * full[0], 10 * full[1]))  # the size it needs, at this aspect
    why = (
        f"every crop at full resolution needs a shorter side of at least {min(need)} px"
        if need
        else "the transforms do not say which size keeps every crop whole (decode_hint)"
    )
    return out, f"crops upsampled from {out[0]}x{out[1]} px: {why}; these images have {min(full)}"


def _scaled_decode(f: Findings, target: tuple[int, int]) -> Stage | None:
    """Each decoder at reduced size; the fastest one (``None`` when no DCT scale covers it)."""
    full = f.augment.in_shape or (0, 0)
    if not any(full[0] // k >= target[0] and full[1] // k >= target[1] for k in (2, 4, 8)):
        return None
    best: Stage | None = None
    for name, fn in f.decode.decoders.items():
        with contextlib.suppress(Exception):
            st = f.add(
                measure_decode(
                    name,
                    fn,
                    f.decode.payloads,
                    seconds=f.settings.quarter,
                    min_size=target,
                    max_seconds=f.settings.cap(f.settings.quarter),
                )
            )
            if st is not None and (best is None or st.per_sample_s < best.per_sample_s):
                best = st
    return best


def _resized_at_pack(
    f: Findings, target: tuple[int, int]
) -> tuple[float, float, float, float, str, float] | None:
    """Decode and augment of the payloads re-encoded to just cover ``target``:
    ``(decode s, decode CPU s, augment s, augment CPU s, label, high end)`` per sample."""
    dec = f.decode
    quarter = f.settings.quarter
    try:
        small, label = resize_payloads(dec.full, dec.payloads, target)
        cap = f.settings.cap(quarter)
        d2 = measure_decode(
            "resized at pack time", dec.pipeline_decode, small, seconds=quarter, max_seconds=cap
        )
        small_imgs = [dec.pipeline_decode(b, None) for b in small]
        a2, _, _ = measure_transforms(f.settings.transforms, small_imgs, seconds=quarter)
    except Exception as e:  # noqa: BLE001
        f.skip("resize at pack time", f"{type(e).__name__}: {e}")
        return None
    if d2 is None:
        return None
    f.add(d2)
    hi = d2.interval_s[1] + a2.interval_s[1]
    return (d2.per_sample_s, d2.cpu_per_sample_s, a2.per_sample_s, a2.cpu_per_sample_s, label, hi)
