"""Geometric ops against independent computations (slicing, NumPy float references, PIL)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

import stoker.transforms as T
from stoker._core.errors import SpecError
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec

from .conftest import make_image

RNG = np.random.default_rng(0)


def draws(op, shape, n=2000):
    return [op.params(shape, sample_rng(0, 0, i)) for i in range(n)]


# ---------------------------------------------------------------- Resize


def bilinear_reference(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Float bilinear with pixel-centre alignment and edge clamping (cv2/PIL upscale rule)."""
    src = img.astype(np.float64)
    if src.ndim == 2:
        src = src[:, :, None]
    sy = (np.arange(h) + 0.5) * img.shape[0] / h - 0.5
    sx = (np.arange(w) + 0.5) * img.shape[1] / w - 0.5
    sy = np.clip(sy, 0, img.shape[0] - 1)
    sx = np.clip(sx, 0, img.shape[1] - 1)
    y0 = np.floor(sy).astype(int)
    x0 = np.floor(sx).astype(int)
    y1 = np.minimum(y0 + 1, img.shape[0] - 1)
    x1 = np.minimum(x0 + 1, img.shape[1] - 1)
    fy = (sy - y0)[:, None, None]
    fx = (sx - x0)[None, :, None]
    top = src[y0][:, x0] * (1 - fx) + src[y0][:, x1] * fx
    bot = src[y1][:, x0] * (1 - fx) + src[y1][:, x1] * fx
    out = top * (1 - fy) + bot * fy
    return out.reshape((h, w) + img.shape[2:])


@pytest.mark.parametrize("target", [(60, 72), (53, 61), (40, 48), (31, 70)])
def test_resize_bilinear_within_one_level_of_float_reference(any_image, target):
    out = T.Resize(target)(any_image, sample_rng(0, 0, 0))
    ref = bilinear_reference(any_image, *target)
    assert out.shape == ref.shape
    assert np.abs(out.astype(np.float64) - ref).max() <= 1.0


def test_resize_area_integer_factor_is_block_mean(any_image):
    out = T.Resize((20, 12), interpolation="area")(any_image, sample_rng(0, 0, 0))
    blocks = any_image.astype(np.float64).reshape(20, 2, 12, 4, *any_image.shape[2:])
    ref = blocks.mean(axis=(1, 3))
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() <= 1.0


@pytest.mark.parametrize(
    ("target", "expected"),
    [((20, 12), "area"), ((20, 40), "area"), ((21, 25), "bilinear"), ((60, 72), "bilinear")],
)
def test_resize_auto_averages_areas_from_2x_shrink_else_bilinear(any_image, target, expected):
    # any_image is 40x48: (20, 12) and (20, 40) halve a side, (21, 25) shrinks < 2x, (60, 72)
    # enlarges.
    out = T.Resize(target, interpolation="auto")(any_image, RNG)
    ref = T.Resize(target, interpolation=expected)(any_image, RNG)
    other = T.Resize(target, interpolation="bilinear" if expected == "area" else "area")
    np.testing.assert_array_equal(out, ref)
    assert not np.array_equal(out, other(any_image, RNG))


def test_resize_shorter_side_keeps_aspect_like_torchvision():
    op = T.Resize(20, shorter_side=True)
    assert op(make_image(30, 50), RNG).shape == (20, 33, 3)  # int(20 * 50 / 30)
    assert op(make_image(50, 30), RNG).shape == (33, 20, 3)
    assert op.output_spec(ArraySpec((30, 50, 3))) == ArraySpec((20, 33, 3))
    assert op.output_spec(ArraySpec((None, 50, 3))) == ArraySpec((None, None, 3))
    assert T.Resize(20).output_spec(ArraySpec((None, None))) == ArraySpec((20, 20))


def test_resize_rejects_bad_arguments():
    with pytest.raises(ValueError, match="interpolation"):
        T.Resize(10, interpolation="cubic-ish")
    with pytest.raises(TypeError, match="shorter_side"):
        T.Resize((10, 12), shorter_side=True)
    with pytest.raises(ValueError, match="positive"):
        T.Resize(0)


# ---------------------------------------------------------------- crops


def test_random_crop_is_the_slice_at_its_params(any_image):
    op = T.RandomCrop((25, 30))
    for i in range(20):
        top, left = op.params(any_image.shape[:2], sample_rng(1, 0, i))
        out = op(any_image, sample_rng(1, 0, i))
        np.testing.assert_array_equal(out, any_image[top : top + 25, left : left + 30])


