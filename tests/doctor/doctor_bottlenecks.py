"""Pipelines with a known bottleneck, for the doctor's tests (module-level: the loader's
worker processes import them by name)."""

from __future__ import annotations

import os
import time

import numpy as np
import simplejpeg

from stoker._core.specs import ArraySpec
from stoker.transforms.base import Transform


def make_folder(
    root, *, n: int, size: int | tuple[int, int], classes: int = 2, seed: int = 0
) -> str:
    """``n`` real JPEGs of ``size`` x ``size`` (or ``(height, width)``), one subfolder per class."""
    rng = np.random.default_rng(seed)
    h, w = (size, size) if isinstance(size, int) else size
    for i in range(n):
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        with open(os.path.join(d, f"{i:05d}.jpg"), "wb") as f:
            f.write(simplejpeg.encode_jpeg(img, quality=90))
    return str(root)


class SleepyCrop(Transform):
    """A known augmentation cost: sleeps ``ms`` per sample, then crops to ``size``."""

    def __init__(self, ms: float, size: int) -> None:
        self.ms = ms
        self.size = size

    def __call__(self, img, rng):
        time.sleep(self.ms / 1e3)
        return np.ascontiguousarray(img[: self.size, : self.size])

    def output_spec(self, in_spec):
        return ArraySpec((self.size, self.size, 3), "uint8")


class Fixed(Transform):
    """Nearly free: declares the (fixed) image size so that the loader can allocate slots."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img, rng):
        return img

    def output_spec(self, in_spec):
        return ArraySpec((self.size, self.size, 3), "uint8")


FIXED8 = Fixed(8)
FIXED16 = Fixed(16)


def make_sleepy_model():
    """For ``--model test_diagnose:make_sleepy_model``: a step that takes 40 ms."""
    import torch

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            time.sleep(0.04)
            return x.mean() * self.w

    return Sleepy()


_stalled = False


def stuck_in_a_worker_transform() -> None:
    time.sleep(1.5)


class StallOnce(Transform):
    """Hangs for 1.5 s on its first sample in each worker process (an injected stall)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img, rng):
        global _stalled
        if not _stalled:
            _stalled = True
            stuck_in_a_worker_transform()
        return img

    def output_spec(self, in_spec):
        return ArraySpec((self.size, self.size, 3), "uint8")
