"""The decode stage: decode the sample with each installed decoder and with the loader's own
decode step, leaving out the payloads that do not decode (each is recorded as corrupt, named
as the loader would name it)."""

from __future__ import annotations

import time

import numpy as np

from stoker.doctor.findings import Decode, Findings
from stoker.doctor.measure.decode import (
    decoders,
    fallback_decode,
    measure_decode,
    pipeline_decoder,
)

__all__ = ["run"]


def run(f: Findings) -> None:
    """Fill ``f.decode``."""
    s = f.settings
    decs = decoders()
    pipeline_decode, pipe_note = pipeline_decoder(s.transforms)
    if pipe_note:
        f.skip("decode (loader pipeline)", pipe_note)
    full: list[np.ndarray] = []
    images: list[np.ndarray] = []
    good: list[bytes] = []
    until = time.perf_counter() + s.left(s.stage_end) / 3  # the pass's share of the budget
    for j, b in enumerate(f.storage.payloads):  # in the order of the sample
        if len(good) >= 8 and time.perf_counter() > until:  # the rest is left out
            del f.sample.files[j:], f.sample.positions[j:]
            break
        try:
            img = pipeline_decode(b, None)  # first: its error is the one the loader would give
            full.append(fallback_decode(b))
            images.append(img)
            good.append(b)
        except Exception as e:  # noqa: BLE001 - a bad sample must not stop the doctor
            key, where = f.sample.describe(j)
            f.found_corrupt(key, where, f"{type(e).__name__}: {e}", "decode")
    for name, fn in decs.items():
        try:
            f.add(measure_decode(name, fn, good, seconds=s.quarter, max_seconds=s.cap(s.quarter)))
        except Exception as e:  # noqa: BLE001
            f.skip(f"decode {name}", f"{type(e).__name__}: {e}")
    main = None
    try:
        main = f.add(
            measure_decode(
                "loader pipeline", pipeline_decode, good, seconds=s.half, max_seconds=s.cap(s.half)
            )
        )
    except Exception as e:  # noqa: BLE001
        f.skip("decode (loader pipeline)", f"{type(e).__name__}: {e}")
    f.decode = Decode(decs, pipeline_decode, good, full, images, main)
