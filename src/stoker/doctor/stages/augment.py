"""The augment stage: apply the transforms to the decoded sample (a ``Compose`` op by op) and
note the output's shape and dtype, and the size it shrinks the image to."""

from __future__ import annotations

import numpy as np

from stoker.doctor.findings import Augment, Findings
from stoker.doctor.measure.augment import measure_transforms
from stoker.doctor.measure.timing import Stage

__all__ = ["most_common_shape", "run"]

#: the output counts as a shrink (worth decoding or packing smaller) below this area share
SHRINK = 0.7


def most_common_shape(images: list[np.ndarray]) -> tuple[int, ...] | None:
    """The shape most of ``images`` have (``None`` for none)."""
    if not images:
        return None
    shapes: dict[tuple[int, ...], int] = {}
    for im in images:
        shapes[im.shape] = shapes.get(im.shape, 0) + 1
    return max(shapes, key=lambda s: shapes[s])


def run(f: Findings) -> None:
    """Fill ``f.augment``."""
    t = f.settings.transforms
    images = f.decode.images
    outputs: list[np.ndarray] = images
    stage: Stage | None = None
    breakdown: list[tuple[str, float, float]] = []
    if t is not None and images:
        try:
            s = f.settings
            stage, breakdown, outputs = measure_transforms(
                t, images, seconds=s.half, max_seconds=s.cap(s.half)
            )
            f.add(stage)
        except Exception as e:  # noqa: BLE001
            f.skip("augment", f"the transforms failed on a sample: {type(e).__name__}: {e}")
    in_shape = most_common_shape(f.decode.full)
    out_shape = most_common_shape(outputs)
    out_dtype = str(outputs[0].dtype) if outputs else "uint8"
    target: tuple[int, int] | None = None
    if in_shape and out_shape and len(out_shape) >= 2 and t is not None:
        oh, ow = out_shape[0], out_shape[1]
        if oh * ow < SHRINK * in_shape[0] * in_shape[1]:
            target = (oh, ow)
    f.augment = Augment(stage, breakdown, outputs, in_shape, out_shape, out_dtype, target)
