"""What a worker does to a decoded sample: the transforms (a ``Compose`` op by op), then the
write of the result into its batch slot."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from stoker.doctor.measure.timing import Stage, time_loop

__all__ = ["measure_assemble", "measure_transforms", "transform_ops"]


def transform_ops(t: object) -> list[object]:
    """The steps of a ``Compose`` (timed one by one), else ``[t]``. A ``RandomChoice`` also
    holds a ``transforms`` list but applies one of them: it counts as one op."""
    try:
        from stoker.transforms.compose import Compose
    except ImportError:  # pragma: no cover - the transforms room is part of stoker
        return [t]
    if type(t) is Compose and len(t.transforms) > 0:
        return list(t.transforms)
    return [t]


def measure_transforms(
    t: Any,
    images: list[np.ndarray],
    *,
    seconds: float,
    seed: int = 0,
    max_seconds: float | None = None,
) -> tuple[Stage, list[tuple[str, float, float]], list[np.ndarray]]:
    """Apply ``t`` to decoded images with the per-sample generator the loader hands it.

    Returns the stage, a per-op breakdown ``(op, wall s/sample, cpu s/sample)`` (ops of a
    Compose timed one by one on the same inputs) and the outputs of one pass.
    """
    from stoker._core.seeding import sample_rng

    rngs = [sample_rng(seed, 0, i) for i in range(len(images))]
    idx = list(range(len(images)))
    outputs: list[np.ndarray] = []

    def run(i: int) -> None:
        y = t(images[i], rngs[i])
        if len(outputs) < len(images):
            outputs.append(np.asarray(y))

    n, wall, cpu, queued, spread = time_loop(
        run, idx, seconds=seconds, min_items=min(len(idx), 8), max_seconds=max_seconds
    )
    stage = Stage(
        "augment (transforms)", "augment", n, wall, cpu, 0, type(t).__name__, queued, spread
    )
    ops = transform_ops(t)
    breakdown = _op_breakdown(ops, images, seconds=seconds, seed=seed) if len(ops) > 1 else []
    return stage, breakdown, outputs


def _op_breakdown(
    ops: list[Any], images: list[np.ndarray], *, seconds: float, seed: int
) -> list[tuple[str, float, float]]:
    """Each op's wall and CPU seconds per sample, run in order on the same inputs: at least
    64 samples (or all), then until ``seconds`` is up, at most four passes."""
    from stoker._core.seeding import sample_rng

    clock, thread_cpu = time.perf_counter, time.thread_time
    per = [[0.0, 0.0] for _ in ops]
    count = 0
    deadline = clock() + seconds
    while count < min(len(images), 64) or clock() < deadline:
        i = count % len(images)
        x = images[i]
        rng = sample_rng(seed, 0, i)
        for j, op in enumerate(ops):
            t0, c0 = clock(), thread_cpu()
            x = op(x, rng)
            per[j][0] += clock() - t0
            per[j][1] += thread_cpu() - c0
        count += 1
        if count >= 4 * len(images):
            break
    return [(type(op).__name__, w / count, c / count) for op, (w, c) in zip(ops, per)]


def measure_assemble(
    outputs: list[np.ndarray],
    *,
    batch_size: int,
    seconds: float,
    max_seconds: float | None = None,
) -> Stage | None:
    """What a worker adds per sample around the transforms: re-keying its per-sample generator
    (``SampleRngs.at``) and the write of the result into its batch slot."""
    from stoker._core.seeding import SampleRngs

    shapes = {o.shape for o in outputs}
    if not outputs or len(shapes) != 1:
        return None
    slot = np.empty((batch_size, *outputs[0].shape), dtype=outputs[0].dtype)
    slot.fill(0)  # fault the pages in now: the loader's ring is reused, not fresh memory
    idx = list(range(len(outputs)))

    at = SampleRngs(0, 0).at

    def put(i: int) -> None:
        at(i)
        np.copyto(slot[i % batch_size], outputs[i], casting="no")

    n, wall, cpu, queued, spread = time_loop(
        put, idx, seconds=seconds, min_items=min(len(idx), 8), max_seconds=max_seconds
    )
    nbytes = n * outputs[0].nbytes
    name = "assemble (rng + batch slot write)"
    return Stage(name, "loader", n, wall, cpu, nbytes, "", queued, spread)