def test_random_crop_reaches_every_position_evenly():
    op = T.RandomCrop(10)
    got = draws(op, (12, 13), 1500)
    tops = np.bincount([t for t, _ in got], minlength=3)
    lefts = np.bincount([left for _, left in got], minlength=4)
    assert len(tops) == 3 and len(lefts) == 4  # never past the last position
    # each position about as often as the others (500 and 375 expected; sd about 18 and 17)
    assert tops.min() > 400 and lefts.min() > 290, (tops, lefts)


def test_random_crop_padding_fills_the_border(rgb):
    op = T.RandomCrop(rgb.shape[:2], padding=4, fill=(9, 8, 7))
    padded = np.stack(
        [np.pad(rgb[:, :, c], 4, constant_values=v) for c, v in enumerate((9, 8, 7))], -1
    )
    seen = set()
    for i in range(200):
        top, left = op.params(rgb.shape[:2], sample_rng(2, 0, i))
        seen.add((top, left))
        out = op(rgb, sample_rng(2, 0, i))
        np.testing.assert_array_equal(out, padded[top : top + 40, left : left + 48])
    assert (0, 0) in seen and (8, 8) in seen


def test_crop_too_large_is_a_clear_error(rgb):
    with pytest.raises(SpecError, match=r"input 40x48 \(HxW\) is smaller than the crop 41x41"):
        T.RandomCrop(41)(rgb, sample_rng(0, 0, 0))
    with pytest.raises(SpecError, match="smaller than the crop"):
        T.RandomCrop(41).output_spec(ArraySpec((40, 48, 3)))
    with pytest.raises(SpecError, match="smaller than the crop"):
        T.CenterCrop((20, 50))(rgb, RNG)


def test_center_crop_matches_torchvision_rounding(any_image):
    out = T.CenterCrop((31, 17))(any_image, RNG)
    top, left = int(round((40 - 31) / 2)), int(round((48 - 17) / 2))
    np.testing.assert_array_equal(out, any_image[top : top + 31, left : left + 17])


def test_random_resized_crop_params_respect_scale_and_ratio():
    op = T.RandomResizedCrop(16, scale=(0.2, 0.7), ratio=(0.5, 2.0))
    for top, left, h, w in draws(op, (90, 120), 500):
        assert 0 <= top <= 90 - h and 0 <= left <= 120 - w
        assert 0.2 * 0.9 <= h * w / (90 * 120) <= 0.7 * 1.1
        assert 0.5 * 0.9 <= w / h <= 2.0 * 1.1


def test_random_resized_crop_falls_back_to_a_centre_crop():
    op = T.RandomResizedCrop(16, scale=(1.0, 1.0), ratio=(3.0, 4.0))
    # a full-area crop with w/h >= 3 never fits a square: the clamped centre crop is used
    assert op.params((60, 60), sample_rng(0, 0, 0)) == (20, 0, 20, 60)


def test_random_resized_crop_is_resize_of_its_crop(rgb):
    op = T.RandomResizedCrop((20, 24))
    for i in range(10):
        top, left, h, w = op.params(rgb.shape[:2], sample_rng(4, 0, i))
        expected = T.Resize((20, 24))(rgb[top : top + h, left : left + w], RNG)
        np.testing.assert_array_equal(op(rgb, sample_rng(4, 0, i)), expected)


# ---------------------------------------------------------------- flip


def test_flip_mirrors_and_respects_p(any_image):
    np.testing.assert_array_equal(
        T.HorizontalFlip(1.0)(any_image, sample_rng(0, 0, 0)), any_image[:, ::-1]
    )
    assert T.HorizontalFlip(0.0)(any_image, sample_rng(0, 0, 0)) is any_image
    op = T.HorizontalFlip(0.3)
    flips = sum(
        not np.array_equal(op(any_image, sample_rng(0, 0, i)), any_image) for i in range(2000)
    )
    assert 0.26 < flips / 2000 < 0.34
    with pytest.raises(ValueError, match="p must lie in"):
        T.HorizontalFlip(1.5)


def test_flip_of_a_crop_view_is_a_contiguous_mirror(any_image):
    view = any_image[3:30, 5:41]
    before = any_image.copy()
    out = T.HorizontalFlip(1.0)(view, RNG)
    np.testing.assert_array_equal(out, view[:, ::-1])
    assert out.flags.c_contiguous and out.shape == view.shape
    np.testing.assert_array_equal(any_image, before)  # the input is not written


# ---------------------------------------------------------------- rotate and shear


