"""A plain DataLoader resumes too: torchdata's ``StatefulDataLoader`` over ``RecordDataset`` with
a stoker sampler (the epoch order, the class-balanced draw, length buckets, with 0 and 2
workers; a mixture of a RecordIO and a TFRecord set with ``MixtureOrder``, 2 workers),
stopped after k batches of the second epoch and resumed in a new process, delivers the rest
of that epoch exactly: the same samples, the same augmentation (pixels compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import stoker
from stoker.sampling import EpochOrder

pytest.importorskip("torchdata")
# torchdata's StatefulDataLoader calls torch.set_vital, which this torch marks deprecated
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

from stateful_loop import BATCH, CONFIGS, build, digest, run_epochs  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from stoker.torch import RecordDataset  # noqa: E402

HERE = os.path.dirname(__file__)
STOP = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("stateful")
    images = stoker.make_sample_data(
        root / "images", classes=3, per_class=14, size=48, seed=4, workers=1
    )
    stoker.pack(images, root / "set" / "train", workers=1, progress=False)
    other = stoker.make_sample_data(root / "b", classes=2, per_class=9, size=48, seed=5, workers=1)
    stoker.pack(other, root / "b" / "train", format="tfrecord", workers=1, progress=False)
    return f"{root / 'set' / 'train.stoker.json'},{root / 'b' / 'train.stoker.json'}"


def _script(tmp_path, mode: str, path: str) -> dict:
    out = tmp_path / f"{mode}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, *sys.path])}
    args = [mode, path, str(tmp_path / "state.json"), str(out), str(STOP)]
    subprocess.run(
        [sys.executable, os.path.join(HERE, "stateful_loop.py"), *args],
        check=True,
        env=env,
        timeout=120,
    )
    return json.loads(out.read_text())


def test_stopped_after_k_batches_resumes_in_a_new_process_with_the_same_batches(packed, tmp_path):
    reference = {}
    for kind, workers in CONFIGS:
        ds, dl = build(packed, kind, workers)
        reference[f"{kind}-{workers}"], _ = run_epochs(ds, dl, range(2), None)
    stopped = _script(tmp_path, "stop", packed)
    state = json.loads((tmp_path / "state.json").read_text())
    resumed = _script(tmp_path, "resume", packed)
    for name, ref in reference.items():
        per_epoch = len(ref) // 2
        assert stopped[name] == ref[: per_epoch + STOP], name
        assert resumed[name] == ref[per_epoch + STOP :], name  # the rest of epoch 1, exactly
        assert len(resumed[name]) == per_epoch - STOP
        assert "epoch" in json.dumps(state[name])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_resumes_from_what_the_loop_consumed(packed, workers):
    """A plain DataLoader's workers fetch ahead of the loop: the state counts what the loop
    took (``consumed=``), not what the sampler handed out."""

    def loader(sampler: EpochOrder) -> DataLoader:
        ds = RecordDataset(packed.split(",")[0], seed=7)
        return DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)

    sampler = EpochOrder(42, shuffle=True, seed=1)
    sampler.set_epoch(1)
    ref = [digest(b) for b in loader(sampler)]
    sampler = EpochOrder(42, shuffle=True, seed=1)
    sampler.set_epoch(1)
    it = iter(loader(sampler))
    first = [digest(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(sampler.state_dict(consumed=2 * BATCH)))
    del it
    fresh = EpochOrder(42, shuffle=True, seed=1)
    fresh.load_state_dict(state)
    assert first + [digest(b) for b in loader(fresh)] == ref
