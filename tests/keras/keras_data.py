"""Tiny learnable image sets and picklable test transforms for the Keras tests."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.transforms.base import Transform

POISON = 7  # an image whose every pixel is POISON makes FailOnPoison raise


def quadrant_images(
    n: int = 512, size: int = 32, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (n, size, size) noise with a bright square in quadrant ``y`` (4 classes)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 60, (n, size, size), dtype=np.uint8)
    y = rng.integers(0, 4, n).astype(np.int64)
    h = size // 2
    for i, k in enumerate(y):
        r, c = divmod(int(k), 2)
        x[i, r * h + 2 : r * h + h - 2, c * h + 2 : c * h + h - 2] = 220
    return x, y


def index_images(n: int, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Image i holds i in its first two pixels (low, high byte); label i. Traceable samples."""
    x = np.zeros((n, size, size), np.uint8)
    idx = np.arange(n)
    x[:, 0, 0] = idx % 256
    x[:, 0, 1] = idx // 256
    return x, idx.astype(np.int64)


def decode_index(images: np.ndarray, *, scale: float = 1.0) -> np.ndarray:
    """The sample indices written by ``index_images`` into (B, H, W[, 1]) images that were
    multiplied by ``scale``."""
    a = np.asarray(images, np.float64)
    if a.ndim == 4:
        a = a[..., 0]
    a = np.rint(a / scale).astype(np.int64)
    return a[:, 0, 0] + 256 * a[:, 0, 1]


@dataclass(frozen=True)
class FailOnPoison(Transform):
    """Raises ValueError on an image whose every pixel equals POISON; identity otherwise."""

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if img.min() == POISON and img.max() == POISON:
            raise ValueError("poisoned sample")
        return img

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        return in_spec


@dataclass(frozen=True)
class Sleep(Transform):
    """Identity that takes ``seconds`` per image: batches that arrive slowly."""

    seconds: float

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        time.sleep(self.seconds)
        return img

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        return in_spec
