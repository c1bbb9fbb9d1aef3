"""The alternatives stage: when the transforms shrink the image, time each decoder at the
output size and the sample re-encoded just large enough for it (resize at pack time)."""

from __future__ import annotations

import contextlib

from stoker.doctor.findings import Alternatives, Findings
from stoker.doctor.measure.augment import measure_transforms
from stoker.doctor.measure.decode import measure_decode, resize_payloads
from stoker.doctor.measure.timing import Stage

__all__ = ["run"]


def run(f: Findings) -> None:
    """Fill ``f.alternatives`` (both empty when the output is not smaller than the input)."""
    target = f.augment.target
    f.alternatives = Alternatives(None, None)
    if target is None:
        return
    f.alternatives = Alternatives(_scaled_decode(f, target), _resized_at_pack(f, target))


def _scaled_decode(f: Findings, target: tuple[int, int]) -> Stage | None:
    """Each decoder at reduced size; the fastest one."""
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
) -> tuple[float, float, float, float, str] | None:
    """Decode and augment of the payloads re-encoded to just cover ``target``:
    ``(decode s, decode CPU s, augment s, augment CPU s, label)`` per sample."""
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
    return (d2.per_sample_s, d2.cpu_per_sample_s, a2.per_sample_s, a2.cpu_per_sample_s, label)
