"""Filters and colour ops against PIL and float references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageFilter

import stoker.transforms as T
from stoker._core.errors import SpecError
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec
from stoker.transforms.color import adjust_brightness, adjust_contrast, adjust_saturation

RNG = np.random.default_rng(0)


def per_channel_pil(img: np.ndarray, fn) -> np.ndarray:
    """Apply a PIL function to an HW / HWC image, channel by channel."""
    if img.ndim == 2:
        return np.asarray(fn(Image.fromarray(img)))
    planes = [
        np.asarray(fn(Image.fromarray(np.ascontiguousarray(img[:, :, c]))))
        for c in range(img.shape[2])
    ]
    return np.stack(planes, axis=-1)


@pytest.mark.parametrize(
    "op, kernel", [(T.Sharpen(), ImageFilter.SHARPEN), (T.Smooth(), ImageFilter.SMOOTH)]
)
def test_sharpen_and_smooth_match_pil_within_one_level(any_image, op, kernel):
    ours = op(any_image, RNG).astype(int)
    ref = per_channel_pil(any_image, lambda im: im.filter(kernel)).astype(int)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1
    np.testing.assert_array_equal(ours[0], any_image[0])  # PIL leaves the frame as it was


def gaussian_reference(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable float Gaussian, radius ceil(3 sigma), edges repeated."""
    r = max(1, math.ceil(3 * sigma))
    x = np.arange(-r, r + 1)
    k = np.exp(-(x**2) / (2 * sigma**2))
    k /= k.sum()
    src = img.astype(np.float64)
    if src.ndim == 2:
        src = src[:, :, None]
    p = np.pad(src, ((r, r), (r, r), (0, 0)), mode="edge")
    h, w = img.shape[:2]
    rows = sum(k[i] * p[i : i + h] for i in range(2 * r + 1))
    out = sum(k[i] * rows[:, i : i + w] for i in range(2 * r + 1))
    return out.reshape(img.shape)


@pytest.mark.parametrize("sigma", [0.5, 0.8, 1.2])
def test_gaussian_blur_matches_a_float_gaussian(any_image, sigma):
    ours = T.GaussianBlur((sigma, sigma))(any_image, RNG)
    assert np.abs(ours - gaussian_reference(any_image, sigma)).max() <= 1.5
    # PIL approximates the Gaussian with box blurs; the two stay close
    pil = per_channel_pil(any_image, lambda im: im.filter(ImageFilter.GaussianBlur(sigma)))
    assert np.abs(ours.astype(int) - pil).mean() < 1.5


def test_gaussian_blur_radius_range():
    radii = [T.GaussianBlur((0.5, 1.2)).params((8, 8), sample_rng(0, 0, i)) for i in range(1000)]
    assert 0.5 <= min(radii) < 0.52 and 1.18 < max(radii) <= 1.2


@pytest.mark.parametrize("factor", [0.0, 0.6, 1.0, 1.45])
@pytest.mark.parametrize(
    "ours, pil",
    [
        (adjust_brightness, ImageEnhance.Brightness),
        (adjust_contrast, ImageEnhance.Contrast),
        (adjust_saturation, ImageEnhance.Color),
    ],
)
def test_colour_adjustments_match_pil_image_enhance(rgb, ours, pil, factor):
    ref = np.asarray(pil(Image.fromarray(rgb)).enhance(factor)).astype(int)
    assert np.abs(ours(rgb, factor).astype(int) - ref).max() <= 1


def test_colour_jitter_factors_and_order():
    op = T.ColorJitter(brightness=0.4, contrast=(0.5, 0.9), saturation=0)
    orders = set()
    for i in range(500):
        params = op.params((8, 8), sample_rng(0, 0, i))
        assert sorted(w for w, _ in params) == [0, 1]  # saturation disabled
        f = dict(params)
        assert 0.6 <= f[0] <= 1.4 and 0.5 <= f[1] <= 0.9
        orders.add(tuple(w for w, _ in params))
    assert orders == {(0, 1), (1, 0)}


def test_colour_jitter_applies_its_params(rgb):
    op = T.ColorJitter(0.3, 0.3, 0.3)
    for i in range(5):
        img = rgb
        for which, f in op.params(rgb.shape[:2], sample_rng(1, 0, i)):
            img = (adjust_brightness, adjust_contrast, adjust_saturation)[which](img, f)
        np.testing.assert_array_equal(op(rgb, sample_rng(1, 0, i)), img)
    np.testing.assert_array_equal(T.ColorJitter()(rgb, RNG), rgb)
    with pytest.raises(SpecError, match="uint8"):
        T.ColorJitter(0.1).output_spec(ArraySpec((4, 4, 3), "float32"))


