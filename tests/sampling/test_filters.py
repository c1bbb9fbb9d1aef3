"""filter_by_label_frequency: both tails dropped, and a report of what went."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoker.sampling import Subset, filter_by_label_frequency


def test_labels_below_min_dropped_above_max_capped():
    labels = np.repeat([0, 1, 2, 3], [500, 60, 4, 1])
    kept, report = filter_by_label_frequency(labels, min_count=5, max_count=100, seed=1)
    counts = np.bincount(labels[kept], minlength=4)
    assert counts.tolist() == [100, 60, 0, 0]
    assert report.rare == {2: 4, 3: 1}
    assert report.capped == {0: 400}
    assert (report.total, report.kept, report.dropped) == (565, 160, 405)
    assert np.all(np.diff(kept) > 0)  # sorted positions
    assert json.loads(json.dumps(report.to_dict()))["rare"] == {"2": 4, "3": 1}
    assert "kept 160 of 565" in str(report)
    # the cap keeps a seeded random subset: another seed keeps other samples of class 0
    other, _ = filter_by_label_frequency(labels, min_count=5, max_count=100, seed=2)
    assert not np.array_equal(kept, other)
    same, _ = filter_by_label_frequency(labels, min_count=5, max_count=100, seed=1)
    assert np.array_equal(kept, same)
    # no thresholds: nothing dropped
    everything, rep = filter_by_label_frequency(labels)
    assert len(everything) == len(labels) and rep.dropped == 0


def test_kept_indices_feed_a_subset_sampler():
    labels = ["a"] * 10 + ["b"] * 2 + ["c"] * 10
    kept, _ = filter_by_label_frequency(labels, min_count=3)
    s = Subset(kept, shuffle=True, seed=0)
    assert sorted(s.indices(0).tolist()) == [i for i, x in enumerate(labels) if x != "b"]


def test_characters_of_text_labels():
    texts = ["你好", "你好吗", "好的", "谢谢你", "龘", "你你你你"]
    # counts: 你 7, 好 3, 吗 1, 的 1, 谢 2, 龘 1
    kept, report = filter_by_label_frequency(texts, by="char", min_count=2)
    assert [texts[i] for i in kept] == ["你好", "谢谢你", "你你你你"]
    assert report.rare == {"吗": 1, "的": 1, "龘": 1}
    # max_count thins out the most frequent character, keeping texts with rarer ones first
    kept, report = filter_by_label_frequency(texts, by="char", max_count=4)
    chosen = [texts[i] for i in kept]
    assert sum(t.count("你") for t in chosen) <= 4
    assert "谢谢你" in chosen and "好的" in chosen and "龘" in chosen
    assert report.capped == {"你": 1} and "你你你你" not in chosen


def test_bad_arguments():
    with pytest.raises(ValueError, match="below min_count"):
        filter_by_label_frequency([1, 2], min_count=5, max_count=2)
    with pytest.raises(ValueError, match="min_count"):
        filter_by_label_frequency([1, 2], min_count=0)
    with pytest.raises(ValueError, match="by must be"):
        filter_by_label_frequency([1, 2], by="word")
    with pytest.raises(TypeError, match="text labels"):
        filter_by_label_frequency([1, 2], by="char")
