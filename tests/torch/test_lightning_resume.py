"""Lightning: a 3-epoch fit over a StatefulDataLoader of RecordDataset with a stoker sampler
(one set's epoch order, or a mixture of two sets' ``MixtureOrder``),
SIGKILLed mid-epoch and resumed from its last checkpoint in a new process, trains on exactly
the batches of an uninterrupted fit (pixels and labels compared): the loader's state is saved
in the checkpoint and restored."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import stoker

pytestmark = pytest.mark.interop  # needs Lightning (`make test-interop`)

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "lightning_fit.py")


def _fit(path: str, log, ckpt_dir, kill_at: int, workers: int, resume: bool = False) -> int:
    args = [path, str(log), str(ckpt_dir), str(kill_at), str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args, *(["resume"] if resume else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode


def _steps(log) -> list[tuple[int, int, str]]:
    with open(log) as f:
        return [(int(e), int(s), d) for e, s, d in (ln.split() for ln in f)]


@pytest.mark.parametrize(
    "workers, mixed", [(0, False), (2, True), pytest.param(2, False, marks=pytest.mark.slow)]
)
def test_a_fit_killed_mid_epoch_resumes_with_the_same_batches(tmp_path, workers, mixed):
    images = stoker.make_sample_data(
        tmp_path / "images", classes=3, per_class=14, size=48, workers=1
    )
    stoker.pack(images, tmp_path / "set" / "train", workers=1, progress=False)
    path = str(tmp_path / "set" / "train.stoker.json")  # 42 samples: 7 steps an epoch
    if mixed:  # with a TFRecord set of 18 in a MixtureOrder of 42 draws an epoch
        other = stoker.make_sample_data(tmp_path / "b", classes=2, per_class=9, size=48, workers=1)
        stoker.pack(other, tmp_path / "b" / "train", format="tfrecord", workers=1, progress=False)
        path += f",{tmp_path / 'b' / 'train.stoker.json'}"
    assert _fit(path, tmp_path / "ref.log", tmp_path / "ref", 0, workers) == 0
    reference = _steps(tmp_path / "ref.log")
    assert len(reference) == 21
    kill_at = 11  # epoch 1, step 4 of 7; the last checkpoint is at step 9, mid-epoch 1
    assert _fit(path, tmp_path / "a.log", tmp_path / "ck", kill_at, workers) == -9  # SIGKILL
    assert _fit(path, tmp_path / "b.log", tmp_path / "ck", 0, workers, resume=True) == 0
    before = _steps(tmp_path / "a.log")[:9]  # what the checkpoint of step 9 had trained on
    after = _steps(tmp_path / "b.log")
    assert after[0][:2] == (1, 9)  # it went on from there, mid-epoch
    assert before + after == reference