def test_grayscale_matches_pil_convert_l(rgb):
    ref = np.asarray(Image.fromarray(rgb).convert("L")).astype(int)
    one = T.Grayscale(1)(rgb, RNG)
    three = T.Grayscale(3)(rgb, RNG)
    assert one.shape == (40, 48, 1) and three.shape == (40, 48, 3)
    assert np.abs(one[:, :, 0].astype(int) - ref).max() <= 1
    for c in range(3):
        np.testing.assert_array_equal(three[:, :, c], one[:, :, 0])


def test_grayscale_of_grey_inputs(gray):
    assert T.Grayscale(1)(gray, RNG).shape == gray.shape
    np.testing.assert_array_equal(T.Grayscale(3)(gray, RNG)[:, :, 1], gray)


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("mean, std", [(0.5, 0.5), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
def test_normalize_is_the_float_formula(rgb, layout, mean, std):
    op = T.Normalize(mean, std, layout=layout)
    ref = (rgb.astype(np.float64) / 255 - np.asarray(mean)) / np.asarray(std)
    if layout == "CHW":
        ref = ref.transpose(2, 0, 1)
    out = op(rgb, RNG)
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
    assert op.output_spec(ArraySpec(rgb.shape)) == ArraySpec(ref.shape, "float32")


@pytest.mark.parametrize("stats", [(0.5, 0.5), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
def test_normalize_write_gives_the_ops_bits_in_either_layout(any_image, stats):
    op = T.Normalize(*stats) if any_image.ndim == 3 and any_image.shape[2] == 3 else T.Normalize()
    hwc = op(any_image, RNG)
    chw = T.Normalize(op.mean, op.std, layout="CHW")(any_image, RNG)
    planes = hwc.reshape(*any_image.shape[:2], -1).transpose(2, 0, 1)
    np.testing.assert_array_equal(chw, planes)  # bit for bit, not within a tolerance
    dest = np.full((planes.shape[0] + 1, *planes.shape[1:]), np.nan, np.float32)
    op.write(any_image, dest[1:], chw=True)  # a batch row: a view into a larger array
    np.testing.assert_array_equal(dest[1:], planes)
    assert np.isnan(dest[0]).all()  # nothing written outside the row
    wide = np.zeros((*hwc.shape[:1], hwc.shape[1] + 4, *hwc.shape[2:]), np.float32)
    op.write(any_image, wide[:, 2:-2], chw=False)  # a non-contiguous destination
    np.testing.assert_array_equal(wide[:, 2:-2], hwc)
    assert not wide[:, :2].any() and not wide[:, -2:].any()
    with pytest.raises(TypeError, match="uint8 in and float32 out"):
        op.write(any_image.astype(np.float32), hwc.copy(), chw=False)


@pytest.mark.parametrize("channels", [3, 4, 5])
def test_normalize_rounds_every_level_once_in_either_layout(channels):
    # uint8 input becomes x * gain + bias per channel (the op's float32 gain and bias), each
    # value rounded once from the exact result, whichever layout and whichever OpenCV or
    # NumPy pass makes it (5 channels are past what cv2.transform takes)
    levels = np.arange(256, dtype=np.uint8)
    img = np.stack([np.roll(levels, 37 * k) for k in range(channels)], -1).reshape(16, 16, -1)
    mean = tuple(0.40 + 0.03 * k for k in range(channels))
    std = tuple(0.20 + 0.01 * k for k in range(channels))
    op = T.Normalize(mean, std)
    gain, bias = np.asarray(op._gain, np.float64), np.asarray(op._bias, np.float64)
    assert (gain.astype(np.float32) == gain).all() and (bias.astype(np.float32) == bias).all()
    want = (img * gain + bias).astype(np.float32)
    np.testing.assert_array_equal(op(img, RNG), want)
    chw = T.Normalize(mean, std, layout="CHW")(img, RNG)
    np.testing.assert_array_equal(chw, want.transpose(2, 0, 1))
    exact = (img.astype(np.float64) / 255 - np.asarray(mean)) / np.asarray(std)
    np.testing.assert_allclose(want, exact, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_normalize_keeps_to_the_formulas_range(layout):
    # (x/255 - 0.5)/0.5 spans [-1, 1]: the darkest and brightest levels land within a float32
    # step of the ends and never past them (a gain rounded up would give 1.0000001)
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    out = T.Normalize(0.5, 0.5, layout=layout)(levels, RNG)
    assert -1.0 <= out.min() <= -1.0 + 1e-6 and 1.0 - 1e-6 <= out.max() <= 1.0


@pytest.mark.parametrize("shape", [(112, 112, 3), (7, 5, 4), (224, 200, 3)])
def test_normalize_scratch_planes_never_share_their_offset_from_a_vector_boundary(shape):
    # cv2.split writes planes whose rows share their offset modulo its vector size with a
    # store 10-20x slower; separate arrays shared it by the luck of the heap. Every row of the
    # planes Normalize splits into must sit at a different offset from every 16/32/64-byte
    # boundary than the same row of the other planes, and the split must land in them.
    from stoker.transforms import color

    h, w, c = shape
    planes = color._skewed_planes(h, w, c)
    assert [p.shape for p in planes] == [(h, w)] * c
    for row in range(h):
        for vec in (16, 32, 64):
            offsets = [p[row].ctypes.data % vec for p in planes]
            assert len(set(offsets)) == c, (row, vec, offsets)
    starts = sorted(p.ctypes.data for p in planes)
    assert all(b - a >= h * w for a, b in zip(starts, starts[1:]))  # no overlap
    img = np.random.default_rng(1).integers(0, 256, (h + 4, w + 4, c), dtype=np.uint8)
    crop = img[2 : 2 + h, 2 : 2 + w]  # a view, as RandomCrop gives it
    color.cv2().split(crop, planes)
    for k in range(c):
        np.testing.assert_array_equal(planes[k], crop[:, :, k])
    assert color._scratch_planes(h, w, c) is color._scratch_planes(h, w, c)


def test_normalize_float_inputs_grey_and_errors(gray):
    out = T.Normalize(0.5, 0.5)(gray, RNG)
    np.testing.assert_allclose(out, gray / 127.5 - 1, atol=1e-5)
    assert T.Normalize(0.5, 0.5, layout="CHW")(gray, RNG).shape == (1, 40, 48)
    fl = gray.astype(np.float32)
    np.testing.assert_allclose(T.Normalize(0.5, 0.5)(fl, RNG), out, atol=1e-5)
    half = T.Normalize(0.5, 0.5, dtype="float16")(gray, RNG)
    assert half.dtype == np.float16
    with pytest.raises(SpecError, match="3 values, image"):
        T.Normalize((0.1, 0.2, 0.3), (1, 1, 1))(gray, RNG)
    with pytest.raises(SpecError, match="3 values"):
        T.Normalize((0.1, 0.2, 0.3), (1, 1, 1)).output_spec(ArraySpec((4, 4, 1)))
    with pytest.raises(ValueError, match="std must not contain 0"):
        T.Normalize(0.5, 0.0)
    with pytest.raises(ValueError, match="layout"):
        T.Normalize(layout="NHWC")


@pytest.mark.parametrize("shape", [(16, 16, 3), (37, 7, 3), (9, 36, 3), (65, 7, 4)])
def test_normalize_chw_gives_the_uint8_pass_bits_at_any_plane_size(shape):
    # a plane of a multiple of 64 values is converted into the row and scaled there in place;
    # any other keeps the one pass from the uint8 plane, whose last values OpenCV's in-place
    # float pass would round twice: either way the bits of cv2.addWeighted from uint8
    import cv2

    h, w, c = shape
    img = np.random.default_rng(3).integers(0, 256, (h + 2, w + 3, c), dtype=np.uint8)
    img = img[1 : 1 + h, 2 : 2 + w]  # a crop's view
    op = T.Normalize(
        tuple(0.40 + 0.03 * k for k in range(c)), tuple(0.2 + 0.01 * k for k in range(c))
    )
    got = np.empty((c, h, w), np.float32)
    op.write(img, got, chw=True)
    for k in range(c):
        plane = np.ascontiguousarray(img[:, :, k])
        want = cv2.addWeighted(plane, op._gain[k], plane, 0.0, op._bias[k], dtype=cv2.CV_32F)
        np.testing.assert_array_equal(got[k], want)
