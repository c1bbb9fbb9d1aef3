"""make_sample_data: photo-like, deterministic, and the class is in the pixels."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

from stoker import OutputExistsError
from stoker.codecs import decode
from stoker.pack import make_sample_data
from stoker.pack.sample_data import sample_image


def test_layout_and_shapes(tmp_path):
    root = make_sample_data(tmp_path / "d", classes=3, per_class=4, size=(24, 40), workers=1)
    assert sorted(os.listdir(root)) == [".stoker-sample.json", "class_00", "class_01", "class_02"]
    files = sorted(os.listdir(root / "class_02"))
    assert files == ["00000.jpg", "00001.jpg", "00002.jpg", "00003.jpg"]
    img = decode((root / "class_02" / "00003.jpg").read_bytes())
    assert img.shape == (24, 40, 3) and img.dtype == np.uint8
    png = make_sample_data(tmp_path / "p", classes=1, per_class=1, size=16, fmt="png")
    assert decode((png / "class_00" / "00000.png").read_bytes()).shape == (16, 16, 3)


def test_deterministic_from_seed_and_any_worker_count(tmp_path):
    a = make_sample_data(tmp_path / "a", classes=2, per_class=260, size=16, seed=5, workers=1)
    b = make_sample_data(tmp_path / "b", classes=2, per_class=260, size=16, seed=5, workers=2)
    for cls in ("class_00", "class_01"):
        for name in ("00000.jpg", "00259.jpg"):
            assert (a / cls / name).read_bytes() == (b / cls / name).read_bytes()
    assert not np.array_equal(sample_image(5, 0, 0, size=16), sample_image(6, 0, 0, size=16))


def test_photo_like_not_flat_not_noise():
    img = sample_image(0, 3, 7, classes=10, size=112).astype(np.float32)
    assert img.std() > 25  # not flat colour
    # neighbouring pixels are strongly correlated (pure noise would give about 0)
    dx = np.corrcoef(img[:, :-1].ravel(), img[:, 1:].ravel())[0, 1]
    assert dx > 0.8
    edges = cv2.Canny(img.astype(np.uint8), 50, 150)
    assert 0.01 < (edges > 0).mean() < 0.5  # edges, but not everywhere


def test_classes_differ_measurably():
    """A nearest-centroid classifier on hue histograms of saturated pixels beats chance by far."""
    classes, n = 10, 12

    def feature(img):
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
        sat = hsv[..., 1] > 120
        hist = np.bincount(hsv[..., 0][sat] // 6, minlength=30).astype(np.float64)
        return hist / max(hist.sum(), 1.0)

    feats = np.array(
        [
            [feature(sample_image(1, c, i, classes=classes, size=48)) for i in range(n)]
            for c in range(classes)
        ]
    )
    train, test = feats[:, : n // 2], feats[:, n // 2 :]
    centroids = train.mean(axis=1)
    d = ((test[:, :, None, :] - centroids[None, None]) ** 2).sum(-1)
    accuracy = (d.argmin(-1) == np.arange(classes)[:, None]).mean()
    assert accuracy > 0.6  # chance is 0.1


def test_reuse_and_refuse(tmp_path):
    root = make_sample_data(tmp_path / "d", classes=1, per_class=2, size=16)
    stamp = (root / "class_00" / "00000.jpg").stat().st_mtime_ns
    make_sample_data(tmp_path / "d", classes=1, per_class=2, size=16)  # same call: reused
    assert (root / "class_00" / "00000.jpg").stat().st_mtime_ns == stamp
    with pytest.raises(OutputExistsError):
        make_sample_data(tmp_path / "d", classes=2, per_class=2, size=16)
    make_sample_data(tmp_path / "d", classes=2, per_class=1, size=16, overwrite=True)
    assert sorted(os.listdir(root / "class_00")) == ["00000.jpg"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="classes"):
        make_sample_data(tmp_path, classes=0)
    with pytest.raises(ValueError, match="fmt"):
        make_sample_data(tmp_path, fmt="gif")
    with pytest.raises(ValueError, match="at least 8x8"):
        make_sample_data(tmp_path, size=4)


def test_counts_are_checked_like_every_int_option(tmp_path):
    with pytest.raises(ValueError, match="workers"):
        make_sample_data(tmp_path, workers=0)
    with pytest.raises(TypeError, match="per_class"):
        make_sample_data(tmp_path, per_class="3")
    assert not any(tmp_path.iterdir())  # checked before anything is written
