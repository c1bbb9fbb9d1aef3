"""Geometry follows the image: apply_targets gives __call__'s image with __call__'s draws, the
box rules (clip, visible fraction, drop), and the errors that name the step."""

from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker.transforms as T
from stoker._core.errors import SpecError
from stoker._core.seeding import sample_rng
from stoker.transforms.targets import Targets

from .conftest import make_image

GEOMETRIC = [
    T.Resize((24, 30)),
    T.Resize(20, shorter_side=True),
    T.Resize(33, shorter_side=True, interpolation="area"),
    T.Resize((60, 70), interpolation="auto"),
    T.RandomCrop(32),
    T.RandomCrop((20, 44), padding=3, fill=7),
    T.CenterCrop((31, 17)),
    T.RandomResizedCrop(24),
    T.RandomResizedCrop((16, 24), scale=(0.3, 0.6), interpolation="nearest"),
    T.HorizontalFlip(0.5),
    T.HorizontalFlip(1.0),
    T.Rotate(15),
    T.Rotate((-30, 5), fill=200, interpolation="bilinear"),
    T.Shear(0.2, 0.2),
    T.Shear((0.1, 0.3), 0.0, center=True, interpolation="bicubic"),
    T.ScaleTranslate(10, 39),
]
SINE = [T.SineWarp((0.15, 0.2)), T.SineWarp(0.3, period=0.25)]
COLOUR = [
    T.GaussianBlur((0.5, 1.2)),
    T.Sharpen(),
    T.Smooth(),
    T.ColorJitter(0.4, 0.4, 0.4),
    T.Grayscale(3),
    T.Normalize(),
]
CONTAINERS = [
    T.RandomChoice([T.Rotate(20), T.Shear(0.2, 0.1), T.HorizontalFlip()]),
    T.OneOf([T.RandomResizedCrop(28), T.CenterCrop(20)], weights=[2, 1], p=0.6),
    T.RandomApply([T.Rotate(10), T.Resize((36, 36))], p=0.5),
    T.RandomApply(T.ColorJitter(0.3, 0.3), p=0.7),
]


def _targets(hw: tuple[int, int], seed: int, *, boxes: bool = True) -> Targets:
    rng = np.random.default_rng(seed)
    h, w = hw
    xy = rng.uniform(-5, [w + 5, h + 5], (6, 2))
    b = np.concatenate([xy[:3], xy[3:]], axis=1)
    pts = np.concatenate([rng.uniform(0, [w, h], (4, 2, 2)), np.ones((4, 2, 1))], axis=-1)
    masks = {
        "seg": rng.integers(0, 4, hw, dtype=np.uint8),
        "ids": rng.integers(0, 3000, hw, dtype=np.uint16),
    }
    return Targets.make(hw, boxes={"boxes": b} if boxes else None, points={"kp": pts}, masks=masks)


def _same_as_call(op: T.Transform, img: np.ndarray, seed: int, boxes: bool = True) -> Targets:
    """apply_targets's image == __call__'s, bit for bit, and both leave the rng in one state."""
    r1, r2 = sample_rng(seed, 0, 7), sample_rng(seed, 0, 7)
    expected = op(img, r1)
    t = _targets(img.shape[:2], seed, boxes=boxes)
    got = op.apply_targets(img, t, r2)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    # both used the generator alike: what it draws next agrees
    np.testing.assert_array_equal(r1.random(4), r2.random(4), err_msg=f"{op!r} drew differently")
    assert t.hw == got.shape[:2] or isinstance(op, T.Normalize)
    for name, m in t.masks.items():
        assert m.shape == t.hw, name
    return t


@pytest.mark.parametrize("op", GEOMETRIC + COLOUR + CONTAINERS, ids=repr)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_apply_targets_gives_the_call_image(op, seed):
    img = make_image(40, 48, seed=seed)
    _same_as_call(op, img, seed)
    _same_as_call(op, make_image(40, 48, channels=None, seed=seed), seed)


@pytest.mark.parametrize("op", SINE, ids=repr)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sine_warp_moves_points_and_masks_and_gives_the_call_image(op, seed):
    img = make_image(40, 48, seed=seed)
    before = _targets(img.shape[:2], seed, boxes=False)
    after = _same_as_call(op, img, seed, boxes=False)
    # whole columns roll: each column's multiset of mask labels is kept, points keep their x
    np.testing.assert_array_equal(
        np.sort(after.masks["ids"], axis=0), np.sort(before.masks["ids"], axis=0)
    )
    np.testing.assert_array_equal(after.points["kp"][..., 0], before.points["kp"][..., 0])


