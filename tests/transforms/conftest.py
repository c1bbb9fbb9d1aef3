"""Small real images for the transform tests (non-square, so height/width mix-ups show)."""

from __future__ import annotations

import numpy as np
import pytest


def make_image(h: int = 40, w: int = 48, channels: int | None = 3, seed: int = 0) -> np.ndarray:
    """A smooth colour pattern with noise: every pixel differs from its neighbours."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [x * 255 / w, y * 255 / h, 128 + 90 * np.sin(x / 3.0) * np.cos(y / 4.0)]
    img = np.stack(planes, axis=-1) + rng.normal(0, 18, (h, w, 3))
    img = np.clip(img, 0, 255).astype(np.uint8)
    if channels is None:
        return np.ascontiguousarray(img[:, :, 0])
    if channels == 1:
        return np.ascontiguousarray(img[:, :, :1])
    return img


@pytest.fixture
def rgb() -> np.ndarray:
    return make_image()


@pytest.fixture
def gray() -> np.ndarray:
    return make_image(channels=None)


@pytest.fixture(params=["HW", "HWC1", "HWC3"])
def any_image(request) -> np.ndarray:
    return make_image(channels={"HW": None, "HWC1": 1, "HWC3": 3}[request.param])
