"""The device stages: the host-to-device copy of batches of the output shape (CUDA only), and
the model's consumption (``--step-time``, or ``--model`` timed)."""

from __future__ import annotations

from typing import Any

from stoker.doctor.findings import Findings, HostToDevice
from stoker.doctor.measure.device import cuda_state, time_h2d, time_model

__all__ = ["run_h2d", "run_model"]


def run_h2d(f: Findings) -> None:
    """Fill ``f.h2d``; also with uint8 batches when the output is not uint8."""
    s, aug = f.settings, f.augment
    f.h2d = HostToDevice(None, None)
    has_cuda, why = cuda_state()
    if not (has_cuda and aug.out_shape):
        f.skip("host-to-device", why or "no sample shape")
        return
    shape = tuple(aug.out_shape)
    try:
        result = time_h2d(batch_size=s.batch_size, shape=shape, dtype=aug.out_dtype, seconds=s.half)
        f.h2d = HostToDevice(result, None)
        if aug.out_dtype != "uint8":
            u8 = time_h2d(batch_size=s.batch_size, shape=shape, dtype="uint8", seconds=s.half)
            f.h2d = HostToDevice(result, u8["rate"])
    except Exception as e:  # noqa: BLE001
        f.skip("host-to-device", f"{type(e).__name__}: {e}")


def run_model(f: Findings) -> None:
    """Fill ``f.model`` (``None`` without a model figure, with the reason)."""
    s = f.settings
    f.model = None
    if s.step_time_ms is not None:
        f.model = {
            "rate": s.batch_size / (s.step_time_ms / 1e3),
            "step_ms": float(s.step_time_ms),
            "batch_size": s.batch_size,
            "source": "--step-time",
        }
    elif s.model is None:
        f.skip("model", "give --step-time MS or --model module:attr for the GPU busy share")
    elif not f.augment.out_shape:
        f.skip("model", "no decoded sample to take the batch shape from")
    elif s.left() <= 0:
        f.cut("model")
    else:
        f.model = _timed_model(f, tuple(f.augment.out_shape))


def _timed_model(f: Findings, shape: tuple[int, ...]) -> dict[str, Any] | None:
    s = f.settings
    try:
        return time_model(s.model, batch_size=s.batch_size, shape=shape, seconds=s.step)
    except ImportError as e:
        f.skip("model", f"timing --model needs torch ({e})")
    except RuntimeError as e:  # the model refused the batch (shape, device, ...)
        f.skip(
            "model",
            f"the model failed on a random batch of {s.batch_size} x "
            f"{'x'.join(map(str, shape))} (as NCHW float32): {e}",
        )
    return None
