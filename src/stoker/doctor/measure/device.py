"""The torch side: the pinned host-to-device copy and the model's forward + backward step, on
batches of the pipeline's output shape (torch is imported only here)."""

from __future__ import annotations

import time
from typing import Any

from stoker.doctor.resolve import resolve_model

__all__ = ["cuda_state", "time_h2d", "time_model"]


def cuda_state() -> tuple[bool, str]:
    """Whether a CUDA device is usable here, and why not."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    try:
        if torch.cuda.is_available():
            return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA query failed: {e}"
    return False, "no CUDA device on this machine"


def time_model(
    model: Any, *, batch_size: int, shape: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    """Forward + backward of ``model`` on random float32 NCHW batches of the loader's shape."""
    import torch

    m = resolve_model(model)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = m.to(dev).train()
    h, w, c = (shape + (1,))[:3] if len(shape) == 2 else shape[:3]
    x = torch.rand(batch_size, c, h, w, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step() -> None:
        out = m(x)
        t = out if isinstance(out, torch.Tensor) else out[0]
        loss = t.float().mean()
        if loss.requires_grad:
            loss.backward()
            m.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync()
    n = 0
    t0 = time.perf_counter()
    while True:
        step()
        n += 1
        if n >= 3 and time.perf_counter() - t0 >= seconds:
            break
    sync()
    step_s = (time.perf_counter() - t0) / n
    return {
        "rate": batch_size / step_s,
        "step_ms": 1e3 * step_s,
        "batch_size": batch_size,
        "source": f"--model timed on {dev.type}, forward+backward on random {tuple(x.shape)} float32",
        "steps": n,
    }


def time_h2d(
    *, batch_size: int, shape: tuple[int, ...], dtype: str, seconds: float
) -> dict[str, Any]:
    """Pinned host batch -> CUDA device copies; samples/s and GB/s."""
    import torch

    tdtype = {"uint8": torch.uint8, "float32": torch.float32, "float16": torch.float16}.get(
        dtype, torch.uint8
    )
    host = torch.empty((batch_size, *shape), dtype=tdtype).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(8):
            dev.copy_(host, non_blocking=True)
        n += 8
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    nbytes = host.numel() * host.element_size()
    return {
        "rate": n * batch_size / dt,
        "gb_per_s": n * nbytes / dt / 1e9,
        "dtype": dtype,
        "pinned": True,
        "device": torch.cuda.get_device_name(0),
    }
