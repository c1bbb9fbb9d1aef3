"""Keras ``fit`` resumed mid-epoch: a 3-epoch ``fit_resumable`` SIGKILLed in its second epoch
and run again on the same checkpoint folder in a new process trains on exactly the batches of
an uninterrupted fit (pixels and labels compared), and ends with the same weights; for one set
and for a mixture of two."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stoker

HERE = os.path.dirname(__file__)


def _fit(path: str, log, folder, kill_at: int, workers: int) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [path, str(log), str(folder), str(kill_at), str(workers)]
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "resume_fit.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, -9), proc.stderr[-3000:]
    return proc.returncode


def _lines(log) -> list[str]:
    with open(log) as f:
        return f.read().split("\n")[:-1]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    """42 samples: 7 batches of 6 an epoch. Packed before any test's leak check looks (the
    packer's process server lives as long as the test process)."""
    root = tmp_path_factory.mktemp("keras-resume")
    images = stoker.make_sample_data(root / "images", classes=3, per_class=14, size=48, workers=1)
    stoker.pack(images, root / "set" / "train", workers=1, progress=False)
    other = stoker.make_sample_data(root / "b", classes=2, per_class=9, size=48, workers=1)
    stoker.pack(other, root / "b" / "train", format="tfrecord", workers=1, progress=False)
    return f"{root / 'set' / 'train.stoker.json'},{root / 'b' / 'train.stoker.json'}"


@pytest.mark.slow
@pytest.mark.parametrize("workers, mixed", [(0, False), (2, False), (2, True)])
def test_a_fit_killed_mid_epoch_resumes_with_the_same_batches_and_weights(
    tmp_path, packed, workers, mixed
):
    """One set, or a mixture of it and a TFRecord set (42 draws an epoch, as the one set's)."""
    path = packed if mixed else packed.split(",")[0]
    assert _fit(path, tmp_path / "ref.log", tmp_path / "ref", 0, workers) == 0
    reference = _lines(tmp_path / "ref.log")
    assert len(reference) == 21
    # killed at step 11 (epoch 1, batch 3 of 7); the newest checkpoint is of step 9
    assert _fit(path, tmp_path / "a.log", tmp_path / "ck", 11, workers) == -9
    assert _fit(path, tmp_path / "b.log", tmp_path / "ck", 0, workers) == 0
    after = _lines(tmp_path / "b.log")
    assert after[0].split()[:2] == ["1", "2"]  # it went on mid-epoch 1
    assert _lines(tmp_path / "a.log")[:9] + after == reference
    end = [np.load(tmp_path / d / "weights-end.npy") for d in ("ref", "ck")]
    np.testing.assert_array_equal(end[0], end[1])


def test_checkpoints_are_whole_and_the_two_newest_are_kept(tmp_path):
    from resume_fit import tiny_model

    from stoker.keras import fit_resumable

    x = np.random.default_rng(0).integers(0, 255, (24, 8, 8, 3), dtype=np.uint8)
    y = np.arange(24) % 3
    model = tiny_model(8)
    with stoker.Loader((x, y), batch_size=4, shuffle=True, seed=1, workers=0) as loader:
        opts = {"x_dtype": "float32"}
        saver = fit_resumable(
            model, loader, epochs=2, folder=tmp_path, every=5, dataset_options=opts
        )
        assert saver.steps == 12  # 2 epochs of 6 batches
        kept = sorted(p.name for p in tmp_path.iterdir())
        assert kept == ["latest", "step-000000005", "step-000000010"]
        assert (tmp_path / "latest").read_text() == "step-000000010"
        state = json.loads((tmp_path / "step-000000010" / "loader.json").read_text())
        assert state["steps"] == 10 and state["loader"]["epoch"] == 1
        assert state["loader"]["batch"] == 4  # 10 batches done: 4 of the second epoch
        again = fit_resumable(model, loader, epochs=2, folder=tmp_path, every=5, verbose=0)
        assert again.steps == 12  # resumed at step 10: the 2 batches left, nothing more
