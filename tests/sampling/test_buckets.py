"""LengthBuckets: batches respect the length bounds, every sample once per epoch, whole batches
split across ranks, one width per batch; bad lengths and small buckets (faults.md B6 #67)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.sampling import LengthBuckets, ProportionalWidth


@st.composite
def bucket_cases(draw):
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=300))
    top = max(lengths)
    inner = draw(st.lists(st.integers(0, top), max_size=5, unique=True))
    bounds = sorted(set(inner) | {top + draw(st.integers(0, 3))})
    return {
        "lengths": lengths,
        "bucket_bounds": bounds,
        "batch_size": draw(st.integers(1, 16)),
        "world_size": draw(st.integers(1, 8)),
        "drop_last": draw(st.booleans()),
        "shuffle": draw(st.booleans()),
        "small_bucket": draw(st.sampled_from(["merge", "drop"])),
        "seed": draw(st.integers(0, 2**31)),
    }


def lower_bound(bounds, b):
    return -1 if b == 0 else bounds[b - 1]


@settings(max_examples=150, deadline=None)
@given(case=bucket_cases(), epoch=st.integers(0, 3))
def test_bucket_properties(case, epoch):
    world = case.pop("world_size")
    lengths = np.asarray(case["lengths"])
    bounds = case["bucket_bounds"]
    bs = case["batch_size"]
    width = ProportionalWidth(4.0, multiple=8)
    samplers = [LengthBuckets(widths=width, rank=r, world_size=world, **case) for r in range(world)]
    s0 = samplers[0]
    rep = s0.report()
    n = len(lengths)

    # -- the global batches of the epoch (before the rank split)
    glob, key = s0.global_batches(epoch)
    assert glob.shape == (rep["batches"], bs)
    mixed = 0
    for row, k in zip(glob, key):
        ids = s0.bucket_ids[row]
        assert lengths[row].max() <= bounds[k]  # the batch fits its bucket's bound
        assert ids.max() == k
        if ids.min() != ids.max():
            mixed += 1
            assert case["small_bucket"] == "merge"
        else:
            assert lengths[row].min() > lower_bound(bounds, k)
    assert mixed <= -(-rep["tail"] // bs)  # only the merged tails span buckets
    counts = Counter(glob.reshape(-1).tolist())
    if case["small_bucket"] == "merge" and not case["drop_last"]:
        assert set(counts) == set(range(n))  # every sample, exactly once ...
        assert sum(counts.values()) - n == (-rep["tail"]) % bs  # ... plus the declared fill
    else:
        assert max(counts.values(), default=1) == 1
        expected_missing = rep["tail"] if case["small_bucket"] == "drop" else rep["tail"] % bs
        assert n - len(counts) == expected_missing

    # -- the rank split: whole batches, equal lengths, declared padding/dropping
    parts = [s.indices(epoch) for s in samplers]
    assert {len(p) for p in parts} == {len(s0)}
    assert len(s0) % bs == 0
    total = sum(len(p) for p in parts)
    assert total == n + rep["padding"] - rep["dropped"]
    all_rows = Counter()
    for s, p in zip(samplers, parts):
        rows = p.reshape(-1, bs)
        assert np.array_equal(rows, s.batches(epoch))
        all_rows.update(map(tuple, rows.tolist()))
        widths = s.batch_widths(epoch, bs)
        assert len(widths) == len(rows)
        assert widths.tolist() == [width(int(lengths[r].max())) for r in rows]
    glob_rows = Counter(map(tuple, glob.tolist()))
    if case["drop_last"]:
        assert all(all_rows[r] <= c for r, c in glob_rows.items())
        assert glob_rows.total() - all_rows.total() == rep["batches"] % world
    else:
        assert all(all_rows[r] >= c for r, c in glob_rows.items())
        assert all_rows.total() - glob_rows.total() == (-rep["batches"]) % world
        assert all_rows.total() - glob_rows.total() <= world - 1

    # -- a pure function of (seed, epoch)
    again = LengthBuckets(widths=width, rank=0, world_size=world, **case)
    assert np.array_equal(again.indices(epoch), parts[0])
    assert len(s0) == len(LengthBuckets(widths=width, world_size=world, **case))


def test_small_buckets_policy_is_explicit_and_counted():
    # buckets (<=5, <=10, <=15) hold 10, 3 and 7 samples; batch 4
    lengths = [1] * 10 + [7] * 3 + [12] * 7
    merge = LengthBuckets(lengths, batch_size=4, bucket_bounds=[5, 10, 15], shuffle=False)
    assert merge.report() == {
        "samples": 20,
        "bounds": [5, 10, 15],
        "bucket_sizes": [10, 3, 7],
        "batch_size": 4,
        "batches": 5,  # 2 + 0 + 1 full batches, then tails 2 + 3 + 3 = 8 -> 2 merged
        "batches_per_rank": 5,
        "small_bucket": "merge",
        "tail": 8,
        "merged": 8,
        "padding": 0,
        "dropped": 0,
    }
    assert sorted(merge.indices(0).tolist()) == list(range(20))
    drop = LengthBuckets(lengths, batch_size=4, bucket_bounds=[5, 10, 15], small_bucket="drop")
    assert (drop.report()["batches"], drop.dropped, drop.padding) == (3, 8, 0)
    assert len(drop) == 12
    # a last incomplete merged batch is filled with repeats, or dropped with drop_last
    odd = [1] * 10 + [7] * 3
    fill = LengthBuckets(odd, batch_size=4, bucket_bounds=[5, 10])
    assert (fill.report()["batches"], fill.padding, fill.dropped) == (4, 3, 0)
    assert set(fill.indices(0).tolist()) == set(range(13))
    cut = LengthBuckets(odd, batch_size=4, bucket_bounds=[5, 10], drop_last=True)
    assert (cut.report()["batches"], cut.padding, cut.dropped) == (3, 0, 1)


def test_without_shuffle_batches_come_in_length_order():
    lengths = [12, 3, 7, 1, 14, 9, 2, 6]
    s = LengthBuckets(lengths, batch_size=2, bucket_bounds=[5, 10, 15], shuffle=False)
    rows = [np.asarray(lengths)[b].tolist() for b in s.batches(0)]
    # full batches of each bucket, then the merged tails (lengths 2 and 6) by their longest
    assert rows == [[3, 1], [7, 9], [2, 6], [12, 14]]


def test_widths_per_bucket_and_from_the_seed_rule():
    lengths = [3] * 8 + [8] * 8 + [13] * 8
    s = LengthBuckets(lengths, batch_size=4, bucket_bounds=[5, 10, 15], widths=[100, 200, 300])
    for row, w in zip(s.batches(2), s.batch_widths(2, 4)):
        assert w == {3: 100, 8: 200, 13: 300}[lengths[row[0]]]
    rule = ProportionalWidth(20, multiple=4)  # seed 001: <5 chars -> 100 wide, <10 -> 200
    assert (rule(5), rule(10), rule(0)) == (100, 200, 4)
    assert ProportionalWidth(20, multiple=32, min_width=64, max_width=160)(10) == 160
    assert LengthBuckets(lengths, batch_size=4, num_buckets=3).batch_widths(0, 4) is None
    with pytest.raises(ValueError, match="batches of 8 samples were asked for"):
        s.batch_widths(0, 8)


def test_quantile_buckets():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 400)
    s = LengthBuckets(lengths, batch_size=8, num_buckets=4, seed=1)
    assert len(s.bounds) <= 4 and s.bounds[-1] == lengths.max()
    assert s.bucket_sizes.min() > 60  # roughly equal buckets
    assert sorted(s.indices(0).tolist())[: len(lengths)] == sorted(set(s.indices(0).tolist()))


@pytest.mark.parametrize(
    ("lengths", "kwargs", "exc", "match"),
    [
        ([1, 2, 3], {"dataset_size": 4}, ValueError, "3 entries but the dataset has 4"),
        ([1, None, 3], {}, ValueError, r"lengths\[1\] is missing \(None\)"),
        ([1, float("nan"), 3], {}, ValueError, r"lengths\[1\] is missing \(NaN\)"),
        ([1, 2.5], {}, ValueError, r"lengths\[1\] is 2.5"),
        ([1, -2], {}, ValueError, r"lengths\[1\] = -2 is negative"),
        ([1, 2, 30], {}, ValueError, r"1 sample\(s\) are longer than the last bucket bound 10"),
        (["ab", "c"], {}, TypeError, "integers"),
        ([1, 2], {"bucket_bounds": [5, 5]}, ValueError, "strictly increasing"),
        ([1, 2], {"num_buckets": 2}, ValueError, "exactly one of"),
        ([1, 2], {"widths": [10, 20]}, ValueError, "2 entries for 1 buckets"),
        ([1, 2], {"small_bucket": "pad"}, ValueError, "small_bucket"),
        ([1, 2], {"batch_size": 0}, ValueError, "batch_size"),
    ],
)
def test_bad_lengths_and_options(lengths, kwargs, exc, match):
    args = {"batch_size": 2, "bucket_bounds": [10]} | kwargs
    if "num_buckets" in kwargs:
        args["bucket_bounds"] = [10]
    with pytest.raises(exc, match=match):
        LengthBuckets(lengths, **args)


def test_fingerprint_is_json():
    s = LengthBuckets([1, 5, 9], batch_size=2, bucket_bounds=[10], widths=ProportionalWidth(8))
    fp = s.fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    assert fp != LengthBuckets([1, 5, 8], batch_size=2, bucket_bounds=[10]).fingerprint()
