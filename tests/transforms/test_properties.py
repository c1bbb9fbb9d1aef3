"""Property tests: declared specs hold for any image size, including degenerate ones."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker.transforms as T
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec

# ops that accept any image size from 1x1 up
ANY_SIZE = [
    T.Resize((7, 5)),
    T.Resize(6, shorter_side=True),
    T.RandomCrop(1, padding=2),
    T.RandomResizedCrop((5, 9)),
    T.HorizontalFlip(),
    T.Rotate(30, fill=9),
    T.Shear(0.3, 0.3),
    T.Shear(0.3, 0.3, center=True),
    T.ScaleTranslate(1, 50),
    T.SineWarp((0.1, 0.5), period=0.3),
    T.GaussianBlur((0.0, 2.0)),
    T.Sharpen(),
    T.Smooth(),
    T.ColorJitter(0.5, 0.5, 0.5),
    T.Grayscale(1),
    T.Normalize((0.4, 0.5, 0.6), (0.2, 0.3, 0.4), layout="CHW"),
]


@settings(max_examples=60, deadline=None)
@given(
    h=st.integers(1, 33),
    w=st.integers(1, 33),
    op=st.sampled_from(ANY_SIZE),
    index=st.integers(0, 2**31),
)
def test_spec_holds_for_any_size(h, w, op, index):
    img = np.random.default_rng(index).integers(0, 256, (h, w, 3), dtype=np.uint8)
    spec = op.output_spec(ArraySpec(img.shape))
    out = op(img, sample_rng(0, 0, index))
    assert spec.fixed and out.shape == spec.shape and out.dtype == np.dtype(spec.dtype)
    if out.dtype == np.uint8 and isinstance(op, (T.HorizontalFlip, T.RandomCrop)):
        assert set(np.unique(out)) <= set(np.unique(img)) | {0}


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 40), w=st.integers(1, 40), index=st.integers(0, 2**31))
def test_sine_warp_only_moves_pixels_within_columns(h, w, index):
    img = np.random.default_rng(index).integers(0, 256, (h, w), dtype=np.uint8)
    out = T.SineWarp((0.1, 0.5))(img, sample_rng(1, 0, index))
    np.testing.assert_array_equal(np.sort(out, axis=0), np.sort(img, axis=0))
