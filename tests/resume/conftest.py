"""Small packed sets for the check-resume tests: 3 classes x 16 images of 48 px, packed as
RecordIO, TFRecord and WebDataset (in shards of 12)."""

from __future__ import annotations

import pytest

import stoker


@pytest.fixture(scope="session")
def sets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("resume-sets")
    images = stoker.make_sample_data(
        root / "images", classes=3, per_class=16, size=48, seed=2, workers=1
    )
    out = {}
    for fmt in ("recordio", "tfrecord", "wds"):
        stoker.pack(
            images, root / fmt / "train", format=fmt, shard_size=12, workers=1, progress=False
        )
        out[fmt] = str(root / fmt / "train.stoker.json")
    return out
