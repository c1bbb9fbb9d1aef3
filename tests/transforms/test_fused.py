"""The fused resize → crop → flip op: the pixels and the draws of the plain chain, for less
work (only the window the crop keeps is resized)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from stoker._core.seeding import sample_rng
from stoker.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    RandomResizedCrop,
    Resize,
)
from stoker.transforms.fused import FusedCrop, _axis_window, fuse, mirror, window_resize

from .conftest import make_image

# The chains of docs/transforms.md ("Fused chains"), on the image sizes they are used with.
CHAINS = [
    ((112, 112), [Resize(128), RandomCrop(112), HorizontalFlip()]),
    ((224, 224), [Resize(256), RandomCrop(224), HorizontalFlip()]),
    ((112, 112), [Resize((146, 146)), RandomCrop(128), HorizontalFlip()]),  # seed000
    ((375, 500), [Resize(128, shorter_side=True), RandomCrop(112), HorizontalFlip(p=0.3)]),
    ((400, 500), [Resize(256, shorter_side=True), CenterCrop(224)]),
    ((256, 256), [Resize(128), CenterCrop(112), HorizontalFlip(p=1.0)]),
    ((400, 500), [RandomResizedCrop(224), HorizontalFlip()]),
    ((60, 70), [RandomCrop((32, 48)), HorizontalFlip()]),
]


def _reference(img, out_hw, top, left, crop_hw):
    full = cv2.resize(img, (out_hw[1], out_hw[0]), interpolation=cv2.INTER_LINEAR)
    if full.ndim < img.ndim:
        full = full[:, :, None]
    return full[top : top + crop_hw[0], left : left + crop_hw[1]]


@pytest.mark.parametrize(("hw", "steps"), CHAINS, ids=lambda v: repr(v)[:40])
def test_fused_chain_gives_the_plain_chains_pixels_and_draws(hw, steps):
    chain = Compose(steps)
    found = fuse(list(steps))
    assert found is not None and found[1] == len(steps)
    fused = found[0]
    for i in range(40):
        img = make_image(*hw, seed=i)
        r1, r2 = sample_rng(3, 1, i), sample_rng(3, 1, i)
        want = chain(img, r1)
        got = fused(img, r2)
        np.testing.assert_array_equal(got, want)
        # the same draws: the generators go on with the same stream afterwards
        assert r1.integers(0, 2**62) == r2.integers(0, 2**62)


@pytest.mark.parametrize("channels", [None, 1, 3])
def test_grey_and_single_channel_images_keep_their_shape(channels):
    img = make_image(50, 60, channels=channels)
    chain = Compose([Resize(64), RandomCrop(56), HorizontalFlip(p=1.0)])
    fused = FusedCrop(RandomCrop(56), Resize(64), HorizontalFlip(p=1.0))
    want = chain(img, sample_rng(0, 0, 0))
    got = fused(img, sample_rng(0, 0, 0))
    assert got.shape == want.shape == (56, 56, *img.shape[2:])
    np.testing.assert_array_equal(got, want)


def test_window_resize_is_the_whole_resize_on_the_issue_sizes():
    """Bit for bit on the ratios of the documented chains (7/8, 1/2, 128/375 x 170/500)."""
    rng = np.random.default_rng(0)
    cases = [
        ((112, 112), (128, 128), (112, 112)),
        ((224, 224), (256, 256), (224, 224)),
        ((256, 256), (128, 128), (112, 112)),
        ((375, 500), (128, 170), (112, 112)),
    ]
    for src, out, crop in cases:
        for _ in range(60):
            img = rng.integers(0, 256, (*src, 3), np.uint8)
            top = int(rng.integers(0, out[0] - crop[0] + 1))
            left = int(rng.integers(0, out[1] - crop[1] + 1))
            got = window_resize(img, out, top, left, crop)
            np.testing.assert_array_equal(got, _reference(img, out, top, left, crop))


def test_window_resize_stays_within_one_level_on_any_ratio():
    """Any sizes and crops: at most 1 level off, on a tiny share of values (cv2 computes a
    sample's position from its index in the window, not in the whole image: the float
    rounding of the weight can land one step apart). The figures are in docs/transforms.md."""
    rng = np.random.default_rng(1)
    total = off = windowed = 0
    for _ in range(600):
        sh, sw = (int(v) for v in rng.integers(8, 300, 2))
        rh, rw = (int(v) for v in rng.integers(8, 300, 2))
        ch, cw = int(rng.integers(1, rh + 1)), int(rng.integers(1, rw + 1))
        top, left = int(rng.integers(0, rh - ch + 1)), int(rng.integers(0, rw - cw + 1))
        windowed += bool(_axis_window(sh, rh, top, ch) or _axis_window(sw, rw, left, cw))
        img = rng.integers(0, 256, (sh, sw, 3), np.uint8)
        got = window_resize(img, (rh, rw), top, left, (ch, cw))
        want = _reference(img, (rh, rw), top, left, (ch, cw))
        assert got.shape == want.shape
        d = np.abs(got.astype(np.int16) - want)
        assert d.max() <= 1
        total += d.size
        off += int(d.sum())
    assert windowed > 200  # the window path was taken, not only the whole resize
    assert off / total < 1e-3


def test_the_window_resizes_fewer_pixels():
    # 112 -> 128, crop 112: a 120-pixel window (105 source pixels) at 16 of the 17 offsets;
    # the whole resize at the one where the window would need a period more on the left
    sizes = [_axis_window(112, 128, off, 112) for off in range(17)]
    assert [s[1:3] if s else None for s in sizes].count((105, 120)) == 16
    # ratios whose period is longer than the crop leave nothing to save: the whole resize
    assert _axis_window(375, 128, 8, 112) is None
    # a window covers what it keeps: kept output [off, off + k) inside its output
    for n, m, off, k in [(500, 170, 30, 112), (112, 128, 9, 112), (224, 256, 32, 224)]:
        start, length, out, skip = _axis_window(n, m, off, k)
        assert start % (n // np.gcd(n, m)) == 0 and skip >= 0 and skip + k <= out
        assert out * n == length * m and start + length <= n


def test_fuse_takes_only_what_it_reproduces():
    assert fuse([Resize(128), RandomCrop(112)])[1] == 2
    assert fuse([RandomResizedCrop(224), HorizontalFlip(), Normalize()])[1] == 2
    assert fuse([CenterCrop(10), ColorJitter(0.2)])[1] == 1
    assert fuse([Resize(128, interpolation="area"), RandomCrop(112)]) is None
    assert fuse([Resize(128), RandomCrop(112, padding=4)]) is None
    assert fuse([Resize(256), RandomResizedCrop(224)]) is None
    assert fuse([Resize(128)]) is None
    assert fuse([HorizontalFlip(), RandomCrop(8)]) is None


def test_mirror_writes_into_the_given_row():
    img = make_image(9, 13)
    row = np.zeros_like(img)
    assert mirror(img[1:8, 2:11], row[1:8, 2:11].copy()) is not None
    out = np.empty((7, 9, 3), np.uint8)
    assert mirror(img[1:8, 2:11], out) is out
    np.testing.assert_array_equal(out, img[1:8, 2:11][:, ::-1])
