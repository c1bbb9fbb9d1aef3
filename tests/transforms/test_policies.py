"""The augmentation policies held to the PIL reference (``bench/_pil_policies.py``): every op
at every magnitude bin on photo-like images, the distribution of their draws (chi-square over
100,000 draws), boxes under their geometric ops, and the batch mixers.

The per-op check forces the op and its magnitude on both sides, each side taking the
magnitude from its own table: colour ops must be within 1 grey level mean absolute difference
of PIL's, geometric ops must have at least 99 % of their pixels equal to PIL's at the same
place or one pixel away (within one grey level under a bilinear filter). The default run takes
20 images of 112 to 160 pixels a side; ``-m slow`` takes 200 of 224 to 320.
"""

from __future__ import annotations

import functools
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import stoker.transforms as T
from stoker._core.seeding import SampleRngs, sample_rng
from stoker.transforms.policies import OPS, RandAugment, TrivialAugmentWide

from .test_targets_props import _check_box, _check_point, _mask_disagreement, _run_steps

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _pil_policies as P  # noqa: E402

GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
DRAWS = 100_000


# ---------------------------------------------------------------------------- images
def photo(seed: int, h: int, w: int) -> np.ndarray:
    """A photo-like image: a lit background, a few soft-edged objects of their own colours,
    sensor noise, then a JPEG round trip (its blocks and ringing)."""
    import cv2

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = rng.uniform(30, 220, 3) + np.stack(
        [rng.uniform(-60, 60) * x / w + rng.uniform(-60, 60) * y / h for _ in range(3)], -1
    )
    for _ in range(int(rng.integers(3, 8))):
        cy, cx, ry, rx = (
            rng.uniform(0, h),
            rng.uniform(0, w),
            rng.uniform(h / 12, h / 3),
            rng.uniform(w / 12, w / 3),
        )
        img[((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1] = rng.uniform(0, 255, 3)
    img = cv2.GaussianBlur(img.astype(np.float32), (0, 0), rng.uniform(1.0, 3.0))
    img += rng.normal(0, rng.uniform(2, 10), img.shape)
    ok, buf = cv2.imencode(
        ".jpg", np.clip(img, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 85]
    )
    return cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)


@functools.lru_cache(maxsize=2)
def images(slow: bool) -> tuple[tuple[np.ndarray, Image.Image], ...]:
    n, sides = (200, (224, 256, 288, 320)) if slow else (20, (112, 128, 144, 160))
    out = []
    for i in range(n):
        h, w = sides[i % 4], sides[(i // 4 + 1) % 4]
        img = photo(i, h, w)
        out.append((img, Image.fromarray(img)))
    return tuple(out)


def _within_a_pixel(ours: np.ndarray, ref: np.ndarray, levels: int) -> float:
    """Share of pixels equal (within ``levels``) to the reference's at the same place or at
    one of its 8 neighbours."""
    h, w = ours.shape[:2]
    o = ours.astype(np.int16)
    pad = np.pad(ref.astype(np.int16), ((1, 1), (1, 1), (0, 0)), constant_values=-999)
    ok = np.zeros((h, w), bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ok |= np.all(np.abs(o - pad[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]) <= levels, -1)
    return float(ok.mean())


def _compare(name: str, ours: np.ndarray, ref: np.ndarray, filtered: bool, where: str) -> None:
    assert ours.shape == ref.shape and ours.dtype == np.uint8, where
    if name.startswith(GEOMETRIC):
        # at least this share equals the reference at the same place (within a level when
        # filtered), which most often settles it
        off = np.abs(ours.astype(np.int16) - ref) > (1 if filtered else 0)
        share = 1.0 - np.count_nonzero(off) / (ours.shape[0] * ours.shape[1])
        if share < 0.99:
            share = _within_a_pixel(ours, ref, 1 if filtered else 0)
        assert share >= 0.99, f"{where}: {share:.4f} of the pixels within one pixel of PIL's"
    else:
        mad = float(np.abs(ours.astype(np.int16) - ref).mean())
        assert mad <= 1.0, f"{where}: mean absolute difference {mad:.3f}"


# ---------------------------------------------------------------------------- every op, every bin
TORCHVISION_CASES = (
    [("RandAugment", n) for n in P.TORCHVISION_OPS]
    + [("TrivialAugmentWide", n) for n in P.TORCHVISION_OPS]
    + [("AutoAugment", n) for n in (*P.TORCHVISION_OPS, "Invert")]
)
POLICIES = {
    "RandAugment": (T.RandAugment(), 31, {}),
    "TrivialAugmentWide": (T.TrivialAugmentWide(), 31, {"wide": True}),
    "AutoAugment": (T.AutoAugment(), 10, {"invert": True}),
}


SAMPLES = ["20", pytest.param("200", marks=pytest.mark.slow)]


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize(
    "policy, name", TORCHVISION_CASES, ids=[f"{p}-{n}" for p, n in TORCHVISION_CASES]
)
def test_every_torchvision_op_at_every_bin_matches_pil(policy, name, sample):
    op, bins, kw = POLICIES[policy]
    for i, (img, pil) in enumerate(images(sample == "200")):
        values, signed = P.torchvision_space(bins, img.shape[:2], **kw)[name]
        for b in range(bins if values is not None else 1):
            negate = signed and (i + b) % 2 == 1  # each sign at every bin, on alternate images
            # stoker's own table against the reference's
            arg = _arg(op, name, b, negate, img.shape[:2])
            m = 0.0 if values is None else (-values[b] if negate else values[b])
            assert values is None or arg == m, (name, b, arg, m)
            ours, ref = op.run(img, name, arg), np.asarray(P.apply_op(pil, name, m))
            _compare(name, ours, ref, False, f"{name} bin {b} {img.shape}")


def _arg(op, name, b, negate, hw):
    from stoker.transforms.policies import _torchvision_arg

    wide = isinstance(op, TrivialAugmentWide)
    return _torchvision_arg(name, b, 10 if isinstance(op, T.AutoAugment) else 31, hw, wide, negate)


TIMM_NAMES = sorted(set(OPS["timm"]) | set(OPS["timm-increasing"]))


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("name", TIMM_NAMES)
def test_every_timm_op_at_every_level_matches_pil(name, sample):
    from stoker.transforms.policies import _timm_arg

    op = RandAugment.from_timm("rand-m9-mstd0.5-inc1")  # bilinear, timm's ImageNet fill
    for img, pil in images(sample == "200")[::2]:
        for level in (*range(11), 7.3):
            for negate in (False, True):
                arg, ref_arg = _timm_arg(name, level, negate), P.timm_arg(name, level, negate)
                assert (arg is None) == (ref_arg is None) and (
                    arg is None or arg == pytest.approx(ref_arg)
                )
                ref = np.asarray(
                    P.timm_apply(pil, name, ref_arg, fill=P.TIMM_FILL, resample=P.BILINEAR)
                )
                _compare(
                    name.removesuffix("Rel"),
                    op.run(img, name, arg),
                    ref,
                    True,
                    f"{name} at {level}",
                )


def test_grey_images_go_through_every_op():
    img = photo(3, 40, 56)[..., 0]
    for op in (T.RandAugment(), T.TrivialAugmentWide(), T.AutoAugment()):
        for name in (*OPS["torchvision"], "Invert"):
            for arg in (None, 0.2, 3.0):
                out = op.run(img, name, arg if name not in ("Solarize", "Posterize") else 5.0)
                assert out.shape == img.shape and out.dtype == np.uint8
        for view in (img[..., None], img):
            assert op(view, sample_rng(0, 0, 1)).shape == view.shape


# ---------------------------------------------------------------------------- draws
def _upper_gamma(a: float, x: float) -> float:
    """The regularised upper incomplete gamma function Q(a, x): series below a + 1, Lentz's
    continued fraction above."""
    if x <= 0:
        return 1.0
    front = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while term > total * 1e-15:
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * front
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = 1 / (an * d + b or 1e-300)
        c = b + an / c or 1e-300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return front * h


def chi_square_p(counts: Counter, expected: dict) -> float:
    """p of Pearson's chi-square test of ``counts`` against probabilities ``expected``."""
    assert set(counts) <= set(expected), set(counts) - set(expected)
    n = sum(counts.values())
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items() if p > 0)
    return _upper_gamma((len(expected) - 1) / 2, stat / 2)


def test_chi_square_of_known_values():
    assert _upper_gamma(0.5, 3.841 / 2) == pytest.approx(0.05, abs=1e-4)
    assert _upper_gamma(5.0, 18.307 / 2) == pytest.approx(0.05, abs=1e-4)
    assert _upper_gamma(50.0, 124.342 / 2) == pytest.approx(0.05, abs=1e-3)


def _key(name: str, m: float | None) -> tuple:
    return (name, None if m is None else round(float(m), 5) + 0.0)


def _draws(op, hw, n=DRAWS, seed=11):
    rngs = SampleRngs(seed, 0)
    return [op.params(hw, rngs.at(i)) for i in range(n)]


def _one_op(space: dict, bins: list[int] | None) -> Counter:
    """The distribution of one op drawn uniformly from torchvision's list, at one of ``bins``
    (uniformly; ``None``: every bin), with a sign where the op takes one."""
    expected: Counter = Counter()
    for name in P.TORCHVISION_OPS:
        values, signed = space[name]
        picks = [None] if values is None else [values[b] for b in (bins or range(len(values)))]
        for m in picks:
            for s in (1, -1) if signed else (1,):
                share = 1 / len(P.TORCHVISION_OPS) / len(picks) / (2 if signed else 1)
                expected[_key(name, None if m is None else s * m)] += share
    return expected


def test_randaugment_draws_ops_and_signs_as_torchvision():
    hw = (224, 224)
    got = Counter(_key(*a) for ops in _draws(T.RandAugment(), hw) for a in ops)
    assert sum(got.values()) == 2 * DRAWS
    assert chi_square_p(got, _one_op(P.torchvision_space(31, hw), [9])) > 0.01


def test_trivialaugment_draws_ops_bins_and_signs_as_torchvision():
    hw = (224, 224)
    got = Counter(_key(*a) for ops in _draws(T.TrivialAugmentWide(), hw) for a in ops)
    assert chi_square_p(got, _one_op(P.torchvision_space(31, hw, wide=True), None)) > 0.01


def test_autoaugment_draws_subpolicies_as_torchvision():
    hw = (224, 224)
    space = P.torchvision_space(10, hw, invert=True)
    expected: Counter = Counter()
    for policy in P.AUTOAUGMENT_IMAGENET:
        outcomes = [((), 1 / 25)]
        for name, p, b in policy:
            values, signed = space[name]
            grown = [(o, q * (1 - p)) for o, q in outcomes]
            for s in (1, -1) if signed else (1,):
                m = None if b is None else s * values[b]
                share = p / (2 if signed else 1)
                grown += [((*o, _key(name, m)), q * share) for o, q in outcomes]
            outcomes = grown
        for o, q in outcomes:
            expected[o] += q
    got = Counter(tuple(_key(*a) for a in ops) for ops in _draws(T.AutoAugment(), hw))
    assert chi_square_p(got, {k: v for k, v in expected.items() if v > 0}) > 0.01


def test_timm_string_draws_ops_levels_and_signs_as_timm():
    op = RandAugment.from_timm("rand-m9-mstd0.5-inc1")
    assert (op.num_ops, op.magnitude, op.p, op.magnitude_std, op.ops) == (
        2,
        9,
        0.5,
        0.5,
        "timm-increasing",
    )
    draws = _draws(op, (224, 224))
    # each of the 2 ops runs with probability 0.5, each of the 15 names alike
    count = Counter(len(d) for d in draws)
    assert chi_square_p(count, {0: 0.25, 1: 0.5, 2: 0.25}) > 0.01
    names = Counter(n for d in draws for n, _ in d)
    assert chi_square_p(names, {n: 1 / 15 for n in OPS["timm-increasing"]}) > 0.01
    # the level of the signed ops: N(9, 0.5) clipped to [0, 10], in bins; the sign 50/50
    edges = [-math.inf, 8.0, 8.5, 9.0, 9.5, 10.0 - 1e-9, math.inf]
    levels: Counter = Counter()
    signs: Counter = Counter()
    for d in draws:
        for name, arg in d:
            if name in (
                "Rotate",
                "ShearX",
                "ShearY",
                "TranslateXRel",
                "TranslateYRel",
            ) or name.startswith(("Color", "Contrast", "Bright", "Sharp")):
                base, slope, _ = {
                    "Rotate": (0, 30),
                    "ShearX": (0, 0.3),
                    "ShearY": (0, 0.3),
                    "TranslateXRel": (0, 0.45),
                    "TranslateYRel": (0, 0.45),
                }.get(name, (1, 0.9)) + (0,)
                level = abs(arg - base) / slope * 10
                levels[int(np.searchsorted(edges, level, side="right")) - 1] += 1
                signs[arg > base] += 1
    cdf = [
        0.5 * (1 + math.erf((e - 9) / (0.5 * math.sqrt(2)))) if math.isfinite(e) else float(e > 0)
        for e in edges
    ]
    assert chi_square_p(levels, {i: cdf[i + 1] - cdf[i] for i in range(len(edges) - 1)}) > 0.01
    assert chi_square_p(signs, {True: 0.5, False: 0.5}) > 0.01


def test_timm_strings_parse_and_refuse():
    assert RandAugment.from_timm("rand-m7-n3").num_ops == 3
    assert (
        RandAugment.from_timm("rand-m7-inc0").ops == "timm"
    )  # timm takes "inc0" as on; stoker reads the number
    assert RandAugment.from_timm("rand-mstd101").magnitude_std == math.inf
    assert RandAugment.from_timm("rand-m15-mmax15").magnitude_max == 15
    for bad in ("augmix-m3", "rand-w0", "rand-x3"):
        with pytest.raises(ValueError):
            RandAugment.from_timm(bad)


# ---------------------------------------------------------------------------- contract
CONTRACT = [
    T.RandAugment(),
    T.RandAugment(3, 15, fill=(9, 8, 7), interpolation="bilinear"),
    T.TrivialAugmentWide(),
    T.AutoAugment(),
    RandAugment.from_timm("rand-m9-mstd0.5-inc1"),
]


@pytest.mark.parametrize("op", CONTRACT, ids=[repr(o)[:50] for o in CONTRACT])
def test_policies_keep_the_transform_contract(op):
    import pickle

    from stoker._core.specs import ArraySpec

    img = photo(5, 48, 64)
    before = img.copy()
    assert op.output_spec(ArraySpec(img.shape, "uint8")) == ArraySpec(img.shape, "uint8")
    clone = pickle.loads(pickle.dumps(op))
    assert clone == op
    outs = [op(img, sample_rng(7, 0, i)) for i in range(12)]
    np.testing.assert_array_equal(outs[0], clone(img, sample_rng(7, 0, 0)))
    assert any(not np.array_equal(outs[0], o) for o in outs[1:])
    np.testing.assert_array_equal(img, before)
    view = photo(6, 60, 80)[5:53, 8:72]
    np.testing.assert_array_equal(
        op(view, sample_rng(1, 0, 2)), op(np.ascontiguousarray(view), sample_rng(1, 0, 2))
    )


def test_policies_refuse_what_they_cannot_do():
    from stoker._core.errors import SpecError
    from stoker._core.specs import ArraySpec

    with pytest.raises(SpecError, match="uint8"):
        T.RandAugment().output_spec(ArraySpec((8, 8, 3), "float32"))
    with pytest.raises(ValueError, match="magnitude"):
        T.RandAugment(2, 31)
    with pytest.raises(ValueError, match="imagenet"):
        T.AutoAugment("cifar10")
    with pytest.raises(ValueError):
        T.TrivialAugmentWide(interpolation="area")


# ---------------------------------------------------------------------------- boxes
def _geometric(cls):
    @dataclass(frozen=True)
    class Geometric(cls):
        """The policy's own draws, the colour ops left out (they repaint the object)."""

        def params(self, hw, rng):
            return [(n, a) for n, a in super().params(hw, rng) if n.startswith(GEOMETRIC)]

    return Geometric


BOXED = [
    _geometric(T.RandAugment)(3, 20),
    _geometric(T.TrivialAugmentWide)(),
    _geometric(T.AutoAugment)(),
    _geometric(T.RandAugment)(
        3, 9, 11, fill=0, interpolation="bilinear", ops="timm-increasing", magnitude_std=0.5
    ),
]


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(BOXED),
    seed=st.integers(0, 2**31),
    disc=st.booleans(),
    h=st.integers(32, 72),
    w=st.integers(32, 72),
)
def test_boxes_points_and_masks_stay_on_their_objects(op, seed, disc, h, w):
    found, t, drift, _ = _run_steps([op], seed, h, w, disc)
    _check_box(found, t, 1.0 + drift, loose=True, small=3.0 + 2.0 * drift)
    _check_point(found, t, 1.0 + drift, small=3.0 + 2.0 * drift)
    assert _mask_disagreement(found, t, band=math.ceil(0.5 + drift)) <= 0.01


# ---------------------------------------------------------------------------- mixing
def _batch(n=6, c=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 10, 12, 3), dtype=np.uint8), rng.integers(0, c, n)


class _Fixed:
    """A generator whose draws are given: (u0, u1) then the Beta draw, then the box centre."""

    def __init__(self, u, lam, centre=(5, 6)):
        self.u, self.lam, self.centre = u, lam, centre

    def random(self, n):
        return np.array(self.u)

    def beta(self, a, b):
        return self.lam

    def integers(self, lo, hi):
        return np.array(self.centre)


def test_mixup_blends_each_pair_and_mixes_their_targets():
    imgs, classes = _batch()
    before = imgs.copy()
    labels = np.zeros((6, 4), np.float32)
    mix = T.MixUp(0.4, num_classes=4, label_smoothing=0.1)
    mix.mix_rows(imgs, classes, labels, range(0, 6), _Fixed([0.1, 0.9], 0.3), chw=False)
    expect = 0.3 * before[0].astype(float) + 0.7 * before[1]
    assert np.abs(imgs[0] - expect).max() <= 0.5 + 1e-6
    assert np.abs(imgs[1] - (0.3 * before[1].astype(float) + 0.7 * before[0])).max() <= 0.5 + 1e-6
    np.testing.assert_allclose(labels.sum(1), 1.0, rtol=1e-6)
    want = np.full(4, 0.025)
    want[classes[0]] += 0.3 * 0.9
    want[classes[1]] += 0.7 * 0.9
    np.testing.assert_allclose(labels[0], want, rtol=1e-6)


def test_cutmix_swaps_a_box_and_weighs_targets_by_what_is_left():
    imgs, classes = _batch()
    before = imgs.copy()
    labels = np.zeros((6, 4), np.float32)
    mix = T.CutMix(1.0, num_classes=4)
    kind, lam, (t, b, left, r) = mix.params((10, 12), _Fixed([0.1, 0.1], 0.75, (2, 11)))
    assert kind == "cutmix" and (t, b, left, r) == (0, 4, 8, 12)  # clipped at the frame
    assert lam == pytest.approx(1 - 4 * 4 / 120)
    mix.mix_rows(imgs, classes, labels, range(2, 6), _Fixed([0.1, 0.1], 0.75, (2, 11)), chw=False)
    np.testing.assert_array_equal(imgs[:2], before[:2])  # outside the rows given
    np.testing.assert_array_equal(imgs[2, 0:4, 8:12], before[3, 0:4, 8:12])
    np.testing.assert_array_equal(imgs[3, 0:4, 8:12], before[2, 0:4, 8:12])
    np.testing.assert_array_equal(imgs[2, 4:], before[2, 4:])
    assert labels[2, classes[2]] >= lam - 1e-6 or classes[2] == classes[3]


def test_rows_without_a_partner_keep_their_image_and_class():
    imgs, classes = _batch(5)
    before = imgs.copy()
    labels = np.zeros((5, 4), np.float32)
    T.MixUp(1.0, num_classes=4).mix_rows(
        imgs, classes, labels, range(0, 5), _Fixed([0.1, 0.9], 0.5), chw=False, skip=frozenset({1})
    )
    np.testing.assert_array_equal(
        imgs[[0, 1, 4]], before[[0, 1, 4]]
    )  # partner skipped; the odd last
    for i in (0, 4):
        assert labels[i, classes[i]] == 1.0
    with pytest.raises(ValueError, match="even"):
        T.MixUp(num_classes=4).mix_rows(
            imgs, classes, labels, range(1, 5), _Fixed([0.1, 0.9], 0.5), chw=False
        )


def test_mixing_draws_lam_from_beta_and_chooses_as_timm():
    mix = T.MixUpCutMix(0.8, 1.0, num_classes=10, switch_prob=0.3, p=0.8)
    rng = np.random.default_rng(0)
    draws = [mix.params((32, 32), rng) for _ in range(20_000)]
    kinds = Counter(k for k, _, _ in draws)
    assert chi_square_p(kinds, {None: 0.2, "cutmix": 0.8 * 0.3, "mixup": 0.8 * 0.7}) > 0.01
    lams = np.array([lam for k, lam, _ in draws if k == "mixup"])
    assert abs(lams.mean() - 0.5) < 0.01 and abs(lams.var() - 1 / (4 * (2 * 0.8 + 1))) < 0.01
    with pytest.raises(ValueError):
        T.MixUp(0.0, num_classes=10)
    with pytest.raises(ValueError):
        T.CutMix(num_classes=1)
