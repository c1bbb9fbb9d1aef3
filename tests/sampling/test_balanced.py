"""ClassBalanced: converges to the target class distribution, on one rank and across ranks;
bad weights and empty classes (faults.md B6 #66)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import ClassBalanced

# long-tailed: 500, 200, 80, 30, 10, 3, 1 samples in classes 0..6
COUNTS = [500, 200, 80, 30, 10, 3, 1]
LABELS = np.repeat(np.arange(len(COUNTS)), COUNTS)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(observed: np.ndarray, target: np.ndarray) -> float:
    expected = target * observed.sum()
    return float(np.sum((observed - expected) ** 2 / expected))


def class_counts(idx):
    return np.bincount(LABELS[idx], minlength=len(COUNTS))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_inverse_weights_balance_a_long_tail(seed):
    s = ClassBalanced(LABELS, num_samples=20_000, seed=seed)
    np.testing.assert_allclose(s.target, 1 / len(COUNTS))
    obs = class_counts(s.indices(0))
    assert chi2(obs, s.target) < chi2_critical(len(COUNTS) - 1)
    # the test has power: the natural distribution is far from the target
    natural = np.asarray(COUNTS) / sum(COUNTS) * 20_000
    assert chi2(natural, s.target) > 100 * chi2_critical(len(COUNTS) - 1)


def test_user_class_weights_give_their_target():
    weights = {0: 1.0, 1: 2.0, 2: 5.0, 3: 10.0, 4: 20.0, 5: 50.0, 6: 100.0}
    s = ClassBalanced(LABELS, weights=weights, num_samples=30_000, seed=5)
    mass = np.asarray(COUNTS) * np.asarray(list(weights.values()))
    np.testing.assert_allclose(s.target, mass / mass.sum())
    assert chi2(class_counts(s.indices(3)), s.target) < chi2_critical(len(COUNTS) - 1)
    # the same weights as a sequence indexed by class number
    seq = ClassBalanced(LABELS, weights=list(weights.values()), num_samples=30_000, seed=5)
    assert np.array_equal(seq.indices(3), s.indices(3))


def test_sample_weights_and_sqrt_inverse():
    sw = np.ones(len(LABELS))
    sw[LABELS == 0] = 0.1
    s = ClassBalanced(LABELS, sample_weights=sw, num_samples=20_000, seed=1)
    mass = np.asarray(COUNTS, dtype=float)
    mass[0] *= 0.1
    np.testing.assert_allclose(s.target, mass / mass.sum())
    assert chi2(class_counts(s.indices(0)), s.target) < chi2_critical(len(COUNTS) - 1)
    q = ClassBalanced(LABELS, weights="sqrt_inverse", num_samples=20_000, seed=1)
    np.testing.assert_allclose(q.target, np.sqrt(COUNTS) / np.sqrt(COUNTS).sum())
    assert chi2(class_counts(q.indices(0)), q.target) < chi2_critical(len(COUNTS) - 1)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ranks_split_one_global_draw(world):
    ranks = [
        ClassBalanced(LABELS, num_samples=20_001, seed=9, rank=r, world_size=world)
        for r in range(world)
    ]
    parts = [s.indices(4) for s in ranks]
    assert {len(p) for p in parts} == {len(ranks[0])} == {math.ceil(20_001 / world)}
    # interleaving the ranks gives back the one global draw (plus the declared padding)
    glob = np.stack(parts, axis=1).reshape(-1)
    draw = ranks[0].global_draw(4)
    assert np.array_equal(glob[: len(draw)], draw)
    assert len(glob) - len(draw) == ranks[0].padding <= world - 1
    k = len(COUNTS) - 1
    assert chi2(class_counts(np.concatenate(parts)), ranks[0].target) < chi2_critical(k)
    for p in parts:  # each rank on its own is balanced too
        assert chi2(class_counts(p), ranks[0].target) < chi2_critical(k)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    world=st.integers(1, 8),
    drop_last=st.booleans(),
    replacement=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_rank_algebra_and_determinism(counts, world, drop_last, replacement, seed):
    labels = np.repeat(np.arange(len(counts)), counts)
    n = len(labels)

    def make(r):
        return ClassBalanced(
            labels,
            replacement=replacement,
            seed=seed,
            rank=r,
            world_size=world,
            drop_last=drop_last,
        )

    samplers = [make(r) for r in range(world)]
    for epoch in range(2):
        parts = [s.indices(epoch) for s in samplers]
        assert {len(p) for p in parts} == {len(samplers[0])}
        total = sum(len(p) for p in parts)
        assert total == n + samplers[0].padding - samplers[0].dropped
        assert np.array_equal(make(0).indices(epoch), parts[0])
        if not replacement:
            c = Counter(np.concatenate(parts).tolist())
            if drop_last:
                assert max(c.values(), default=1) == 1
            else:  # a permutation of the dataset plus the declared padding
                assert set(c) == set(range(n))
                assert sum(c.values()) - n == samplers[0].padding


def test_epochs_differ_and_seeds_matter():
    s = ClassBalanced(LABELS, seed=1)
    assert not np.array_equal(s.indices(0), s.indices(1))
    assert not np.array_equal(s.indices(0), ClassBalanced(LABELS, seed=2).indices(0))


def test_without_replacement_draws_by_weight():
    # Efraimidis-Spirakis: the first drawn item is item i with probability w_i / sum(w)
    w = np.array([1.0, 2.0, 3.0, 4.0])
    s = ClassBalanced(np.arange(4), sample_weights=w, replacement=False, num_samples=1, seed=4)
    first = np.array([s.global_draw(e)[0] for e in range(3000)])
    obs = np.bincount(first, minlength=4)
    assert chi2(obs, w / w.sum()) < chi2_critical(3)
    # a full epoch without replacement is a permutation
    full = ClassBalanced(LABELS, replacement=False, seed=2)
    assert sorted(full.indices(0).tolist()) == list(range(len(LABELS)))
    # a partial one has no duplicate and favours the rare classes over their natural share
    part = ClassBalanced(LABELS, replacement=False, num_samples=100, seed=2).indices(0)
    assert len(set(part.tolist())) == 100
    frac_major = np.mean(LABELS[part] == 0)
    assert frac_major < 0.5 * COUNTS[0] / sum(COUNTS)
    with pytest.raises(ValueError, match="without replacement"):
        ClassBalanced(LABELS, replacement=False, num_samples=len(LABELS) + 1)


def test_single_sample_class_is_drawn_as_often_as_the_others():
    labels = np.array([0] * 99 + [1])
    s = ClassBalanced(labels, num_samples=4000, seed=0)
    share = np.mean(labels[s.indices(0)] == 1)
    assert 0.45 < share < 0.55


def test_empty_classes_are_excluded_with_a_warning():
    with pytest.warns(UserWarning, match=r"3 class\(es\) have no samples.*7, 8, 9"):
        s = ClassBalanced(LABELS, num_classes=10, num_samples=1000)
    assert s.empty_classes == [7, 8, 9]
    drawn = set(LABELS[s.indices(0)].tolist())
    assert drawn == set(range(7))
    with pytest.warns(UserWarning, match="'dog'"):
        ClassBalanced(["cat", "cat", "bird"], weights={"cat": 1, "bird": 1, "dog": 2})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": {0: 1, 1: 0, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}}, "class 1 must be finite and > 0"),
        ({"weights": {0: 1, 1: -2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}}, "class 1"),
        ({"weights": [1, 1, float("nan"), 1, 1, 1, 1]}, "class 2"),
        ({"weights": [1, 1, 1, 1, 1, 1, float("inf")]}, "class 6"),
        ({"weights": {0: 1, 1: 1}}, "class 2 has 80 samples but no weight"),
        ({"weights": "balanced"}, "weights must be one of"),
        ({"sample_weights": np.r_[np.ones(823), [np.nan]]}, "sample 823"),
        ({"sample_weights": np.zeros(824)}, "sample 0"),
        ({"sample_weights": np.ones(3)}, "one weight per sample"),
        ({"sample_weights": np.ones(824), "weights": "sqrt_inverse"}, "not both"),
        ({"num_samples": -1}, "num_samples"),
        ({"num_classes": 3}, r"outside \[0, num_classes=3\)"),
    ],
)
def test_bad_weights_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClassBalanced(LABELS, **kwargs)


def test_labels_from_records_and_strings():
    floats = LABELS.astype(np.float32)  # RecordFile.labels() is float32
    assert np.array_equal(
        ClassBalanced(floats, seed=1).indices(0), ClassBalanced(LABELS, seed=1).indices(0)
    )
    with pytest.raises(ValueError, match=r"labels\[1\] = nan"):
        ClassBalanced([0.0, float("nan")])
    with pytest.raises(ValueError, match=r"labels\[0\] = 0.5"):
        ClassBalanced([0.5, 1.0])
    with pytest.raises(ValueError, match="1-D"):
        ClassBalanced(np.zeros((4, 2)))
    s = ClassBalanced(["a"] * 9 + ["b"], num_samples=2000, seed=3)
    assert list(s.classes) == ["a", "b"]
    fp = s.fingerprint()
    assert json.loads(json.dumps(fp)) == fp