# every op here takes any input of at least 20x20 and returns at least that
_POOL = [
    T.Resize((24, 30)),
    T.Resize(26, shorter_side=True, interpolation="area"),
    T.RandomCrop(20, padding=3, fill=7),
    T.CenterCrop(20),  # no side under 20: (20, 17) starved a later 20x20 crop
    T.RandomResizedCrop((28, 32)),
    T.HorizontalFlip(),
    T.Rotate((-30, 5), fill=200, interpolation="bilinear"),
    T.Shear(0.2, 0.2),
    T.Shear((0.1, 0.3), 0.0, center=True),
    T.ScaleTranslate(10, 39),
    *COLOUR[:5],
    *CONTAINERS,
]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.sampled_from(_POOL), min_size=1, max_size=5),
    seed=st.integers(0, 2**20),
    h=st.integers(40, 64),
    w=st.integers(48, 64),
)
def test_random_compositions_give_the_call_image(steps, seed, h, w):
    chain = T.Compose([T.Resize((h, w)), *steps])
    _same_as_call(chain, make_image(h, w, seed=seed % 7), seed)


def test_colour_ops_leave_targets_alone():
    img = make_image(40, 48)
    for op in COLOUR:
        assert op.moves_geometry is False
        before = _targets(img.shape[:2], 3)
        after = _targets(img.shape[:2], 3)
        op.apply_targets(img, after, sample_rng(0, 0, 1))
        np.testing.assert_array_equal(after.boxes["boxes"], before.boxes["boxes"])
        np.testing.assert_array_equal(after.points["kp"], before.points["kp"])
        np.testing.assert_array_equal(after.masks["seg"], before.masks["seg"])
        op.check_targets(frozenset({"boxes", "points", "mask"}))


# ------------------------------------------------------------------ box rules, by the numbers
def test_crop_clips_keeps_half_and_drops_what_it_cuts_off():
    img = np.zeros((100, 100, 3), np.uint8)
    boxes = np.array(
        [
            [0, 0, 20, 20],  # entirely outside the crop [25, 75)
            [50, 40, 100, 60],  # half of it inside
            [70, 40, 80, 60],  # half of a narrow box
            [72, 10, 80, 90],  # 3/8 of its width inside, rows clipped too
            [74.5, 40, 75.5, 60],  # half visible, but 0.5 px wide: under MIN_BOX_SIZE
            [30, 30, 70, 70],  # all inside
            [20, 30, 29, 70],  # 4/9 of it inside
            [73, 30, 80, 70],  # 2/7 inside
            [74.4, 30, 80, 70],  # 0.6/5.6 = 0.107 visible, but 0.6 px wide
            [-40, 30, 30, 70],  # 5/70 = 0.071 visible: under MIN_VISIBILITY
        ]
    )
    t = Targets.make((100, 100), boxes={"b": boxes})
    T.CenterCrop(50).apply_targets(img, t, sample_rng(0, 0, 0))
    b, vis = t.boxes["b"], t.visible["b"]
    np.testing.assert_allclose(b[1], [25, 15, 50, 35])
    np.testing.assert_allclose(vis[1], 0.5)
    np.testing.assert_allclose(b[2], [45, 15, 50, 35])
    np.testing.assert_allclose(vis[2], 0.5)
    np.testing.assert_allclose(b[3], [47, 0, 50, 50])
    np.testing.assert_allclose(vis[3], (3 / 8) * (50 / 80))
    np.testing.assert_allclose(b[5], [5, 5, 45, 45])
    np.testing.assert_allclose(vis[6], 4 / 9)
    np.testing.assert_allclose(vis[9], 5 / 70)
    keep = t.keep("b")
    assert keep.tolist() == [False, True, True, True, False, True, True, True, False, False]
    assert t.keep("b", min_visibility=0.3).tolist()[7] is False  # 2/7 = 0.286
    assert vis[0] == 0 and np.all(b[:, [0, 2]] >= 0) and np.all(b[:, [0, 2]] <= 50)


