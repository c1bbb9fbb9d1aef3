"""Chains, choices, plain callables and the call-time shape check."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest

import stoker.transforms as T
from stoker._core.errors import SpecError
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec

RNG = np.random.default_rng(0)


# module-level, so they pickle
def invert(img):
    return 255 - img


def add_noise(img, rng):
    return np.clip(img + rng.integers(0, 3, img.shape), 0, 255).astype(np.uint8)


def scale_by(img, factor=2):
    return img * factor


def widen(img):
    return np.concatenate([img, img[:, :1]], axis=1)


def to_float(img):
    return img.astype(np.float64)


def give_none(img):
    return None


class BadSpec(T.Transform):
    """A user transform that declares one thing and returns another."""

    def __call__(self, img, rng):
        return img[:-1]

    def output_spec(self, in_spec):
        return in_spec


def test_plain_callables_stand_in_a_chain(rgb):
    chain = T.Compose([T.CenterCrop(32), invert, add_noise])
    out = chain(rgb, sample_rng(0, 0, 0))
    # CenterCrop and invert draw nothing, so add_noise sees the generator as it was handed in
    expected = add_noise(255 - T.CenterCrop(32)(rgb, RNG), sample_rng(0, 0, 0))
    np.testing.assert_array_equal(out, expected)


def test_arity_detection():
    assert T.as_transform(invert).takes_rng is False
    assert T.as_transform(add_noise).takes_rng is True
    assert T.as_transform(scale_by).takes_rng is False  # a default is not an rng
    assert T.as_transform(lambda img, rng=None: img).takes_rng is True  # named rng
    assert T.as_transform(np.ascontiguousarray).takes_rng is False
    assert T.as_transform(invert, takes_rng=True).takes_rng is True
    op = T.Rotate(3)
    assert T.as_transform(op) is op
    with pytest.raises(TypeError, match="callable"):
        T.as_transform(42)


def test_shape_mismatch_names_step_op_got_and_expected(rgb):
    chain = T.Compose([T.CenterCrop(32), T.as_transform(widen, output=ArraySpec((32, 32, 3)))])
    with pytest.raises(SpecError) as e:
        chain(rgb, RNG)
    msg = str(e.value)
    assert "Compose step 1" in msg and "widen" in msg
    assert "got (32, 33, 3) uint8" in msg and "expected (32, 32, 3) uint8" in msg


def test_unknown_output_still_checks_rank_and_dtype(rgb):
    T.Compose([widen])(rgb, RNG)  # sizes unknown: any size passes
    assert T.Compose([widen]).output_spec(ArraySpec((4, 4, 3))) == ArraySpec((None, None, None))
    with pytest.raises(
        SpecError, match=r"step 0 .*got \(40, 48, 3\) float64, expected \(\?, \?, \?\) uint8"
    ):
        T.Compose([to_float])(rgb, RNG)
    with pytest.raises(SpecError, match="returned NoneType"):
        T.Compose([give_none])(rgb, RNG)
    with pytest.raises(SpecError, match=r"Compose step 1 \(BadSpec\(\)\): got \(39, 48, 3\)"):
        T.Compose([T.HorizontalFlip(), BadSpec()])(rgb, RNG)
    assert T.as_transform(invert, output="same").output_spec(ArraySpec((4, 5))) == ArraySpec((4, 5))


def test_checks_reach_inside_choices(rgb):
    with pytest.raises(SpecError, match="RandomChoice branch 0"):
        T.Compose([T.RandomChoice([T.as_transform(widen, output="same")])])(rgb, RNG)
    with pytest.raises(SpecError, match="RandomApply"):
        T.RandomApply(T.as_transform(widen, output="same"), p=1.0)(rgb, RNG)


def test_spec_errors_name_the_step():
    chain = T.Compose([T.Resize(16), T.RandomCrop(20)])
    with pytest.raises(SpecError, match=r"Compose step 1 \(RandomCrop.*\) on \(16, 16, 3\) uint8"):
        chain.output_spec(ArraySpec((64, 64, 3)))


def test_compose_arguments():
    with pytest.raises(TypeError, match="list of transforms"):
        T.Compose(T.Rotate(3))
    with pytest.raises(TypeError, match="step 1"):
        T.Compose([T.Rotate(3), "flip"])
    assert len(T.Compose([])) == 0
    assert T.Compose([T.Sharpen()])[0] == T.Sharpen()


def test_random_choice_is_uniform_or_weighted(rgb):
    op = T.RandomChoice([T.Sharpen(), T.Smooth(), T.HorizontalFlip(1.0)])
    counts = Counter(op.choose(sample_rng(0, 0, i)) for i in range(3000))
    assert all(900 < counts[k] < 1100 for k in range(3))
    op = T.RandomChoice([T.Sharpen(), T.Smooth()], weights=[3, 1])
    counts = Counter(op.choose(sample_rng(0, 0, i)) for i in range(2000))
    assert 1400 < counts[0] < 1600
    with pytest.raises(ValueError, match="weights"):
        T.RandomChoice([T.Sharpen()], weights=[1, 2])
    with pytest.raises(ValueError, match="at least one"):
        T.RandomChoice([])


def test_choice_output_is_the_chosen_branch(rgb):
    branches = [T.Sharpen(), T.Smooth(), T.HorizontalFlip(1.0)]
    op = T.RandomChoice(branches)
    for i in range(10):
        k = op.choose(sample_rng(2, 0, i))
        np.testing.assert_array_equal(op(rgb, sample_rng(2, 0, i)), branches[k](rgb, RNG))


def test_branch_specs_merge():
    op = T.RandomChoice([T.Resize((10, 12)), T.Resize((10, 14))])
    assert op.output_spec(ArraySpec((40, 40, 3))) == ArraySpec((10, None, 3))
    with pytest.raises(SpecError, match="incompatible"):
        T.RandomChoice([T.Sharpen(), T.Normalize()]).output_spec(ArraySpec((8, 8, 3)))
    assert T.RandomApply(T.Resize(8), p=0.5).output_spec(ArraySpec((8, 9, 3))) == ArraySpec(
        (8, None, 3)
    )
    assert T.RandomApply(T.Resize(8), p=1.0).output_spec(ArraySpec((8, 9, 3))) == ArraySpec(
        (8, 8, 3)
    )
    assert T.OneOf([T.Resize(8)], p=1.0).output_spec(ArraySpec((8, 9, 3))) == ArraySpec((8, 8, 3))
    assert T.OneOf([T.Resize(8)], p=0.5).output_spec(ArraySpec((8, 9, 3))) == ArraySpec(
        (8, None, 3)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.RandomApply(T.HorizontalFlip(1.0), p=0.3),
        lambda: T.OneOf([T.HorizontalFlip(1.0)], p=0.3),
    ],
)
def test_apply_probability(rgb, make):
    op = make()
    applied = sum(not np.array_equal(op(rgb, sample_rng(0, 0, i)), rgb) for i in range(2000))
    assert 0.26 < applied / 2000 < 0.34


def test_random_apply_of_a_list_composes(rgb):
    op = T.RandomApply([T.CenterCrop(30), T.Sharpen()], p=1.0)
    assert isinstance(op.transform, T.Compose)
    np.testing.assert_array_equal(op(rgb, RNG), T.Sharpen()(T.CenterCrop(30)(rgb, RNG), RNG))


def test_chains_with_plain_functions_pickle(rgb):
    chain = T.Compose([T.RandomChoice([invert, T.Sharpen()]), T.RandomApply(add_noise, 0.5)])
    clone = pickle.loads(pickle.dumps(chain))
    np.testing.assert_array_equal(clone(rgb, sample_rng(1, 1, 1)), chain(rgb, sample_rng(1, 1, 1)))
    assert "as_transform(invert)" in repr(chain)