def marker_image(h=41, w=51, at=(5, 30)) -> np.ndarray:
    img = np.zeros((h, w), np.uint8)
    img[at] = 255
    return img


@pytest.mark.parametrize("angle", [-30.0, -7.5, 12.0, 90.0])
def test_rotate_moves_a_marker_counter_clockwise(angle):
    h, w, (my, mx) = 41, 51, (5, 30)
    out = T.Rotate((angle, angle))(marker_image(h, w, (my, mx)), RNG)
    cy, cx = (h - 1) / 2, (w - 1) / 2
    a = math.radians(angle)
    dx, dy = mx - cx, my - cy  # y grows downwards: counter-clockwise on screen
    ex = cx + dx * math.cos(a) + dy * math.sin(a)
    ey = cy - dx * math.sin(a) + dy * math.cos(a)
    ys, xs = np.nonzero(out)
    assert len(ys) >= 1
    assert abs(ys.mean() - ey) <= 1.0 and abs(xs.mean() - ex) <= 1.0


@pytest.mark.parametrize("angle", [-13.7, 4.2, 15.0])
def test_rotate_matches_pil_rotate(rgb, angle):
    ours = T.Rotate((angle, angle))(rgb, RNG)
    pil = np.asarray(Image.fromarray(rgb).rotate(angle))
    assert np.mean(np.all(ours == pil, axis=-1)) > 0.99


def test_rotate_angles_cover_the_range_and_stay_inside():
    angles = draws(T.Rotate(15), (8, 8), 2000)
    assert -15 <= min(angles) < -14.5 and 14.5 < max(angles) <= 15
    angles = draws(T.Rotate((-30, 5)), (8, 8), 500)
    assert -30 <= min(angles) and max(angles) <= 5


@pytest.mark.parametrize("interp", ["area", "lanczos", "auto"])
def test_affine_ops_refuse_resize_only_interpolations(interp):
    for op in (T.Rotate, T.Shear):
        with pytest.raises(ValueError, match="nearest, bilinear or bicubic"):
            op(10 if op is T.Rotate else 0.1, interpolation=interp)


def test_rotate_fills_corners():
    img = np.full((30, 30, 3), 100, np.uint8)
    out = T.Rotate((45, 45), fill=(1, 2, 3))(img, RNG)
    np.testing.assert_array_equal(out[0, 0], [1, 2, 3])
    np.testing.assert_array_equal(out[15, 15], [100, 100, 100])


def shear_reference(img, sx, sy, fill=0):
    """PIL AFFINE (1, sx, 0, sy, 1, 0) with nearest: sample at floor(continuous coordinate)."""
    h, w = img.shape[:2]
    y, x = np.mgrid[0:h, 0:w] + 0.5
    xin = np.floor(x + sx * y).astype(int)
    yin = np.floor(sy * x + y).astype(int)
    inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    out = np.full_like(img, fill)
    out[inside] = img[yin[inside], xin[inside]]
    return out


@pytest.mark.parametrize("sx, sy", [(0.137, -0.171), (-0.193, 0.0713), (0.0, 0.1812)])
def test_shear_matches_pil_affine_semantics(any_image, sx, sy):
    ours = T.Shear((sx, sx), (sy, sy))(any_image, RNG)
    ref = shear_reference(any_image, sx, sy)
    same = ours == ref
    assert (np.all(same, axis=-1) if same.ndim == 3 else same).mean() > 0.99
    pil_in = any_image if any_image.ndim == 2 else any_image[:, :, 0]
    pil = np.asarray(
        Image.fromarray(pil_in).transform(
            pil_in.shape[::-1], Image.Transform.AFFINE, (1, sx, 0, sy, 1, 0)
        )
    )
    ours0 = ours if ours.ndim == 2 else ours[:, :, 0]
    assert (ours0 == pil).mean() > 0.99


def test_shear_about_the_centre_keeps_the_centre(rgb):
    img = make_image(41, 41)
    out = T.Shear((0.2, 0.2), (-0.2, -0.2), center=True)(img, RNG)
    np.testing.assert_array_equal(out[20, 20], img[20, 20])
    assert not np.array_equal(out, img)


def test_shear_factors_stay_in_range():
    got = draws(T.Shear(0.2, (0.0, 0.1)), (8, 8), 1000)
    sx = [a for a, _ in got]
    sy = [b for _, b in got]
    assert -0.2 <= min(sx) < -0.18 and 0.18 < max(sx) <= 0.2
    assert 0.0 <= min(sy) and max(sy) <= 0.1


# ---------------------------------------------------------------- scale and translate