def test_points_leaving_the_frame_keep_their_place_and_lose_visibility():
    img = np.zeros((100, 100, 3), np.uint8)
    pts = np.array([[10.0, 50.0, 2.0], [50.0, 50.0, 2.0], [74.9, 30.0, 1.0]])
    t = Targets.make((100, 100), points={"kp": pts, "xy": pts[:, :2].copy()})
    T.CenterCrop(50).apply_targets(img, t, sample_rng(0, 0, 0))
    np.testing.assert_allclose(t.points["kp"], [[-15, 25, 0], [25, 25, 2], [49.9, 5, 1]])
    np.testing.assert_allclose(t.points["xy"], [[-15, 25], [25, 25], [49.9, 5]])


def test_random_crop_padding_pads_masks_with_zero_whatever_the_fill():
    img = make_image(20, 20)
    img[img == 9] = 10  # the fill marks the padding: no image pixel may look like it
    mask = np.full((20, 20), 5, np.uint8)
    t = Targets.make((20, 20), masks={"m": mask}, boxes={"b": np.array([[0, 0, 20, 20.0]])})
    op = T.RandomCrop(20, padding=4, fill=9)
    rng = np.random.default_rng(1)
    while True:  # a draw that shows some padding
        probe = np.random.default_rng(rng.integers(1 << 30))
        state = probe.bit_generator.state
        top, left = op.params((20, 20), probe)
        if top != 4 and left != 4:
            break
    probe.bit_generator.state = state
    out = op.apply_targets(img, t, probe)
    pad = out[..., 0] == 9
    np.testing.assert_array_equal(t.masks["m"] == 0, pad)
    expected = np.clip([4 - left, 4 - top, 24 - left, 24 - top], 0, 20)
    np.testing.assert_allclose(t.boxes["b"][0], expected)
    np.testing.assert_allclose(t.visible["b"][0], np.prod(expected[2:] - expected[:2]) / 400)


def test_rotation_grows_a_box_to_the_hull_of_its_corners():
    img = np.zeros((101, 101), np.uint8)
    t = Targets.make((101, 101), boxes={"b": np.array([[40.5, 40.5, 60.5, 60.5]])})
    op = T.Rotate((45, 45))
    op.apply_targets(img, t, sample_rng(0, 0, 0))
    half = 10 * np.sqrt(2)
    np.testing.assert_allclose(
        t.boxes["b"][0], [50.5 - half, 50.5 - half, 50.5 + half, 50.5 + half]
    )


def test_flip_and_resize_move_boxes_exactly():
    img = np.zeros((40, 60, 3), np.uint8)
    t = Targets.make((40, 60), boxes={"b": np.array([[10, 5, 20, 15.0]])})
    img = T.HorizontalFlip(1.0).apply_targets(img, t, sample_rng(0, 0, 0))
    np.testing.assert_allclose(t.boxes["b"][0], [40, 5, 50, 15])
    T.Resize((20, 120)).apply_targets(img, t, sample_rng(0, 0, 0))
    np.testing.assert_allclose(t.boxes["b"][0], [80, 2.5, 100, 7.5])
    assert t.hw == (20, 120)


# ------------------------------------------------------------------ refusals name the step
def colour_fn(img):
    return 255 - img


def shrink_fn(img):
    return np.ascontiguousarray(img[::2, ::2])


def test_sine_warp_refuses_boxes_and_names_the_step():
    chain = T.Compose([T.Resize(32), T.RandomChoice([T.Rotate(5), T.SineWarp()])])
    with pytest.raises(SpecError, match=r"Compose step 1 .*branch 1 .*SineWarp.*boxes"):
        chain.check_targets(frozenset({"boxes"}))
    chain.check_targets(frozenset({"points", "mask"}))
    img = make_image(32, 32)
    t = Targets.make((32, 32), boxes={"b": np.array([[1, 1, 5, 5.0]])})
    with pytest.raises(SpecError, match="SineWarp"):
        T.SineWarp().apply_targets(img, t, sample_rng(0, 0, 0))


