"""``RecordDataset`` in a torch ``DataLoader`` whose workers start with spawn (macOS's and
Windows's default): each worker gets the dataset pickled as its configuration and reopens the
set, so the batches equal those without workers. RecordIO in the default run (one spawned
worker: its start is most of the cost); every format that ``stoker pack`` writes, with 2
workers, under ``slow`` (LMDB, read only: ``tests/formats/test_lmdb.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import stoker  # noqa: E402
import stoker.torch as st  # noqa: E402
from stoker.transforms import CenterCrop, Compose, HorizontalFlip, Resize  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TRANSFORMS = Compose([Resize(24, shorter_side=True), CenterCrop(20), HorizontalFlip()])


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    """14 JPEGs of varied sizes in 2 class folders."""
    root = tmp_path_factory.mktemp("spawn_img")
    rng = np.random.default_rng(4)
    for i in range(14):
        folder = root / f"c{i % 2}"
        folder.mkdir(exist_ok=True)
        img = rng.integers(0, 256, (24 + 4 * (i % 3), 28 + 2 * (i % 4), 3), dtype=np.uint8)
        (folder / f"{i:02d}.jpg").write_bytes(simplejpeg.encode_jpeg(img, quality=90))
    return str(root)


def _packed(images: str, tmp_path, fmt: str) -> str:
    report = stoker.pack(images, tmp_path / fmt, format=fmt, workers=1, progress=False)
    assert report.written == 14
    return report.manifest


def _same_with_spawned_workers(path: str, workers: int) -> None:
    ds = st.RecordDataset(path, transforms=TRANSFORMS, seed=3, layout="CHW")
    try:
        want = [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=4)]
        spawned = DataLoader(ds, batch_size=4, num_workers=workers, multiprocessing_context="spawn")
        got = list(spawned)
    finally:
        ds.close()
    assert len(got) == len(want) == 4
    for (x1, y1), (x2, y2) in zip(got, want, strict=True):
        assert x1.shape == (len(y1), 3, 20, 20)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_recordio_in_a_spawned_dataloader(images, tmp_path):
    _same_with_spawned_workers(_packed(images, tmp_path, "recordio"), workers=1)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_every_format_in_a_spawned_dataloader(images, tmp_path, fmt):
    _same_with_spawned_workers(_packed(images, tmp_path, fmt), workers=2)


def test_pack_writes_the_formats_this_file_covers():
    """The slow matrix above names every format pack writes: a new one joins it."""
    from stoker.formats import registry

    writable = {f.name for f in registry.FORMATS.values() if f.writer is not None}
    assert writable == {"recordio", "tfrecord", "wds"}, sorted(writable)