def test_scale_translate_pastes_the_shrunk_image_on_fill(any_image):
    op = T.ScaleTranslate(12, 30, fill=5)
    for i in range(30):
        top, left, h, w = op.params(any_image.shape[:2], sample_rng(6, 0, i))
        out = op(any_image, sample_rng(6, 0, i))
        small = T.Resize((h, w), interpolation="auto")(any_image, RNG)
        np.testing.assert_array_equal(out[top : top + h, left : left + w], small)
        mask = np.ones(out.shape[:2], bool)
        mask[top : top + h, left : left + w] = False
        assert np.all(out[mask] == 5)


def test_scale_translate_sizes_and_offsets_cover_their_ranges():
    op = T.ScaleTranslate(25, 63)  # the seed's randrange(25, 63) on 64x64
    got = draws(op, (64, 64), 3000)
    hs = {h for _, _, h, _ in got}
    assert min(hs) == 25 and max(hs) == 62
    tops = [t for t, _, h, _ in got if h == 60]
    assert set(tops) == {0, 1, 2, 3, 4}
    for top, left, h, w in got:
        assert 0 <= top <= 64 - h and 0 <= left <= 64 - w


def test_scale_translate_rejects_images_below_min_size():
    with pytest.raises(SpecError, match="min_size"):
        T.ScaleTranslate(25, 63).output_spec(ArraySpec((20, 64)))
    with pytest.raises(ValueError, match="min_size < max_size"):
        T.ScaleTranslate(30, 30)


# ---------------------------------------------------------------- sine warp


def seed_sine(img: np.ndarray, factor: float) -> np.ndarray:
    """The seed-002 loop, verbatim but with an explicit factor (and axis=0 for colour)."""
    t_img = img.copy()
    A = t_img.shape[0] / 3.0
    w = 2.0 / t_img.shape[1]

    def shift(x):
        return factor * A * np.sin(-2 * np.pi * x * w)

    for i in range(t_img.shape[1]):
        t_img[:, i] = np.roll(t_img[:, i], int(shift(i)), axis=0)
    return t_img


def test_sine_warp_equals_the_seed_roll_per_column(any_image):
    op = T.SineWarp((0.15, 0.2))
    for i in range(10):
        a = op.params(any_image.shape[:2], sample_rng(8, 0, i))
        out = op(any_image, sample_rng(8, 0, i))
        np.testing.assert_array_equal(out, seed_sine(any_image, a))


def test_sine_warp_amplitude_and_sign():
    got = draws(T.SineWarp((0.15, 0.2)), (64, 64), 1000)
    assert all(0.15 <= abs(a) <= 0.2 for a in got)
    assert 400 < sum(a > 0 for a in got) < 600
    op = T.SineWarp(0.2, period=0.25)
    s = op.shifts((60, 80), 0.2)
    assert s.max() == 4 and s.min() == -4  # peak 0.2 * 60 / 3 = 4 pixels
    assert np.array_equal(s[:20], s[20:40])  # four waves across 80 columns


# ---------------------------------------------------------------- decode hints


def test_decode_hints():
    assert T.Resize((64, 64)).decode_hint((512, 384)) == (64, 64)
    assert T.Resize(100, shorter_side=True).decode_hint((400, 600)) == (100, 150)
    assert T.Resize((64, 64)).decode_hint((50, 400)) is None  # would upscale
    assert T.RandomCrop(32).decode_hint((512, 512)) is None
    assert T.decode_hint(T.Compose([T.Resize(40), T.RandomCrop(32)]), (512, 384)) == (40, 40)
    assert T.decode_hint(T.Compose([T.RandomCrop(32), T.Resize(40)]), (512, 384)) is None
    assert T.decode_hint(lambda img: img, (512, 384)) is None


@pytest.mark.parametrize("full", [(3000, 4000), (1200, 1800), (480, 640)])
def test_random_resized_crop_hint_keeps_the_smallest_crop_at_full_detail(full):
    op = T.RandomResizedCrop(224)
    hint = op.decode_hint(full)
    if hint is None:  # even the full size has crops smaller than 224: no reduction allowed
        area = full[0] * full[1] * 0.08
        assert math.sqrt(area / (4 / 3)) < 224 * 1.01
        return
    h, w = hint
    assert h <= full[0] and w <= full[1]
    # at any decode scale >= the hint, the smallest crop still has >= 224 pixels a side
    area = h * w * 0.08
    assert math.sqrt(area / (4 / 3)) >= 224 - 1e-6 and math.sqrt(area * 3 / 4) >= 224 - 1e-6