def test_an_unmarked_function_is_refused_and_a_marked_one_carries_targets():
    chain = T.Compose([T.Rotate(10), colour_fn])
    with pytest.raises(SpecError, match=r"Compose step 1 \(as_transform\(colour_fn\)\).*boxes"):
        chain.check_targets(frozenset({"boxes"}))
    with pytest.raises(SpecError, match=r"RandomApply \(FnTransform\).*mask"):
        T.RandomApply(colour_fn, p=0.5).check_targets(frozenset({"mask"}))
    with pytest.raises(SpecError, match=r"OneOf branch 0"):
        T.OneOf([colour_fn, T.Rotate(3)], p=0.5).check_targets(frozenset({"points"}))
    chain.check_targets(frozenset())  # nothing to carry: nothing to refuse

    marked = T.as_transform(colour_fn, moves_geometry=False)
    assert marked.moves_geometry is False
    assert pickle.loads(pickle.dumps(marked)) == marked
    chain = T.Compose([T.Rotate(10), marked])
    chain.check_targets(frozenset({"boxes", "points", "mask"}))
    img = make_image(30, 30)
    t = _targets((30, 30), 0)
    out = chain.apply_targets(img, t, sample_rng(0, 0, 0))
    np.testing.assert_array_equal(out, chain(img, sample_rng(0, 0, 0)))

    with pytest.raises(ValueError, match="moves_geometry"):
        T.as_transform(colour_fn, moves_geometry=True)
    lying = T.Compose([T.as_transform(shrink_fn, moves_geometry=False)])
    with pytest.raises(SpecError, match=r"Compose step 0 \(as_transform\(shrink_fn\)\).*frame"):
        lying.apply_targets(img, _targets((30, 30), 0), sample_rng(0, 0, 0))


def test_targets_in_another_frame_are_refused():
    t = Targets.make((30, 40), boxes={"b": np.array([[1, 1, 5, 5.0]])})
    with pytest.raises(ValueError, match=r"Rotate: .*30x40 frame but the image is 32x32"):
        T.Rotate(10).apply_targets(make_image(32, 32), t, sample_rng(0, 0, 0))


# ------------------------------------------------------------------ reduced-scale decode
@pytest.mark.parametrize(
    "flag,factor", [(cv2.IMREAD_REDUCED_COLOR_2, 2), (cv2.IMREAD_REDUCED_COLOR_4, 4)]
)
def test_rescale_after_a_reduced_jpeg_decode_keeps_boxes_on_the_object(flag, factor):
    h, w = 203, 157
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 1] = 140
    img[61:149, 33:121] = (255, 0, 255)  # rows 61..148, cols 33..120
    mask = np.zeros((h, w), np.uint8)
    mask[61:149, 33:121] = 1
    t = Targets.make(
        (h, w),
        boxes={"b": np.array([[33, 61, 121, 149.0]])},
        points={"c": np.array([[77.0, 105.0, 1.0]])},
        masks={"m": mask},
    )
    ok, enc = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    small = cv2.imdecode(enc, flag)
    assert small.shape[:2] == (-(-h // factor), -(-w // factor))
    t.rescale(small.shape[:2])
    obj = (small[..., 0] > 160) & (small[..., 1] < 90)
    ys, xs = np.nonzero(obj)
    x1, y1, x2, y2 = t.boxes["b"][0]
    # the object's pixels span the box, within a pixel of JPEG blur at each edge
    assert abs(xs.min() - x1) <= 1 and abs(xs.max() + 1 - x2) <= 1
    assert abs(ys.min() - y1) <= 1 and abs(ys.max() + 1 - y2) <= 1
    cx, cy = t.points["c"][0, :2]
    assert obj[int(cy), int(cx)]
    assert t.masks["m"].shape == small.shape[:2]
    assert np.sum(t.masks["m"].astype(bool) != obj) < 0.1 * obj.sum()


@pytest.mark.parametrize("center", [False, True])
def test_shear_moves_points_by_the_inverse_of_its_sampling_map(center):
    """Output (x, y) samples input (x + sx·y, sy·x + y) about the pivot: the top-left corner
    (continuous 0, 0) or the centre; a point goes where that map sends it back."""
    h, w = 40, 60
    img = np.zeros((h, w), np.uint8)
    px, py = (w / 2, h / 2) if center else (0.0, 0.0)
    pts = np.array([[10.0, 20.0], [px, py], [33.0, 7.0]])
    t = Targets.make((h, w), points={"p": pts})
    T.Shear((0.2, 0.2), (-0.1, -0.1), center=center).apply_targets(img, t, sample_rng(0, 0, 0))
    sample = np.array([[1.0, 0.2], [-0.1, 1.0]])
    moved = t.points["p"]
    np.testing.assert_allclose((moved - (px, py)) @ sample.T + (px, py), pts, atol=1e-9)
    np.testing.assert_allclose(moved[1], [px, py], atol=1e-9)
